"""leasestar/applicants/copy_file.py: the columnar copy's file beside the database.

Every copy is compared with what SQLite holds, read here column by column and sorted
here (NULL first, then code point order, the rowid breaking ties): built afresh, mapped
by another process, mapped and then brought through imports that add and move records;
and a file that is damaged, cut short, unfinished, of another database or of another
history is built again with one line, never used.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasestar.applicants import columnar_copy, copy_file, copy_reading
from leasestar.applicants.copy_columns import CODED_COLUMNS, COLUMN_TYPES, COLUMNS, GROUPINGS
from leasestar.applicants.match_counter import MatchCounter
from leasestar.applicants.pipeline import write_records
from leasestar.applicants.query import ApplicantQuery
from leasestar.applicants.records import Applicant
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from tests.applicants.test_match_counter import expected_count, moved, values_in
from tests.servers import ROOT

LOGGER = "leasestar.columnar_copy"


def opened(path: Path) -> MatchCounter:
    counter = MatchCounter(path)
    asyncio.run(counter.catch_up())
    return counter


def seeded(path: Path, count: int, seed: int) -> list[Any]:
    records = list(synthetic_applicants(count, seed=seed))
    connection = open_for_write(path)
    try:
        write_records(connection, records)
    finally:
        connection.close()
    return records


def sort_key(value: Any, rowid: int) -> tuple[bool, Any, int]:
    """SQLite's order of a column's values: NULL first, then by value (text by code
    point, as BINARY compares UTF-8), the rowid breaking ties."""
    return (value is not None, value if value is not None else "", rowid)


def assert_copy_is_the_database(counter: MatchCounter, path: Path) -> None:
    """Every row's every copied column, and every column's order, as SQLite holds them."""
    with sqlite3.connect(path) as connection:
        (version,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
        rows = connection.execute(f"SELECT rowid, {', '.join(COLUMNS)} FROM applicants").fetchall()
    assert counter.version == version
    assert counter.rows == len(rows)
    assert np.flatnonzero(counter._present).tolist() == sorted(row[0] for row in rows)
    for number, column in enumerate(COLUMNS, 1):
        values = counter._columns[column]
        if column in CODED_COLUMNS:
            table = {code: value for value, code in counter._codes[column]._codes.items()}
            held = {row[0]: table[int(values[row[0]])] for row in rows}
        else:
            held = {row[0]: int(values[row[0]]) for row in rows}
        assert held == {row[0]: row[number] for row in rows}, column
        rowids, _ = counter._in_order(column, counter._order_of(column))
        in_order = sorted(rows, key=lambda row, n=number: sort_key(row[n], row[0]))  # type: ignore[misc]
        assert rowids.tolist() == [row[0] for row in in_order], column
    for group, instant in GROUPINGS:
        codes = counter._codes[group]._codes
        by_code: dict[int, list[int]] = {}
        for row in rows:
            by_code.setdefault(codes[row[COLUMNS.index(group) + 1]], []).append(
                row[COLUMNS.index(instant) + 1]
            )
        starts, instants, rowids = counter._by_group(group, instant)
        if instants is None:  # the file's grouping: its instants through its rowids
            instants = counter._columns[instant].take(rowids)
        assert int(starts[-1]) == len(rows)
        for code in range(len(starts) - 1):
            held = instants[starts[code] : starts[code + 1]].tolist()
            assert held == sorted(by_code.get(code, [])), (group, instant, code)


def flip_in_section(path: Path, name: str, at: int = 1) -> None:
    """A bit of the copy's file of `path` flipped, in its section `name`, `at` bytes in."""
    mapped = copy_file.load(path, COLUMN_TYPES, GROUPINGS)
    (section,) = [s for s in mapped.description.sections if s.name == name]
    del mapped
    with copy_file.path_of(path).open("r+b") as file:
        file.seek(section.offset + at)
        byte = file.read(1)
        file.seek(section.offset + at)
        file.write(bytes([byte[0] ^ 0x40]))


