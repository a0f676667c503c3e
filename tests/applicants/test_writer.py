"""The upsert (writer.py), rule by rule.

Expected values are built here by hand or with the Structs' own encoder, never read
back from the code under test: a stored row is compared with what CONTRACT.md says it
must be.
"""

from __future__ import annotations

import re
import sqlite3
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasestar.applicants.pipeline import (
    ImportRefused,
    write_records,
)
from leasestar.applicants.records import Applicant, applicant_encoder
from leasestar.applicants.writer import ApplicantWriter
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from tests.applicants.lines import (
    T0,
    T0_TEXT,
    T1,
    T1_TEXT,
    T2,
    T2_TEXT,
    data_version,
    exported,
    ndjson,
    rows,
    run_import,
    served,
    source,
    to_micros,
)
from tests.strategies import ids

# --- a line without service fields --------------------------------------------------


def test_new_record_without_service_fields_gets_a_fresh_id_and_the_import_time(
    db: sqlite3.Connection,
) -> None:
    report = run_import(db, ndjson(source(1), source(2)), seen_at=T1)
    assert (report.counts.inserted, report.counts.updated, report.counts.unchanged) == (2, 0, 0)
    stored = rows(db)
    for row in stored.values():
        assert re.fullmatch(r"app_[0-9a-f]{24}", row["id"])
        assert row["json"]["id"] == row["id"]
        for name in ("created_at", "updated_at", "last_seen"):
            assert row["json"][name] == T1_TEXT
            assert row[name] == T1
    assert stored["X0001"]["id"] != stored["X0002"]["id"]


def test_the_import_time_is_now_by_default(db: sqlite3.Connection) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    run_import(db, ndjson(source()))
    after = datetime.now(UTC)
    created = datetime.fromisoformat(rows(db)["X0001"]["json"]["created_at"])
    assert before <= created <= after


def test_seen_again_unchanged_moves_only_last_seen(db: sqlite3.Connection) -> None:
    run_import(db, ndjson(source()), seen_at=T0)
    first = rows(db)["X0001"]
    report = run_import(db, ndjson(source()), seen_at=T1)
    again = rows(db)["X0001"]
    assert report.counts.updated == 1
    assert again["id"] == first["id"]
    assert again["json"]["created_at"] == T0_TEXT
    assert again["json"]["updated_at"] == T0_TEXT  # nothing changed
    assert again["json"]["last_seen"] == T1_TEXT
    assert (again["created_at"], again["updated_at"], again["last_seen"]) == (T0, T0, T1)
    # The served JSON changed (last_seen), so the row and the data version moved.
    assert again["change_seq"] > first["change_seq"]


def test_seen_again_changed_moves_updated_at(db: sqlite3.Connection) -> None:
    run_import(db, ndjson(source()), seen_at=T0)
    first = rows(db)["X0001"]
    run_import(db, ndjson(source(first_name="Anne")), seen_at=T1)
    again = rows(db)["X0001"]
    assert again["id"] == first["id"]
    assert again["json"]["first_name"] == "Anne"
    assert (again["json"]["created_at"], again["json"]["updated_at"]) == (T0_TEXT, T1_TEXT)
    assert again["json"]["last_seen"] == T1_TEXT
    assert (again["created_at"], again["updated_at"], again["last_seen"]) == (T0, T1, T1)


@pytest.mark.parametrize(
    "change",
    [
        {"custom_data": {"score": 1}},
        {"pets": [{"name": "Rex"}]},
        {"middle_name": None, "first_name": None},
        {"x_unit_id_preferred": ["U1"]},
    ],
)
def test_any_field_changing_moves_updated_at(
    db: sqlite3.Connection, change: dict[str, Any]
) -> None:
    run_import(db, ndjson(source(custom_data={"score": 0})), seen_at=T0)
    run_import(db, ndjson(source(**{"custom_data": {"score": 0}, **change})), seen_at=T1)
    assert rows(db)["X0001"]["json"]["updated_at"] == T1_TEXT


# --- service fields given -------------------------------------------------------------


def test_seen_again_identically_is_not_written(db: sqlite3.Connection) -> None:
    run_import(db, ndjson(served(1), served(2)), seen_at=T1)
    before, version, export = rows(db), data_version(db), exported(db)
    report = run_import(db, export, seen_at=T2)
    assert (report.counts.inserted, report.counts.updated, report.counts.unchanged) == (0, 0, 2)
    assert data_version(db) == version
    assert rows(db) == before
    assert exported(db) == export


