"""`leasestar import`, `export` and `seed` from the command line, hostile input included.

Every refused file must give one clear `line N: field: reason` line per bad line (the
first few, then a count), a non-zero exit, no trace, and leave the database exactly as
it was: same rows, same bytes, same data version.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from leasestar import commands
from leasestar.applicants import columnar_copy, copy_file, pipeline
from leasestar.applicants.copy_columns import COLUMN_TYPES, GROUPINGS
from leasestar.applicants.match_counter import MatchCounter
from leasestar.applicants.records import applicant_encoder
from leasestar.cli import main
from leasestar.seed.generator import synthetic_applicants
from tests.applicants.test_copy_file import assert_copy_is_the_database
from tests.json_body import register_json_body
from tests.strategies import MINIMAL

LEASESTAR = Path(sys.executable).with_name("leasestar")


def line(**fields: Any) -> bytes:
    return json.dumps({**MINIMAL, **fields}).encode() + b"\n"


def snapshot(path: Path) -> tuple[Any, ...]:
    """Everything an import could change: rows with their bytes, the data version, schema."""
    connection = sqlite3.connect(path)
    try:
        return (
            connection.execute("SELECT * FROM applicants ORDER BY id").fetchall(),
            connection.execute("SELECT change_seq FROM sync_state").fetchall(),
            connection.execute("SELECT name, sql FROM sqlite_schema ORDER BY name").fetchall(),
        )
    finally:
        connection.close()


def content(path: Path) -> tuple[Any, ...]:
    """What two databases holding the same data share: `snapshot`, but with change
    sequences counted from each database's first (a database numbers its changes from
    its creation time)."""
    rows, (high_water,), schema = snapshot(path)
    connection = sqlite3.connect(path)
    try:
        columns = [name for _, name, *_ in connection.execute("PRAGMA table_info(applicants)")]
    finally:
        connection.close()
    at = columns.index("change_seq")
    first = min(row[at] for row in rows)
    relative = [(*row[:at], row[at] - first, *row[at + 1 :]) for row in rows]
    return relative, high_water[0] - first, schema


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    path = tmp_path / "cli.db"
    assert main(["seed", "--db", str(path), "--count", "20", "--seed", "3"]) == 0
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- import ---------------------------------------------------------------------------


def test_import_upserts_and_says_what_it_did(
    seeded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.ndjson"
    source.write_bytes(line() + line(x_id="X2") + b"\n" + line(x_id="X2", first_name="B"))
    code, out, err = run(capsys, "import", "--db", str(seeded), str(source))
    assert (code, err) == (0, "")
    assert out == "imported 3 applicants: 2 new, 1 updated, 0 unchanged\n"
    assert len(snapshot(seeded)[0]) == 22


def test_import_reads_stdin_for_a_dash(
    seeded: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(line() + line(x_id="X2")))
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, _ = run(capsys, "import", "--db", str(seeded), "-")
    assert code == 0
    assert out.startswith("imported 2 applicants: 2 new")


def test_import_of_a_missing_file_is_one_line(
    seeded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "import", "--db", str(seeded), str(tmp_path / "nope.ndjson"))
    assert code == 1
    assert err == f"leasestar: cannot read {tmp_path / 'nope.ndjson'}: No such file or directory\n"


# --- hostile input --------------------------------------------------------------------

DEEP = b"[" * 10_000 + b"]" * 10_000
GOOD = json.dumps({**MINIMAL, "x_id": "OK"}).encode() + b"\n"
INSTANT_RULE = (
    "must be an ISO 8601 instant: YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fraction]], "
    "with Z, ±HH:MM or no offset (UTC)"
)

ID_RULE = "must be 1-128 characters of A-Z a-z 0-9 . _ ~ : - (and not . or ..)"


def with_raw(raw: bytes) -> bytes:
    """The minimal line with raw JSON text added before its closing brace."""
    return line()[:-2] + raw + b"}\n"


# Each file starts with a good line, so that "nothing written" means something; the
# expected errors are exactly what stderr must say before "import refused".
HOSTILE: dict[str, tuple[bytes, list[str]]] = {
    "invalid UTF-8": (
        GOOD + b'{"x_id": "X\xff\xfe", "x_property_id": "P"}\n',
        ["line 2: (line): invalid UTF-8 at byte 11"],
    ),
    "JSON nested 10,000 deep in custom_data": (
        GOOD + with_raw(b', "custom_data": {"a": ' + DEEP + b"}"),
        ["line 2: (line): JSON is nested too deeply"],
    ),
    "JSON nested 10,000 deep": (GOOD + DEEP + b"\n", ["line 2: (line): JSON is nested too deeply"]),
    "custom_data nested deeper than stored data may be": (
        GOOD + line(custom_data={"a": json.loads("[" * 40 + "]" * 40)}),
        ["line 2: custom_data: is nested deeper than 32 levels"],
    ),
    "an integer beyond 64 bits in custom_data": (
        GOOD + line(custom_data={"n": 2**64}),
        ["line 2: custom_data: holds an integer beyond 64 bits"],
    ),
    "an integer beyond 64 bits in an application's custom_data": (
        GOOD + line(applications=[{"applicant_id": "X1", "custom_data": {"n": [-(2**63) - 1]}}]),
        ["line 2: applications[0].custom_data: holds an integer beyond 64 bits"],
    ),
    "an integer beyond 64 bits in a typed field": (
        GOOD + line(self_reported_income=[{"amount_in_cents": 2**63}]),
        ["line 2: self_reported_income[0].amount_in_cents: expected `int` <= 9223372036854775807"],
    ),
    # Longer than int() converts (4,300 digits): found by review, it ended in a traceback.
    "an integer of 10,000 digits in a typed field": (
        GOOD + with_raw(b', "self_reported_income": [{"amount_in_cents": ' + b"9" * 10_000 + b"}]"),
        ["line 2: self_reported_income[0].amount_in_cents: expected `int` <= 9223372036854775807"],
    ),
    "a negative integer of 10,000 digits in custom_data": (
        GOOD + with_raw(b', "custom_data": {"n": -' + b"9" * 10_000 + b"}"),
        ["line 2: custom_data: holds an integer beyond 64 bits"],
    ),
    "a number beyond a double": (
        GOOD + with_raw(b', "custom_data": {"a": 1e400}'),
        ["line 2: custom_data[...]: number out of range"],
    ),
    "NaN": (
        GOOD + with_raw(b', "custom_data": {"a": NaN}'),
        ["line 2: (line): NaN is not valid JSON"],
    ),
    "a duplicate key": (
        GOOD + with_raw(b', "first_name": "A", "first_name": "B"'),
        ["line 2: first_name: key appears more than once in one object"],
    ),
    "a duplicate key in custom_data": (
        GOOD + with_raw(b', "custom_data": {"k": 1, "k": 2}'),
        ["line 2: k: key appears more than once in one object"],
    ),
    "a wrong type": (
        GOOD + line(first_name=5),
        ["line 2: first_name: expected `str | null`, got `int`"],
    ),
    "a wrong type in a nested array": (
        GOOD + line(pets=[{"is_fixed": "yes"}]),
        ["line 2: pets[0].is_fixed: expected `bool | null`, got `str`"],
    ),
    "a missing required field": (
        GOOD + json.dumps({k: v for k, v in MINIMAL.items() if k != "x_id"}).encode() + b"\n",
        ["line 2: x_id: required field is missing"],
    ),
    "an empty required field": (
        GOOD + line(x_id=""),
        ["line 2: x_id: expected `str` of length >= 1"],
    ),
    "a vendor name not in upper case": (
        GOOD + line(integration_vendor="Yardi"),
        ["line 2: integration_vendor: must be upper case"],
    ),
    "an unknown field": (GOOD + line(favourite="blue"), ["line 2: favourite: unknown field"]),
    "ids GET /v1/applicants/{id} cannot reach": (
        GOOD
        + b"".join(
            line(x_id=f"X{n}", id=bad) for n, bad in enumerate(("a/b", ".", "..", "", "a" * 129))
        ),
        [f"line {n}: id: {ID_RULE}" for n in range(2, 7)],
    ),
    "a non-ASCII id": (GOOD + line(id="app_é"), [f"line 2: id: {ID_RULE}"]),
    "applications[].applicant_id different from x_id": (
        GOOD + line(applications=[{"applicant_id": "X1"}, {"applicant_id": "X2"}]),
        ["line 2: applications[1].applicant_id: must equal x_id"],
    ),
    "an invalid datetime": (
        GOOD + line(created_at="2025-02-30T10:00:00Z"),
        [f"line 2: created_at: {INSTANT_RULE}"],
    ),
    "an invalid nested datetime": (
        GOOD + line(screenings=[{"screening_date": "yesterday"}]),
        [f"line 2: screenings[0].screening_date: {INSTANT_RULE}"],
    ),
    "a datetime outside the years 1-9999 in UTC": (
        GOOD + line(last_seen="0001-01-01T00:00:00+01:00"),
        ["line 2: last_seen: instant is outside the years 0001-9999 in UTC"],
    ),
    "an invalid date of birth": (
        GOOD + line(date_of_birth="1990-13-01"),
        ["line 2: date_of_birth: must be a calendar date YYYY-MM-DD"],
    ),
    "a lone surrogate escape": (
        GOOD + with_raw(b', "first_name": "\\ud800"'),
        ["line 2: (line): a \\u escape is a lone UTF-16 surrogate, not a character"],
    ),
    "a truncated line": (
        GOOD + line()[:30] + b"\n",
        ["line 2: (line): not valid JSON (Expecting ':' delimiter at column 31)"],
    ),
    "a key holding control characters": (
        GOOD + with_raw(b', "a\\nb\\u001b[31m": 1'),
        ["line 2: a\\nb\\x1b[31m: unknown field"],
    ),
    "an empty file": (b"", ["line 1: (file): no applicant records (the file is empty or blank)"]),
    "a blank file": (
        b"\n  \n\r\n",
        ["line 3: (file): no applicant records (the file is empty or blank)"],
    ),
    "a JSON array on one line": (
        b"[" + line()[:-1] + b"]\n",
        ["line 1: (line): each line must be one JSON object (an applicant)"],
    ),
    "a pretty-printed JSON document": (
        json.dumps([MINIMAL], indent=2).encode(),
        [
            "line 1: (line): not valid JSON (Expecting value at column 2)",
            "line 2: (line): not valid JSON "
            "(Expecting property name enclosed in double quotes at column 4)",
            "line 3: (line): not valid JSON (Extra data at column 11)",
            "line 4: (line): not valid JSON (Extra data at column 20)",
            "line 5: (line): not valid JSON (Extra data at column 18)",
            "... and 4 more bad lines",
        ],
    ),
    "CSV": (
        b"x_id,first_name\nX1,Ann\n",
        [
            "line 1: (line): not valid JSON (Expecting value at column 1)",
            "line 2: (line): not valid JSON (Expecting value at column 1)",
        ],
    ),
    "binary": (
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00",
        [
            "line 1: (line): invalid UTF-8 at byte 0",
            "line 2: (line): not valid JSON (Expecting value at column 1)",
            "line 3: (line): not valid JSON (Expecting value at column 1)",
        ],
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_input_is_refused_whole_with_line_numbered_errors(
    case: str, seeded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, expected = HOSTILE[case]
    source = tmp_path / "hostile.ndjson"
    source.write_bytes(data)
    before = snapshot(seeded)
    code, out, err = run(capsys, "import", "--db", str(seeded), str(source))
    assert code == 1
    assert out == ""
    assert "Traceback" not in err
    assert err.splitlines() == [*expected, f"import refused: {source}: nothing was written"]
    assert snapshot(seeded) == before


@pytest.mark.slow
def test_a_100_mb_line_is_refused_without_being_read_whole(
    seeded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "huge.ndjson"
    with source.open("wb") as out:
        out.write(line())
        out.write(b'{"x_id": "')
        chunk = b"a" * (1 << 20)
        for _ in range(100):
            out.write(chunk)
        out.write(b'"}\n')
        out.write(line(x_id="X3"))
    before = snapshot(seeded)
    code, _, err = run(capsys, "import", "--db", str(seeded), str(source))
    assert code == 1
    assert err.splitlines() == [
        "line 2: (line): longer than 1048576 bytes",
        f"import refused: {source}: nothing was written",
    ]
    assert snapshot(seeded) == before


def test_only_the_first_few_bad_lines_are_shown_then_a_count(
    seeded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "bad.ndjson"
    source.write_bytes(b"".join(line(x_id=f"X{n}", first_name=n) for n in range(12)))
    code, _, err = run(capsys, "import", "--db", str(seeded), str(source))
    assert code == 1
    assert err.splitlines() == [
        *(f"line {n}: first_name: expected `str | null`, got `int`" for n in range(1, 6)),
        "... and 7 more bad lines",
        f"import refused: {source}: nothing was written",
    ]


def test_a_refused_file_via_the_console_script_prints_no_trace(
    seeded: Path, tmp_path: Path
) -> None:
    source = tmp_path / "bad.ndjson"
    source.write_bytes(b"\x00\xff{not json\n" + DEEP + b"\n")
    before = snapshot(seeded)
    result = subprocess.run(
        [str(LEASESTAR), "import", "--db", str(seeded), str(source)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode().splitlines() == [
        "line 1: (line): invalid UTF-8 at byte 1",
        "line 2: (line): JSON is nested too deeply",
        f"import refused: {source}: nothing was written",
    ]
    assert snapshot(seeded) == before


# --- export ---------------------------------------------------------------------------


def test_export_to_stdout_and_to_a_file_are_the_same_bytes(
    seeded: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["export", "--db", str(seeded)]) == 0
    captured = capsysbinary.readouterr()
    assert captured.err == b"exported 20 applicants\n"
    target = tmp_path / "out.ndjson"
    assert main(["export", "--db", str(seeded), str(target)]) == 0
    assert target.read_bytes() == captured.out
    assert not target.with_name("out.ndjson.partial").exists()
    connection = sqlite3.connect(seeded)
    register_json_body(connection)
    bodies = [
        body for (body,) in connection.execute("SELECT json_body(body) FROM applicants ORDER BY id")
    ]
    connection.close()
    assert captured.out == "".join(body + "\n" for body in bodies).encode()


def test_export_then_import_into_an_empty_database_restores_every_byte(
    seeded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump, restored, again = tmp_path / "dump.ndjson", tmp_path / "new.db", tmp_path / "again"
    assert main(["export", "--db", str(seeded), str(dump)]) == 0
    assert main(["import", "--db", str(restored), str(dump)]) == 0
    assert main(["export", "--db", str(restored), str(again)]) == 0
    assert again.read_bytes() == dump.read_bytes()
    # Every column but the change sequence, which numbers writes to this database.
    assert [row[:1] + row[2:] for row in snapshot(restored)[0]] == [
        row[:1] + row[2:] for row in snapshot(seeded)[0]
    ]
    capsys.readouterr()


def test_export_of_a_missing_database_does_not_create_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "export", "--db", str(tmp_path / "none.db"))
    assert code == 1
    assert err == f"leasestar: database does not exist: {tmp_path / 'none.db'}\n"
    assert not (tmp_path / "none.db").exists()


def test_db_is_accepted_before_the_command_as_after_it(
    seeded: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # so the default ./leasestar.db would be noticed if used
    after = run(capsys, "export", "--db", str(seeded))
    before = run(capsys, "--db", str(seeded), "export")
    assert before == after
    assert before[1].count("\n") == 20
    # Given both ways, the one after the command wins; token commands take it too.
    assert run(capsys, "--db", str(tmp_path / "other.db"), "export", "--db", str(seeded)) == after
    assert run(capsys, "--db", str(seeded), "token", "create", "--name", "early")[0] == 0
    assert run(capsys, "--db", str(seeded), "token", "list")[1].splitlines()[1].startswith("early ")
    assert not (tmp_path / "leasestar.db").exists()
    assert not (tmp_path / "other.db").exists()


# --- seed -----------------------------------------------------------------------------


def test_seed_is_deterministic_and_reseeding_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    assert run(capsys, "seed", "--db", str(first), "--count", "40", "--seed", "9")[1] == (
        "seeded 40 applicants (seed 9); 40 rows written\n"
    )
    run(capsys, "seed", "--db", str(second), "--count", "40", "--seed", "9")
    assert content(first) == content(second)
    before = snapshot(first)
    assert run(capsys, "seed", "--db", str(first), "--count", "40", "--seed", "9")[1] == (
        "seeded 40 applicants (seed 9); 0 rows written\n"
    )
    assert snapshot(first) == before


def test_seed_stores_exactly_the_generated_records(tmp_path: Path) -> None:
    path = tmp_path / "seed.db"
    assert main(["seed", "--db", str(path), "--count", "25", "--seed", "4"]) == 0
    expected = sorted(applicant_encoder.encode(r).decode() for r in synthetic_applicants(25, 4))
    connection = sqlite3.connect(path)
    register_json_body(connection)
    stored = [
        body for (body,) in connection.execute("SELECT json_body(body) FROM applicants ORDER BY id")
    ]
    connection.close()
    assert stored == expected


# --- progress -------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = commands.Progress("seed", 1000)
    progress.advance(250)
    progress.phase("building indexes 1/19")
    progress.finish()
    drawn = terminal.getvalue()
    assert "seed: [######..................]  25% 250/1,000 (" in drawn
    assert "seed: building indexes 1/19..." in drawn
    assert drawn.endswith("\r\033[K")


def test_progress_is_silent_when_stderr_is_not_a_terminal(
    seeded: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("leasestar.applicants.pipeline.PROGRESS_EVERY", 1)
    source = tmp_path / "in.ndjson"
    source.write_bytes(b"".join(line(x_id=f"X{n}") for n in range(50)))
    code, _, err = run(capsys, "import", "--db", str(seeded), str(source))
    assert (code, err) == (0, "")
    code, _, err = run(capsys, "seed", "--db", str(seeded), "--count", "30")
    assert (code, err) == (0, "")


def test_import_draws_progress_by_bytes_on_a_terminal(
    seeded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("leasestar.applicants.pipeline.PROGRESS_EVERY", 1)
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    source = tmp_path / "in.ndjson"
    source.write_bytes(b"".join(line(x_id=f"X{n}") for n in range(3)))
    drawn: list[str] = []
    real_draw = commands.Progress._draw
    monkeypatch.setattr(commands.Progress, "_draw", lambda self, text: drawn.append(text))
    assert main(["import", "--db", str(seeded), str(source)]) == 0
    monkeypatch.setattr(commands.Progress, "_draw", real_draw)
    assert any("%" in text and text.startswith("import: [") for text in drawn), drawn


def test_the_generator_formats_instants_as_the_api_does() -> None:
    from leasestar.instants import format_instant
    from leasestar.seed.draws import instant_text
    from leasestar.seed.vocabulary import SPAN, START

    step = 7_919_000_017  # microseconds, prime: every clock position comes up
    for micros in range(START - SPAN, START + 2 * SPAN, SPAN // 50_000):
        moment = micros - micros % 1000
        assert instant_text(moment) == format_instant(moment)
        assert instant_text(moment + step - step % 1000) == format_instant(
            moment + step - step % 1000
        )
    for year_start in (-30_610_224_000_000_000, 253_370_764_800_000_000):  # 1000, 9999
        assert instant_text(year_start) == format_instant(year_start)


def test_seed_generating_in_a_worker_stores_the_same_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    inline, worker = tmp_path / "inline.db", tmp_path / "worker.db"
    run(capsys, "seed", "--db", str(inline), "--count", "300", "--seed", "5")
    monkeypatch.setattr(pipeline, "WORKER_MIN_RECORDS", 100)
    code, out, err = run(capsys, "seed", "--db", str(worker), "--count", "300", "--seed", "5")
    assert (code, out, err) == (0, "seeded 300 applicants (seed 5); 300 rows written\n", "")
    assert content(worker) == content(inline)


# --- the columnar copy's file after a write ------------------------------------------


def line_of(record: Any) -> bytes:
    return applicant_encoder.encode(record) + b"\n"


def copy_version(path: Path) -> tuple[int, int]:
    """(the data version the copy's file holds, its rows)."""
    mapped = copy_file.load(path, COLUMN_TYPES, GROUPINGS)
    return mapped.description.identity.change_seq, mapped.description.rows


def database_version(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as connection:
        (version,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
        (rows,) = connection.execute("SELECT count(*) FROM applicants").fetchone()
    return version, rows


def test_seed_leaves_the_columnar_copy_a_start_maps_without_building(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "seeded.db"
    assert main(["seed", "--db", str(path), "--count", "300", "--seed", "5"]) == 0
    assert copy_version(path) == database_version(path)
    caplog.set_level(logging.INFO, "leasestar.columnar_copy")
    counter = MatchCounter(path)
    asyncio.run(counter.catch_up())
    assert [r.getMessage() for r in caplog.records] == []  # mapped, not built
    assert_copy_is_the_database(counter, path)


def test_an_import_writes_the_copy_again_only_when_it_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Due: the rows written since the file are a sixteenth of those it holds (and at
    least _REWRITE_LEAST, here 1); a smaller write leaves the file to the servers."""
    monkeypatch.setattr(columnar_copy, "_REWRITE_LEAST", 1)
    path = tmp_path / "imported.db"
    assert main(["seed", "--db", str(path), "--count", "320", "--seed", "6"]) == 0
    columns = copy_file.path_of(path)
    written = columns.stat().st_ino
    small, large = tmp_path / "small.ndjson", tmp_path / "large.ndjson"
    small.write_bytes(b"".join(line_of(r) for r in synthetic_applicants(19, seed=60)))
    large.write_bytes(b"".join(line_of(r) for r in synthetic_applicants(21, seed=61)))
    assert main(["import", "--db", str(path), str(small)]) == 0  # 19 < 320 // 16
    assert columns.stat().st_ino == written
    assert copy_version(path) != database_version(path)
    assert main(["import", "--db", str(path), str(large)]) == 0  # 19 + 21 >= 20
    assert columns.stat().st_ino != written
    assert copy_version(path) == database_version(path)


def test_a_copy_that_cannot_be_written_is_one_line_and_the_write_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kept.db"
    copy_file.path_of(path).mkdir()  # nothing can be renamed over a directory
    code, out, err = run(capsys, "seed", "--db", str(path), "--count", "30", "--seed", "2")
    assert (code, out) == (0, "seeded 30 applicants (seed 2); 30 rows written\n")
    assert err.startswith(f"note: the columnar copy beside {path} was not written (")
    assert err.endswith("); a server builds it when it starts\n")
    assert err.count("\n") == 1
    assert database_version(path)[1] == 30