def lines_of(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_a_copy_is_built_once_and_then_mapped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database without the file (one written by an earlier version) gets it on the
    first open, with one line; the next open maps it: its columns and orders lie in the
    file's pages (not arrays of the process's own), and no line."""
    path = tmp_path / "served.db"
    seeded(path, 150, seed=3)
    caplog.set_level(logging.INFO, LOGGER)
    first = opened(path)
    assert len(lines_of(caplog, logging.INFO)) == 1
    assert copy_file.path_of(path).exists()
    assert_copy_is_the_database(first, path)
    caplog.clear()
    second = opened(path)
    assert [r for r in caplog.records if r.name == LOGGER] == []
    shared = (*second._columns.values(), *second._orders["city"])
    for array in (second._present, *shared, *second._groupings["property_id/updated_at"]):
        assert not array.flags.owndata
    assert_copy_is_the_database(second, path)


def test_another_process_maps_the_file_one_process_built(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Built by another process (as a worker of the same server would): mapped here as
    it is, nothing read again but the change written since."""
    path = tmp_path / "served.db"
    records = seeded(path, 120, seed=4)
    script = (
        "import asyncio, sys; from pathlib import Path; "
        "from leasestar.applicants.match_counter import MatchCounter; "
        "asyncio.run(MatchCounter(Path(sys.argv[1])).catch_up())"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, check=True, timeout=120)
    built = copy_file.path_of(path).stat()
    connection = open_for_write(path)
    try:
        write_records(connection, [*records[:5], *synthetic_applicants(10, seed=40)])
    finally:
        connection.close()
    caplog.set_level(logging.INFO, LOGGER)
    counter = opened(path)
    assert [r for r in caplog.records if r.name == LOGGER] == []
    assert copy_file.path_of(path).stat().st_ino == built.st_ino  # not written again
    assert_copy_is_the_database(counter, path)


