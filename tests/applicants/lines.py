"""Records as a source system sends them, NDJSON lines of them, and what a database
holds after a write: shared by the write path's tests."""

from __future__ import annotations

import io
import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

from leasestar.applicants.ndjson import export_ndjson
from leasestar.applicants.pipeline import ImportReport, import_ndjson
from tests.json_body import register_json_body

T0 = 1_735_689_600_000_000  # 2025-01-01T00:00:00Z in microseconds
T1 = T0 + 86_400_000_000  # a day later
T2 = T1 + 86_400_000_000
T0_TEXT, T1_TEXT, T2_TEXT = (
    "2025-01-01T00:00:00.000Z",
    "2025-01-02T00:00:00.000Z",
    "2025-01-03T00:00:00.000Z",
)
SERVICE = ("id", "created_at", "updated_at", "last_seen")


def source(number: int = 1, **fields: Any) -> dict[str, Any]:
    """A record as a source system reports it: no service fields."""
    record: dict[str, Any] = {
        "x_id": f"X{number:04d}",
        "x_property_id": "P-1",
        "property_id": "prop_1",
        "integration_id": "int_1",
        "integration_vendor": "YARDI",
        "first_name": "Ann",
    }
    record.update(fields)
    return record


def served(number: int = 1, **fields: Any) -> dict[str, Any]:
    """A record as the API serves it: every service field given."""
    record = source(number)
    record.update(
        id=f"app_{number:024x}", created_at=T0_TEXT, updated_at=T0_TEXT, last_seen=T0_TEXT
    )
    record.update(fields)
    return record


def ndjson(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)


def run_import(db: sqlite3.Connection, data: bytes, **options: Any) -> ImportReport:
    return import_ndjson(db, io.BytesIO(data), **options)


def rows(db: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    """Every stored row by x_id, with its body parsed."""
    register_json_body(db)
    cursor = db.execute(
        "SELECT x_id, id, change_seq, created_at, updated_at, last_seen, json_body(body) AS body "
        "FROM applicants"
    )
    names = [column[0] for column in cursor.description]
    result = {}
    for values in cursor:
        row = dict(zip(names, values, strict=True))
        row["json"] = json.loads(row["body"])
        result[row["x_id"]] = row
    return result


def data_version(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT change_seq FROM sync_state").fetchone()[0])


def exported(db: sqlite3.Connection) -> bytes:
    out = io.BytesIO()
    export_ndjson(db, out)
    return out.getvalue()


def to_micros(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