def test_service_fields_given_are_kept_as_given(db: sqlite3.Connection) -> None:
    run_import(db, ndjson(served(1, updated_at=T1_TEXT)), seen_at=T2)
    row = rows(db)["X0001"]
    assert row["id"] == f"app_{1:024x}"
    assert (row["json"]["created_at"], row["json"]["updated_at"]) == (T0_TEXT, T1_TEXT)
    assert row["json"]["last_seen"] == T0_TEXT  # given, so not the import time
    # Given again with other values, even earlier ones: kept as given.
    changed = served(1, first_name="Zoë", last_seen=T0_TEXT)
    changed["created_at"] = "2024-06-01T00:00:00.000Z"
    run_import(db, ndjson(changed), seen_at=T2)
    row = rows(db)["X0001"]
    assert row["id"] == f"app_{1:024x}"
    assert row["json"]["created_at"] == "2024-06-01T00:00:00.000Z"
    assert row["json"]["updated_at"] == T0_TEXT  # given; a field changed, still as given
    assert row["updated_at"] == T0


def test_a_stored_record_given_another_id_refuses_the_file(db: sqlite3.Connection) -> None:
    """An id never changes: a client, a cursor or the sync feed holding the old one
    would be left with an id that answers 404."""
    run_import(db, ndjson(served(1)), seen_at=T0)
    before, version = rows(db), data_version(db)
    with pytest.raises(ImportRefused) as refused:
        run_import(db, ndjson(served(2), served(1, id="app_renamed")), seen_at=T1)
    assert refused.value.report.errors == [
        f"line 2: id: this record (integration_id, x_property_id, x_id) is stored as "
        f"'app_{1:024x}', and an applicant's id never changes"
    ]
    assert rows(db) == before
    assert data_version(db) == version


def test_each_missing_service_field_is_filled_on_its_own(db: sqlite3.Connection) -> None:
    run_import(db, ndjson(served(1)), seen_at=T0)
    partial = source(1, first_name="Other", created_at="2020-01-01T00:00:00Z")
    run_import(db, ndjson(partial), seen_at=T2)
    row = rows(db)["X0001"]
    assert row["id"] == f"app_{1:024x}"  # kept: not given
    assert row["json"]["created_at"] == "2020-01-01T00:00:00.000Z"  # given
    assert row["json"]["updated_at"] == T2_TEXT  # changed, not given: the import time
    assert row["json"]["last_seen"] == T2_TEXT


def test_an_id_that_belongs_to_another_applicant_refuses_the_file(
    db: sqlite3.Connection,
) -> None:
    run_import(db, ndjson(served(1)), seen_at=T0)
    before, version = rows(db), data_version(db)
    with pytest.raises(ImportRefused) as refused:
        run_import(db, ndjson(served(5), served(2, id=f"app_{1:024x}")), seen_at=T1)
    assert refused.value.report.errors == [
        f"line 2: id: 'app_{1:024x}' already belongs to another applicant"
    ]
    assert rows(db) == before
    assert data_version(db) == version


def test_the_same_record_twice_in_one_file_ends_as_the_last(db: sqlite3.Connection) -> None:
    report = run_import(db, ndjson(source(), source(first_name="Bea")), seen_at=T0)
    assert (report.counts.inserted, report.counts.updated) == (1, 1)
    (row,) = rows(db).values()
    assert row["json"]["first_name"] == "Bea"


def test_the_upsert_key_is_integration_property_and_x_id(db: sqlite3.Connection) -> None:
    lines = ndjson(
        source(1),
        source(1, integration_id="int_2"),
        source(1, x_property_id="P-2"),
        source(2),
    )
    assert run_import(db, lines, seen_at=T0).counts.inserted == 4


def test_change_seq_and_data_version_move_with_every_row_written(db: sqlite3.Connection) -> None:
    start = data_version(db)
    run_import(db, ndjson(served(1), served(2)), seen_at=T0)
    assert data_version(db) == start + 2
    run_import(db, ndjson(served(1), served(2, first_name="B"), served(3)), seen_at=T1)
    stored = rows(db)
    assert data_version(db) == start + 4
    assert sorted(row["change_seq"] - start for row in stored.values()) == [1, 3, 4]
    assert stored["X0001"]["change_seq"] == start + 1  # unchanged: not written


def test_a_new_database_numbers_changes_from_its_creation_time(tmp_path: Path) -> None:
    before = int(time.time() * 1_000_000)
    connection = open_for_write(tmp_path / "new.db")
    try:
        start = data_version(connection)
    finally:
        connection.close()
    after = int(time.time() * 1_000_000)
    # julianday() is read to about a tenth of a millisecond.
    assert before - 1000 <= start <= after + 1000