def renamed(record: Applicant, draw: st.DrawFn) -> Applicant:
    """The record perhaps with a last name and city no row held when the file was
    written (codes numbered after the file's), or none."""
    if draw(st.booleans()):
        names = st.sampled_from([None, "", "Aaron", "Zoë", "Ωmega", "aaron"])
        return msgspec.structs.replace(record, last_name=draw(names), city=draw(names))
    return record


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_mapped_copy_followed_through_imports_is_a_copy_built_afresh(
    data: st.DataObject,
) -> None:
    """Imports that add records, move others between instants, vendors and properties,
    and write some unchanged: a copy mapped before them and brought through them (one
    that followed each, and one opened after all from the file), and one built afresh
    without the file, all hold what the database holds."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "followed.db"
        records = seeded(path, 80, seed=5)
        opened(path)  # the file, at the seed's version
        following = opened(path)
        fresh = list(synthetic_applicants(40, seed=6))
        connection = open_for_write(path)
        try:
            for _ in range(data.draw(st.integers(1, 3), label="imports")):
                values = values_in(connection)
                chosen = data.draw(st.lists(st.sampled_from(records), max_size=20))
                batch = [renamed(moved(record, data.draw, values), data.draw) for record in chosen]
                new = data.draw(st.integers(0, len(fresh)), label="new")
                batch, fresh = batch + fresh[:new], fresh[new:]
                write_records(connection, batch)
                asyncio.run(following.catch_up())
                # Looked at after some imports only: its orders then have the rows of
                # several imports to move at once.
                if data.draw(st.booleans(), label="looked at"):
                    assert_copy_is_the_database(following, path)
        finally:
            connection.close()
        assert_copy_is_the_database(following, path)
        assert_copy_is_the_database(opened(path), path)
        copy_file.path_of(path).unlink()
        assert_copy_is_the_database(opened(path), path)


def cut_short(columns: Path) -> None:
    with columns.open("r+b") as file:
        file.truncate(columns.stat().st_size // 2)


def flip_a_byte(columns: Path) -> None:
    """A byte inside the first section (the presence flags), past the header."""
    with columns.open("r+b") as file:
        file.seek(copy_file._ALIGN + 7)
        byte = file.read(1)
        file.seek(copy_file._ALIGN + 7)
        file.write(bytes([byte[0] ^ 0xFF]))


def unfinished(columns: Path) -> None:
    """As a writer killed before its last step leaves it: no magic."""
    with columns.open("r+b") as file:
        file.write(bytes(len(copy_file.MAGIC)))


def other_format(columns: Path) -> None:
    with columns.open("r+b") as file:
        file.seek(len(copy_file.MAGIC))
        file.write((copy_file.FORMAT_VERSION + 1).to_bytes(4, "little"))


def garbage(columns: Path) -> None:
    columns.write_bytes(b"\x00garbage" * 1000)


def empty(columns: Path) -> None:
    columns.write_bytes(b"")


DAMAGES = {
    "cut short": (cut_short, "cut short"),
    "a byte flipped": (flip_a_byte, "section present is damaged"),
    "unfinished": (unfinished, "not a finished copy"),
    "another format": (other_format, "format"),
    "garbage": (garbage, "not a finished copy"),
    "empty": (empty, "shorter than its header"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_file_is_built_again_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    path = tmp_path / "served.db"
    seeded(path, 100, seed=8)
    opened(path)
    spoil, reason = DAMAGES[damage]
    spoil(copy_file.path_of(path))
    caplog.clear()  # (the build's line, when another test left INFO on)
    caplog.set_level(logging.INFO, LOGGER)
    counter = opened(path)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1, lines
    assert reason in lines[0]
    assert_copy_is_the_database(counter, path)
    copy_file.load(path, COLUMN_TYPES, GROUPINGS)


def test_the_file_of_another_database_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another database's file moved beside this one (a copy of files gone wrong)."""
    path, other = tmp_path / "served.db", tmp_path / "other.db"
    seeded(path, 60, seed=9)
    seeded(other, 90, seed=10)
    opened(other)
    shutil.copyfile(copy_file.path_of(other), copy_file.path_of(path))
    caplog.set_level(logging.INFO, LOGGER)
    counter = opened(path)
    (line,) = lines_of(caplog, logging.WARNING)
    assert "another database" in line
    assert_copy_is_the_database(counter, path)


def test_a_replaced_database_is_copied_again(tmp_path: Path) -> None:
    """A replica's first copy: another file renamed over the path, beside the old one's
    copy. A copy open when it happens, and one opened after, both hold the new file."""
    path, other = tmp_path / "served.db", tmp_path / "other.db"
    seeded(path, 50, seed=11)
    seeded(other, 70, seed=12)
    serving = opened(path)
    other.replace(path)
    asyncio.run(serving.catch_up())
    assert_copy_is_the_database(serving, path)
    assert_copy_is_the_database(opened(path), path)


