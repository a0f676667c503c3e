"""export -> import into an empty database -> export is byte-identical (CONTRACT.md).

Over random applicants with unicode in every string, nulls in every nullable field,
custom_data of every JSON type nested several levels, and nested arrays from empty to
long. The input itself is written loosely (datetimes with offsets and any fraction,
keys in any order, service fields present or not), as a source system would write it;
what must hold is that the first export restores exactly.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from leasestar.applicants.ndjson import export_ndjson
from leasestar.applicants.pipeline import import_ndjson
from leasestar.applicants.records import Applicant, Application, Income
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.instants import MAX_INSTANT, MIN_INSTANT, format_instant
from leasestar.main import create_app
from leasestar.tokens import create_token
from tests.strategies import ID_ALPHABET

INT64 = st.integers(-(2**63), 2**63 - 1)
# Every code point but surrogates (which no UTF-8 file can carry).
TEXT = st.text(max_size=12)
NON_EMPTY = st.text(min_size=1, max_size=12)
MAYBE_TEXT = st.none() | TEXT
# The service id is held to APPLICANT_ID_RULE: 1-128 of these characters, never "." or "..".
ID_TEXT = st.text(ID_ALPHABET, min_size=1, max_size=100)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
CUSTOM_DATA = st.dictionaries(TEXT, JSON_VALUES, max_size=4)


@st.composite
def instants(draw: st.DrawFn) -> str:
    """An instant as a source might write it: any offset, any fraction, or a date."""
    micros = draw(st.integers(MIN_INSTANT + 86_400_000_000, MAX_INSTANT - 86_400_000_000))
    canonical = format_instant(micros)
    form = draw(st.sampled_from(["canonical", "offset", "date"]))
    if form == "canonical":
        return canonical
    if form == "date":
        return canonical[:10]
    minutes = draw(st.integers(-(23 * 60 + 59), 23 * 60 + 59))
    shifted = format_instant(micros + minutes * 60_000_000)
    fraction = draw(st.text("0123456789", min_size=1, max_size=9))
    sign = "+" if minutes >= 0 else "-"
    return f"{shifted[:19]}.{fraction}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


MAYBE_INSTANT = st.none() | instants()


def short_or_long(items: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """Arrays are mostly short or empty, sometimes long (the same item repeated, to keep
    generation cheap: length is what matters there)."""
    return st.lists(items, max_size=2) | st.builds(
        lambda item, length: [item] * length, items, st.integers(30, 200)
    )


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict where each field is present with a value, or absent (defaulted)."""
    return st.fixed_dictionaries({}, optional=fields)


PETS = optional(
    id=MAYBE_TEXT,
    created_at=MAYBE_INSTANT,
    updated_at=MAYBE_INSTANT,
    last_seen=MAYBE_INSTANT,
    x_id=MAYBE_TEXT,
    age_in_years=st.none() | st.integers(0, 1000),
    breed=MAYBE_TEXT,
    color=MAYBE_TEXT,
    gender_raw=MAYBE_TEXT,
    is_declawed=st.none() | st.booleans(),
    is_fixed=st.none() | st.booleans(),
    is_service_animal=st.none() | st.booleans(),
    is_trained=st.none() | st.booleans(),
    is_vaccinated=st.none() | st.booleans(),
    name=MAYBE_TEXT,
    notes=MAYBE_TEXT,
    type=MAYBE_TEXT,
    weight_in_pounds=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    custom_data=CUSTOM_DATA,
)
SCREENINGS = optional(
    id=MAYBE_TEXT,
    created_at=MAYBE_INSTANT,
    last_seen=MAYBE_INSTANT,
    x_id=MAYBE_TEXT,
    status_raw=MAYBE_TEXT,
    screening_date=MAYBE_INSTANT,
)
INCOMES = optional(
    amount_in_cents=st.none() | INT64,
    amount_raw=MAYBE_TEXT,
    type_normalized=MAYBE_TEXT,
    type_raw=MAYBE_TEXT,
)
NULLABLE_STRINGS = [
    "x_lead_id",
    "x_unit_id",
    "x_lease_id",
    "first_name",
    "middle_name",
    "last_name",
    "email_1",
    "email_2",
    "phone_1",
    "phone_1_type",
    "phone_2",
    "phone_2_type",
    "address_1",
    "address_1_alternate",
    "address_2",
    "address_2_alternate",
    "city",
    "city_alternate",
    "state",
    "state_alternate",
    "zip",
    "zip_alternate",
    "country",
    "country_alternate",
    "notes",
    "type_normalized",
    "type_raw",
]


