"""Import and seed runs (pipeline.py): the worker process.

Expected values are built here by hand or with the Structs' own encoder, never read
back from the code under test: a stored row is compared with what CONTRACT.md says it
must be.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from leasestar.applicants.pipeline import (
    ImportRefused,
    WorkerFailed,
    write_generated,
)
from leasestar.applicants.records import Applicant, applicant_encoder
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from tests.applicants.lines import (
    T0,
    exported,
    ndjson,
    run_import,
    source,
)

# --- the worker process -----------------------------------------------------------------


def test_lines_parsed_in_a_worker_give_what_inline_parsing_gives(tmp_path: Path) -> None:
    good = [applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(40, seed=8)]
    outcomes = []
    for worker_after_lines in (0, 3):
        connection = open_for_write(tmp_path / f"worker-{worker_after_lines}.db")
        try:
            report = run_import(
                connection, b"".join(good), seen_at=T0, worker_after_lines=worker_after_lines
            )
            outcomes.append((report.counts, report.lines, exported(connection)))
        finally:
            connection.close()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0].inserted == 40


def test_errors_found_in_a_worker_are_reported_in_line_order(db: sqlite3.Connection) -> None:
    good = [applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(30, seed=8)]
    good[4] = b"\n"
    good[12] = b'{"x_id": "' + b"a" * (1 << 20) + b'"}\n'
    good[20] = b"[]\n"
    good[27] = ndjson(source(first_name=1))
    before = exported(db)
    reports = []
    for worker_after_lines in (0, 2):
        with pytest.raises(ImportRefused) as refused:
            run_import(db, b"".join(good), worker_after_lines=worker_after_lines)
        reports.append(refused.value.report)
    assert (
        reports[0].errors
        == reports[1].errors
        == [
            "line 13: (line): longer than 1048576 bytes",
            "line 21: (line): each line must be one JSON object (an applicant)",
            "line 28: first_name: expected `str | null`, got `int`",
        ]
    )
    assert exported(db) == before


def test_records_generated_in_a_worker_are_written_as_generated_inline(tmp_path: Path) -> None:
    exports = []
    for in_worker in (False, True):
        connection = open_for_write(tmp_path / f"generated-{in_worker}.db")
        try:
            counts = write_generated(connection, synthetic_applicants, 700, 3, in_worker=in_worker)
            assert counts.inserted == 700
            exports.append(exported(connection))
        finally:
            connection.close()
    assert exports[0] == exports[1]


def failing_generator(count: int) -> Iterator[Applicant]:
    yield from synthetic_applicants(count, seed=1)
    raise ValueError("the generator broke")


def test_a_failing_worker_rolls_the_write_back_with_one_line(db: sqlite3.Connection) -> None:
    before = exported(db)
    with pytest.raises(
        WorkerFailed, match=r"^the worker process failed: ValueError: the generator broke$"
    ):
        write_generated(db, failing_generator, 600)
    assert exported(db) == before
    assert not db.in_transaction