def test_a_restored_database_numbers_its_writes_above_the_original(tmp_path: Path) -> None:
    """A sync client keeps the last sequence it saw; after a restore from an export, the
    new database's records must all come after it, or the client would skip them."""
    original = open_for_write(tmp_path / "original.db")
    try:
        run_import(original, ndjson(*(source(n) for n in range(1, 200))), seen_at=T0)
        run_import(original, ndjson(*(source(n, first_name="B") for n in range(1, 200))))
        client_kept = data_version(original)
        export = exported(original)
    finally:
        original.close()
    time.sleep(0.002)  # restored later, as a restore is
    restored = open_for_write(tmp_path / "restored.db")
    try:
        run_import(restored, export)
        assert min(row["change_seq"] for row in rows(restored).values()) > client_kept
        assert exported(restored) == export
    finally:
        restored.close()


# --- datetimes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("2025-03-01T10:00:00+05:30", "2025-03-01T04:30:00.000Z"),
        ("2025-03-01T10:00:00.123456789-08:00", "2025-03-01T18:00:00.123Z"),
        ("2025-03-01T10:00:00 05:00", "2025-03-01T05:00:00.000Z"),
        ("2025-03-01t23:30z", "2025-03-01T23:30:00.000Z"),
        ("2025-03-01T10:00", "2025-03-01T10:00:00.000Z"),
        ("2025-03-01", "2025-03-01T00:00:00.000Z"),
        ("2025-01-01T00:30:00+01:00", "2024-12-31T23:30:00.000Z"),
        ("2025-03-01T12:34:56.789Z", "2025-03-01T12:34:56.789Z"),
    ],
)
def test_input_datetimes_with_any_offset_are_stored_in_utc(
    db: sqlite3.Connection, given: str, stored: str
) -> None:
    pet = {"created_at": given, "updated_at": given, "last_seen": given}
    screening = {"created_at": given, "last_seen": given, "screening_date": given}
    record = served(1, created_at=given, updated_at=given, last_seen=given)
    record.update(pets=[pet], screenings=[screening])
    run_import(db, ndjson(record), seen_at=T0)
    row = rows(db)["X0001"]
    for name in ("created_at", "updated_at", "last_seen"):
        assert row["json"][name] == stored
        assert row[name] == to_micros(stored)
    assert {row["json"]["pets"][0][name] for name in pet} == {stored}
    assert {row["json"]["screenings"][0][name] for name in screening} == {stored}


# --- what is stored is the canonical encoding ------------------------------------------


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    record_id=st.none() | ids,
    first_name=st.none() | st.text(max_size=12),
    given=st.sampled_from(["none", "some", "all"]),
)
def test_stored_body_is_the_struct_encoding_with_service_fields_filled(
    tmp_path: Path, record_id: str | None, first_name: str | None, given: str
) -> None:
    fields: dict[str, Any] = source(first_name=first_name)
    if given == "all":
        fields.update(id=record_id or "app_given", created_at=T0_TEXT)
        fields.update(updated_at=T0_TEXT, last_seen=T0_TEXT)
    elif given == "some":
        fields.update(id=record_id, updated_at=T0_TEXT)
    # A file of its own per example: Hypothesis may run the same example twice, and a
    # second import of a record without an id would add a second row to a shared file.
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "leasestar.db"
    connection = open_for_write(path)
    try:
        run_import(connection, ndjson(fields), seen_at=T1)
        (row,) = rows(connection).values()
        record = msgspec.convert(fields, Applicant)
        expected = msgspec.structs.replace(
            record,
            id=row["id"],
            created_at=record.created_at or T1_TEXT,
            updated_at=record.updated_at or T1_TEXT,
            last_seen=record.last_seen or T1_TEXT,
        )
        assert row["body"] == applicant_encoder.encode(expected).decode()
        assert connection.execute("SELECT typeof(body) FROM applicants").fetchone() == ("blob",)
    finally:
        connection.close()