@st.composite
def source_records(draw: st.DrawFn, number: int) -> dict[str, Any]:
    """One applicant as a JSON object; `number` keeps its upsert key and id unique."""
    x_id = draw(NON_EMPTY) + f"#{number}"
    record: dict[str, Any] = {
        "x_id": x_id,
        "x_property_id": draw(NON_EMPTY),
        "property_id": draw(NON_EMPTY),
        "integration_id": draw(NON_EMPTY),
        "integration_vendor": draw(NON_EMPTY.map(str.upper).filter(lambda v: v == v.upper())),
    }
    record |= draw(optional(**dict.fromkeys(NULLABLE_STRINGS, MAYBE_TEXT)))
    record |= draw(
        optional(
            id=st.none() | ID_TEXT.map(lambda text: f"{text}:{number}"),
            created_at=MAYBE_INSTANT,
            updated_at=MAYBE_INSTANT,
            last_seen=MAYBE_INSTANT,
            date_of_birth=st.none() | st.dates().map(lambda day: day.isoformat()),
            x_unit_id_preferred=short_or_long(TEXT),
            unit_id_preferred=short_or_long(TEXT),
            custom_data=CUSTOM_DATA,
            pets=short_or_long(PETS),
            screenings=short_or_long(SCREENINGS),
            self_reported_income=short_or_long(INCOMES),
        )
    )
    applications = draw(
        short_or_long(
            optional(
                application_id=MAYBE_TEXT,
                status_raw=MAYBE_TEXT,
                status_normalized=MAYBE_TEXT,
                status=MAYBE_TEXT,
                custom_data=CUSTOM_DATA,
            )
        )
    )
    if applications or draw(st.booleans()):
        record["applications"] = [{"applicant_id": x_id, **item} for item in applications]
    # Keys in any order: the order of a source's JSON means nothing.
    items = list(record.items())
    return dict(draw(st.permutations(items)))


@st.composite
def source_files(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 4))
    return [draw(source_records(number)) for number in range(count)]


NESTED: dict[str, type[Application] | type[Income]] = {
    "applications": Application,
    "self_reported_income": Income,
}


@contextmanager
def database(directory: str, name: str) -> Iterator[Any]:
    connection = open_for_write(Path(directory) / name)
    try:
        yield connection
    finally:
        connection.close()


def export_of(connection: Any) -> bytes:
    out = io.BytesIO()
    export_ndjson(connection, out)
    return out.getvalue()


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(records=source_files())
def test_export_import_export_is_byte_identical(records: list[dict[str, Any]]) -> None:
    source = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    with tempfile.TemporaryDirectory() as directory:
        with database(directory, "first.db") as first:
            report = import_ndjson(first, io.BytesIO(source.encode()))
            assert report.counts.inserted == len(records)
            export = export_of(first)
        with database(directory, "second.db") as second:
            report = import_ndjson(second, io.BytesIO(export))
            assert report.counts.inserted == len(records)
            assert export_of(second) == export
            # And importing it once more changes nothing at all.
            version = second.execute("SELECT change_seq FROM sync_state").fetchone()
            report = import_ndjson(second, io.BytesIO(export))
            assert report.counts.unchanged == len(records)
            assert second.execute("SELECT change_seq FROM sync_state").fetchone() == version
            assert export_of(second) == export
    # What was given survives: every field of the input is in the export, as a value.
    for line in export.splitlines():
        served = json.loads(line)
        original = next(r for r in records if r["x_id"] == served["x_id"])
        for name, value in original.items():
            if name in ("created_at", "updated_at", "last_seen", "pets", "screenings"):
                continue  # they hold datetimes, which are normalised to UTC milliseconds
            if name == "id" and value is None:
                continue  # filled by the import
            if name in NESTED:
                value = [msgspec.to_builtins(NESTED[name](**item)) for item in value]
            assert served[name] == value, name
        assert list(served) == list(Applicant.__struct_fields__)


async def test_export_lines_are_the_bytes_the_api_serves(tmp_path: Path) -> None:
    """The round trip is "byte for byte in the API": each line is what GET serves."""
    records = [
        {
            "x_id": "Zoë 🏠",
            "x_property_id": "P-1",
            "property_id": "prop",
            "integration_id": "int",
            "integration_vendor": "V",
            "created_at": "2025-03-01T10:00:00.5+05:30",
            "custom_data": {
                "n": -(2**63),
                "f": 1.5e-300,
                "nested": [[{"": None}], []],
                "é": "\u2028",
            },
            "pets": [{"name": "Rex", "created_at": "2025-03-01"}] * 40,
        },
        {
            "x_id": "2",
            "x_property_id": "P-1",
            "property_id": "prop",
            "integration_id": "int",
            "integration_vendor": "V",
        },
    ]
    lines = b"".join(msgspec.json.encode(record) + b"\n" for record in records)
    tokens = {}
    export = b""
    for name in ("first", "restored"):
        path = tmp_path / f"{name}.db"
        connection = open_for_write(path)
        try:
            import_ndjson(connection, io.BytesIO(export or lines))
            tokens[path] = create_token(connection, name)
            if not export:
                export = export_of(connection)
            else:
                assert export_of(connection) == export
        finally:
            connection.close()
    for path, token in tokens.items():
        async with AsyncTestClient(app=create_app(Settings(db_path=path))) as client:
            client.headers["Authorization"] = f"Bearer {token}"
            for line in export.splitlines():
                response = await client.get(f"/v1/applicants/{json.loads(line)['id']}")
                assert response.status_code == 200
                assert response.content.endswith(b'"results":' + line + b"}")
            response = await client.get("/v1/applicants", params={"order-by": ""})
            assert response.status_code == 200
            assert b'"results":[' + b",".join(export.splitlines()) + b"]" in response.content