def test_a_database_restored_and_written_since_is_copied_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A backup restored in place (the same file, the same database's key) and written
    since, past the version the file holds: the rows up to that version are not the
    ones copied, so the file is not used."""
    path, backup = tmp_path / "served.db", tmp_path / "backup.db"
    records = seeded(path, 60, seed=13)
    with sqlite3.connect(path) as source, sqlite3.connect(backup) as target:
        source.backup(target)
    connection = open_for_write(path)
    try:
        write_records(connection, list(synthetic_applicants(30, seed=14)))
    finally:
        connection.close()
    opened(path)  # the file, at the version after those 30
    with sqlite3.connect(backup) as source, sqlite3.connect(path) as target:
        source.backup(target)  # in place: the same inode
    connection = open_for_write(path)
    try:
        for _ in range(3):  # past the file's version, other records
            write_records(connection, list(synthetic_applicants(15, seed=15)) + records[:5])
            write_records(connection, [*records[:20]])
    finally:
        connection.close()
    caplog.set_level(logging.INFO, LOGGER)
    counter = opened(path)
    (line,) = lines_of(caplog, logging.WARNING)
    assert "history" in line or "after the database" in line
    assert_copy_is_the_database(counter, path)


def test_a_file_far_behind_is_written_again_and_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the rows written over a mapped copy are a share of all, the file is written
    again at the database's version and mapped in its place: the worker's pages and
    orders are the file's again."""
    monkeypatch.setattr(columnar_copy, "_REWRITE_LEAST", 1)  # any change is many
    monkeypatch.setattr(columnar_copy, "_REWRITE_SHARE", 1_000_000)
    path = tmp_path / "served.db"
    records = seeded(path, 100, seed=16)

    async def follow() -> MatchCounter:
        counter = MatchCounter(path)
        await counter.catch_up()
        connection = open_for_write(path)
        try:
            changed = [msgspec.structs.replace(r, last_name="Moved") for r in records[:20]]
            write_records(connection, [*changed, *synthetic_applicants(5, seed=17)])
        finally:
            connection.close()
        await counter.catch_up()
        assert counter._written_since_file  # written over: the file's orders need moves
        assert counter._rewriting is not None
        await counter._rewriting
        return counter

    counter = asyncio.run(follow())
    mapped = copy_file.load(path, COLUMN_TYPES, GROUPINGS)
    assert counter._columns_file == mapped.file
    assert counter._orders
    assert counter._written_since_file == []  # the new file holds every row where it sorts
    assert_copy_is_the_database(counter, path)
    assert_copy_is_the_database(opened(path), path)


def test_a_copy_that_cannot_be_written_is_kept_in_memory_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (or a directory the server may not write): each process keeps the
    copy it built, as before there was a file, and says so once."""

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    path = tmp_path / "served.db"
    seeded(path, 70, seed=18)
    monkeypatch.setattr(copy_file, "write", full)
    caplog.set_level(logging.WARNING, LOGGER)
    counter = opened(path)
    (line,) = lines_of(caplog, logging.WARNING)
    assert "cannot write" in line
    assert "kept in memory" in line
    assert not copy_file.path_of(path).exists()
    assert counter._columns_file is None
    assert_copy_is_the_database(counter, path)


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("keys/last_name", "its order of last_name is damaged"),
        ("grouping/property_id/last_seen", "its grouping property_id/last_seen is damaged"),
    ],
)
def test_a_damaged_order_is_sorted_here_instead_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, section: str, said: str
) -> None:
    """The orders' and groupings' CRCs are checked when one is first used, not at the
    start (most of the file): a damaged one is not used, and it is sorted in the
    process."""
    path = tmp_path / "served.db"
    seeded(path, 90, seed=19)
    opened(path)
    flip_in_section(path, section)
    caplog.clear()
    caplog.set_level(logging.INFO, LOGGER)
    counter = opened(path)
    assert [r for r in caplog.records if r.name == LOGGER] == []
    assert_copy_is_the_database(counter, path)  # every order and grouping used
    (line,) = lines_of(caplog, logging.WARNING)
    assert said in line


def test_a_copy_built_in_chunks_holds_every_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole build reads the instants `_CHUNK_ROWS` rows at a time, and the rowids of a
    value more rows than that hold (middle_name's NULL among them) as many at a time:
    chunks of 7 over 150 rows (no multiple of 7) leave no row out and read none twice."""
    monkeypatch.setattr(copy_reading, "_CHUNK_ROWS", 7)
    path = tmp_path / "chunked.db"
    seeded(path, 150, seed=8)
    assert_copy_is_the_database(opened(path), path)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(-3, 40), st.integers(1, 5)), max_size=60),
    st.sampled_from([np.int32, np.int64]),
)
def test_rows_in_key_order_are_sorted_by_key_then_rowid(
    rows: list[tuple[int, int]], dtype: type
) -> None:
    """Codes sorted with their rowids as one integer, or instants by argsort: either way
    each row's rowid in (key, rowid) order and the keys beside them, as Python sorts them
    (negative codes, which no build writes, take the argsort)."""
    keys = np.array([key for key, _ in rows], dtype)
    rowids = np.cumsum([gap for _, gap in rows], dtype=np.int64).astype(np.int32)
    expected = sorted(zip(keys.tolist(), rowids.tolist(), strict=True))
    held = dict(copy_file._in_key_order(keys.copy(), rowids))
    assert held["order"].tolist() == [rowid for _, rowid in expected]
    assert held["keys"].tolist() == [key for key, _ in expected]
    assert held["order"].dtype == rowids.dtype
    assert held["keys"].dtype == keys.dtype