def test_a_record_stored_by_this_write_is_found_again_whatever_its_hash(
    db: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The written-keys filter of an empty table: a hash collision only costs a lookup."""
    monkeypatch.setattr("leasestar.applicants.writer.WRITTEN_SLOTS", 1)  # every key collides
    report = run_import(db, ndjson(source(1), source(2), source(1, first_name="B")), seen_at=T0)
    assert (report.counts.inserted, report.counts.updated) == (2, 1)
    assert rows(db)["X0001"]["json"]["first_name"] == "B"


# --- bulk writes ----------------------------------------------------------------------


def schema_of(db: sqlite3.Connection) -> list[tuple[str, str]]:
    return db.execute("SELECT name, sql FROM sqlite_schema ORDER BY name").fetchall()


def test_a_bulk_write_stores_the_same_and_rebuilds_every_index(tmp_path: Path) -> None:
    records = [applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(120, seed=5)]
    results = []
    for bulk_min_rows in (10**9, 10):
        connection = open_for_write(tmp_path / f"bulk-{bulk_min_rows}.db")
        try:
            schema = schema_of(connection)
            start = data_version(connection)
            writer_report = run_import(connection, b"".join(records), bulk_min_rows=bulk_min_rows)
            assert writer_report.counts.inserted == 120
            assert schema_of(connection) == schema
            assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            results.append((exported(connection), data_version(connection) - start))
        finally:
            connection.close()
    assert results[0] == results[1]
    assert results[0][0] == b"".join(sorted(records))


def test_a_refused_bulk_write_leaves_schema_and_rows_as_they_were(
    db: sqlite3.Connection,
) -> None:
    write_records(db, synthetic_applicants(30, seed=2))
    schema, export, version = schema_of(db), exported(db), data_version(db)
    lines = [applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(80, seed=6)]
    lines.append(b'{"x_id": 1}\n')
    with pytest.raises(ImportRefused):
        run_import(db, b"".join(lines), bulk_min_rows=10)
    assert (schema_of(db), exported(db), data_version(db)) == (schema, export, version)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_the_writer_enters_bulk_mode_only_for_large_writes(db: sqlite3.Connection) -> None:
    write_records(db, synthetic_applicants(40, seed=2))
    with ApplicantWriter(db, bulk_min_rows=5) as writer:
        # 40 rows stored: bulk from max(5, 40 // 4) = 10 rows written.
        for number, record in enumerate(synthetic_applicants(12, seed=9), 1):
            writer.upsert(record)
            assert writer.bulk == (number >= 10)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_the_page_cache_setting_is_restored_after_a_write(db: sqlite3.Connection) -> None:
    before = db.execute("PRAGMA cache_size").fetchone()
    write_records(db, synthetic_applicants(3, seed=2))
    with pytest.raises(ImportRefused):
        run_import(db, b"{}\n")
    assert db.execute("PRAGMA cache_size").fetchone() == before


# --- where a write into an empty database journals --------------------------------------


class JournalSeen:
    """Records, at each phase of a write, the journal mode and which journal files exist."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self._path = path
        self.seen: list[tuple[str, bool, bool]] = []

    def advance(self, done: int, position: int = 0) -> None:
        pass

    def phase(self, label: str) -> None:
        (mode,) = self._db.execute("PRAGMA journal_mode").fetchone()
        wal = Path(f"{self._path}-wal")
        wal_written = wal.exists() and wal.stat().st_size > 0
        self.seen.append((mode, Path(f"{self._path}-journal").exists(), wal_written))


def sixty_lines() -> bytes:
    return b"".join(applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(60, seed=3))


def test_a_write_into_an_empty_database_nobody_reads_goes_past_the_wal(
    db_path: Path, db: sqlite3.Connection
) -> None:
    """Through a rollback journal while it runs (the WAL stays empty), back in WAL after."""
    lines = sixty_lines()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    seen = JournalSeen(db, db_path)
    report = run_import(db, lines, bulk_min_rows=10, progress=seen)
    assert report.counts.inserted == 60
    assert seen.seen
    assert all(entry == ("delete", True, False) for entry in seen.seen), seen.seen
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert not Path(f"{db_path}-journal").exists()
    other = sqlite3.connect(db_path)
    try:  # what another connection finds: WAL, and the rows
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert other.execute("SELECT count(*) FROM applicants").fetchone() == (60,)
    finally:
        other.close()


def test_a_write_into_an_empty_database_someone_reads_stays_in_the_wal(
    db_path: Path, db: sqlite3.Connection
) -> None:
    reader = sqlite3.connect(db_path)
    try:
        assert reader.execute("SELECT count(*) FROM applicants").fetchone() == (0,)
        lines = sixty_lines()
        seen = JournalSeen(db, db_path)
        report = run_import(db, lines, bulk_min_rows=10, progress=seen)
        assert report.counts.inserted == 60
        assert seen.seen
        assert all(mode == "wal" and not rollback for mode, rollback, _ in seen.seen)
        assert reader.execute("SELECT count(*) FROM applicants").fetchone() == (60,)
    finally:
        reader.close()


def test_a_write_into_a_stored_database_stays_in_the_wal(
    db_path: Path, db: sqlite3.Connection
) -> None:
    write_records(db, synthetic_applicants(5, seed=2))
    lines = sixty_lines()
    seen = JournalSeen(db, db_path)
    run_import(db, lines, bulk_min_rows=10, progress=seen)
    assert seen.seen
    assert all(mode == "wal" for mode, _, _ in seen.seen)


def test_a_refused_write_into_an_empty_database_leaves_it_empty_and_in_wal(
    db: sqlite3.Connection,
) -> None:
    schema = schema_of(db)
    lines = [applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(80, seed=6)]
    lines.append(b'{"x_id": 1}\n')
    with pytest.raises(ImportRefused):
        run_import(db, b"".join(lines), bulk_min_rows=10)
    assert schema_of(db) == schema
    assert db.execute("SELECT count(*) FROM applicants").fetchone() == (0,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
