"""NDJSON in and out (ndjson.py): parsing a line, and the export.

Expected values are built here by hand or with the Structs' own encoder, never read
back from the code under test: a stored row is compared with what CONTRACT.md says it
must be.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from leasestar.applicants.ndjson import parse_applicant
from leasestar.applicants.pipeline import (
    write_records,
)
from leasestar.applicants.records import applicant_encoder
from leasestar.seed.generator import synthetic_applicants
from tests.applicants.lines import (
    exported,
)
from tests.json_body import register_json_body

# --- parse_applicant --------------------------------------------------------------------


def test_a_canonical_line_and_a_reordered_one_give_the_same_record() -> None:
    record = next(iter(synthetic_applicants(1, seed=1)))
    canonical = applicant_encoder.encode(record)
    reordered = json.dumps(dict(reversed(list(json.loads(canonical).items())))).encode()
    assert parse_applicant(canonical + b"\n")[0] == record
    assert parse_applicant(reordered + b"\r\n")[0] == record


def test_a_repeated_key_is_refused_wherever_it_is() -> None:
    record = json.loads(applicant_encoder.encode(next(iter(synthetic_applicants(1, seed=1)))))
    record["custom_data"] = {"k": 1}
    text = json.dumps(record, separators=(",", ":"))
    for duplicated in (
        text.replace('"first_name":', '"first_name":"A","first_name":', 1),
        text.replace('"custom_data":{"k":1}', '"custom_data":{"k":1,"k":1}', 1),
        text.replace('"x_id":', '"x_id":"X","x_id":', 1),
    ):
        with pytest.raises(ValueError, match="key appears more than once"):
            parse_applicant(duplicated.encode())


# --- export ---------------------------------------------------------------------------


def test_export_writes_every_body_in_id_order(db: sqlite3.Connection) -> None:
    write_records(db, synthetic_applicants(50, seed=4))
    lines = exported(db).splitlines()
    register_json_body(db)
    bodies = dict(db.execute("SELECT id, json_body(body) FROM applicants").fetchall())
    assert [json.loads(line)["id"] for line in lines] == sorted(bodies)
    assert lines == [bodies[key].encode() for key in sorted(bodies)]


def test_export_of_an_empty_database_is_empty(db: sqlite3.Connection) -> None:
    assert exported(db) == b""
    assert not db.in_transaction