def two_filters(path: Path) -> ApplicantQuery:
    """A query the copy counts by a pass over two columns (integration_vendor's among
    them): no grouping serves two equalities."""
    with sqlite3.connect(path) as connection:
        vendor, prop = connection.execute(
            "SELECT integration_vendor, property_id FROM applicants LIMIT 1"
        ).fetchone()
    return ApplicantQuery(filters=(("integration_vendor", vendor), ("property_id", prop)))


def test_a_damaged_column_is_found_when_first_read_and_the_copy_built_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A start checks the CRC of no column (0.87 GB at ten million rows): a damaged one is
    found when first read, the copy is then not ready, and the next catch-up builds it
    again from the database, with one line."""
    path = tmp_path / "served.db"
    seeded(path, 90, seed=21)
    opened(path)
    flip_in_section(path, "integration_vendor")
    caplog.clear()
    caplog.set_level(logging.INFO, LOGGER)
    counter = opened(path)
    assert counter.ready
    assert lines_of(caplog, logging.WARNING) == []
    with pytest.raises(columnar_copy.DamagedColumn):
        counter.count(two_filters(path), None)
    assert not counter.ready
    asyncio.run(counter.catch_up())
    (line,) = lines_of(caplog, logging.WARNING)
    assert "its column integration_vendor is damaged" in line
    assert_copy_is_the_database(counter, path)
    copy_file.checked(copy_file.load(path, COLUMN_TYPES, GROUPINGS))


def test_a_damaged_column_found_as_a_write_is_copied_is_built_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The rows written since are copied over the columns only once each is checked (off
    the event loop): a damaged one ends that catch-up, and the next builds the copy again."""
    path = tmp_path / "served.db"
    seeded(path, 90, seed=22)
    opened(path)
    flip_in_section(path, "last_seen")
    counter = opened(path)
    caplog.clear()
    caplog.set_level(logging.INFO, LOGGER)
    seeded(path, 30, seed=23)  # other records: new rows
    with pytest.raises(columnar_copy.DamagedColumn):
        asyncio.run(counter.catch_up())
    asyncio.run(counter.catch_up())
    (line,) = lines_of(caplog, logging.WARNING)
    assert "its column last_seen is damaged" in line
    assert_copy_is_the_database(counter, path)


def test_a_file_copied_from_is_checked_whole(tmp_path: Path) -> None:
    """Written again from the file and the rows since, a damaged column is not carried
    into the new file (with a CRC of its own): the file is built from the database."""
    path = tmp_path / "served.db"
    seeded(path, 90, seed=24)
    opened(path)
    flip_in_section(path, "created_at", at=8 * 3 + 5)  # rowid 3's instant
    seeded(path, 10, seed=25)
    assert columnar_copy.ColumnarCopy(path).write_file(only_if_due=False)
    assert_copy_is_the_database(opened(path), path)
    copy_file.checked(copy_file.load(path, COLUMN_TYPES, GROUPINGS))


def held_on_threads(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, *, returning: bool = False
) -> tuple[threading.Event, threading.Event]:
    """`owner.name` made to wait, when called off the main thread, until the second event
    is set (the first is set once it waits), before it runs or, `returning`, once it has:
    a test then acts on the loop meanwhile."""
    waiting, go = threading.Event(), threading.Event()
    real = getattr(owner, name)

    def held(*args: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            return real(*args)
        result = real(*args) if returning else None
        waiting.set()
        assert go.wait(WAIT_SECONDS)
        return result if returning else real(*args)

    monkeypatch.setattr(owner, name, held)
    return waiting, go


WAIT_SECONDS = 30


def test_columns_checked_on_the_loop_while_a_write_is_checked_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written since the file: the columns are checked on a thread first, while a
    request on the loop may check some of them itself; neither fails for the other's
    check (a KeyError here was a 500 for every request sharing the catch-up)."""
    path = tmp_path / "served.db"
    seeded(path, 90, seed=30)
    opened(path)
    counter = opened(path)
    query = two_filters(path)
    with sqlite3.connect(path) as connection:
        at_the_files_version = expected_count(connection, query, None)
    seeded(path, 10, seed=31)
    waiting, go = held_on_threads(monkeypatch, copy_file, "failing_columns")

    async def counted_meanwhile() -> int:
        catching_up = asyncio.ensure_future(counter.catch_up())
        assert await asyncio.to_thread(waiting.wait, WAIT_SECONDS)
        counted = counter.count(query, None)  # its two columns checked here, on the loop
        go.set()
        await catching_up
        return counted

    assert asyncio.run(counted_meanwhile()) == at_the_files_version
    assert counter.ready
    assert counter._unchecked_columns == {}
    with sqlite3.connect(path) as connection:
        assert counter.count(query, None) == expected_count(connection, query, None)
    assert_copy_is_the_database(counter, path)


def test_a_catch_up_under_way_when_a_column_is_found_damaged_ends_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request finds a column damaged while a catch-up reads the changes on a thread:
    that catch-up ends with the damage rather than make the copy of that file ready
    again, and the next one builds the copy from the database."""
    path = tmp_path / "served.db"
    seeded(path, 90, seed=32)
    opened(path)
    flip_in_section(path, "integration_vendor")
    counter = opened(path)
    # Nothing written: the changes read (none) before the damage is found.
    waiting, go = held_on_threads(monkeypatch, counter, "_read_changes", returning=True)

    async def damage_found_meanwhile() -> None:
        catching_up = asyncio.ensure_future(counter.catch_up())
        assert await asyncio.to_thread(waiting.wait, WAIT_SECONDS)
        with pytest.raises(columnar_copy.DamagedColumn):
            counter.count(two_filters(path), None)
        go.set()
        with pytest.raises(columnar_copy.DamagedColumn):
            await catching_up

    asyncio.run(damage_found_meanwhile())
    assert not counter.ready
    asyncio.run(counter.catch_up())
    assert counter.ready
    assert_copy_is_the_database(counter, path)
    copy_file.checked(copy_file.load(path, COLUMN_TYPES, GROUPINGS))


def test_each_file_written_has_an_identity_of_its_own(tmp_path: Path) -> None:
    """Files written in turn under a temporary name and renamed over the path: the inode
    of the one removed may be the next one's (ext4, every other rewrite), so a file found
    damaged or refused is named by its change time too, and a good one after it is
    mapped."""
    path = tmp_path / "served.db"
    seeded(path, 40, seed=33)
    identities = []
    for _ in range(4):
        assert columnar_copy.ColumnarCopy(path).write_file(only_if_due=False)
        identities.append(copy_file.identity_of_file(path))
        time.sleep(0.02)  # past the filesystem clock's tick: each file its own change time
    assert None not in identities
    assert len(set(identities)) == len(identities), identities
    assert copy_file.load(path, COLUMN_TYPES, GROUPINGS).file == identities[-1]
