"""Stored bodies (bodies.py): compressed, and served byte for byte as the JSON they hold.

Every reader (list pages, get by id, the stream, the export) against the canonical
JSON of the records imported; the dictionaries' life (none for a database's first
records, the first one trained once there are enough, another for records of another
kind); a database from before bodies were compressed.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from litestar.testing import AsyncTestClient

from leasestar.applicants import bodies
from leasestar.applicants.bodies import BodyDecoder
from leasestar.applicants.ndjson import export_ndjson
from leasestar.applicants.pipeline import import_ndjson, write_records
from leasestar.applicants.records import Applicant, applicant_encoder
from leasestar.config import Settings
from leasestar.database import SCHEMA_VERSION, open_for_write
from leasestar.main import create_app
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import create_token
from tests.applicants.test_roundtrip_properties import source_files
from tests.json_body import register_json_body

NDJSON = "application/x-ndjson"
BASE = bodies.TRAIN_AFTER + 200  # a database whose first dictionary is trained


def export_of(connection: sqlite3.Connection) -> bytes:
    out = io.BytesIO()
    export_ndjson(connection, out)
    return out.getvalue()


def kinds(connection: sqlite3.Connection) -> list[int]:
    """The first byte of every stored body, in rowid order: which dictionary it names."""
    rows = connection.execute("SELECT CAST(body AS BLOB) FROM applicants ORDER BY rowid")
    return [row[0][0] for row in rows]


def dictionaries(connection: sqlite3.Connection) -> list[int]:
    return [n for (n,) in connection.execute("SELECT number FROM body_dictionaries ORDER BY 1")]


def canonical(line: bytes) -> bytes:
    """The record's JSON as the API writes it (records.py), whatever was stored."""
    return applicant_encoder.encode(msgspec.json.decode(line, type=Applicant))


def ndjson(records: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode())


@pytest.fixture(scope="module")
def trained_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bodies") / "trained.db"
    connection = open_for_write(path)
    try:
        write_records(connection, synthetic_applicants(BASE, seed=3))
    finally:
        connection.close()
    return path


async def served_bodies(path: Path) -> dict[str, dict[str, bytes]]:
    """id -> reader -> the record's bytes as that reader serves it."""
    connection = open_for_write(path)
    try:
        token = create_token(connection, "bodies")
        exported = export_of(connection)
    finally:
        connection.close()
    served: dict[str, dict[str, bytes]] = {}
    for line in exported.splitlines():
        served[json.loads(line)["id"]] = {"export": line}
    headers = {"Authorization": f"Bearer {token}"}
    async with AsyncTestClient(app=create_app(Settings(db_path=path))) as client:
        stream = await client.get(
            "/v1/applicants", params={"order-by": "id"}, headers={**headers, "Accept": NDJSON}
        )
        assert stream.status_code == 200
        for line in stream.content.splitlines():
            served[json.loads(line)["id"]]["stream"] = line
        for identifier, by_reader in served.items():
            response = await client.get(f"/v1/applicants/{identifier}", headers=headers)
            assert response.status_code == 200
            by_reader["get"] = response.content.split(b',"results":', 1)[1][: -len(b"}")]
        # The list pages (in id order, 250 a page) are the pages' records' JSON joined
        # with commas, byte for byte.
        order = sorted(served)
        params: dict[str, Any] = {"limit": 250, "order-by": "id"}
        start = 0
        while True:
            response = await client.get("/v1/applicants", params=params, headers=headers)
            assert response.status_code == 200
            results = response.content.split(b',"results":[', 1)[1][: -len(b"]}")]
            ids = order[start : start + 250]
            pieces = results.split(b"},{")  # only to tell which record went wrong
            assert results == b",".join(served[i]["export"] for i in ids), pieces[:1]
            for identifier in ids:
                served[identifier]["list"] = served[identifier]["export"]
            start += len(ids)
            meta = response.json()["meta"]
            if "next" not in meta:
                break
            params = {"cursor": meta["next"]}
        assert start == len(order)
    return served


def check_served(served: dict[str, dict[str, bytes]]) -> None:
    """Every reader served every record, each as the same canonical JSON."""
    for identifier, by_reader in served.items():
        assert set(by_reader) == {"export", "list", "stream", "get"}, identifier
        line = by_reader["export"]
        assert line == canonical(line)
        assert by_reader["stream"] == line
        assert by_reader["get"] == line


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(records=source_files())
async def test_every_reader_serves_each_record_as_its_canonical_json(
    trained_template: Path, records: list[dict[str, Any]]
) -> None:
    """Records of any shape, imported into a database with a trained dictionary."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "leasestar.db"
        shutil.copyfile(trained_template, path)
        connection = open_for_write(path)
        try:
            report = import_ndjson(connection, ndjson(records))
            assert report.counts.inserted == len(records)
            assert set(kinds(connection)) == {1}
            exported = export_of(connection)
        finally:
            connection.close()
        served = await served_bodies(path)
        check_served(served)
        # What was imported is what is served: the input's fields, by value.
        by_x_id = {json.loads(by["export"])["x_id"]: by["export"] for by in served.values()}
        for record in records:
            line = json.loads(by_x_id[record["x_id"]])
            for name in ("x_property_id", "property_id", "first_name", "custom_data"):
                if name in record:
                    assert line[name] == record[name]
        assert len(exported.splitlines()) == BASE + len(records)


async def test_a_small_database_stores_bodies_without_a_dictionary(db_path: Path) -> None:
    connection = open_for_write(db_path)
    try:
        write_records(connection, synthetic_applicants(40, seed=5))
        assert dictionaries(connection) == []
        assert set(kinds(connection)) == {bodies.NO_DICTIONARY}
    finally:
        connection.close()
    check_served(await served_bodies(db_path))


def test_the_first_dictionary_is_trained_once_there_are_enough_records(db_path: Path) -> None:
    """Imports below TRAIN_AFTER store bodies without a dictionary; the one that brings
    the database to TRAIN_AFTER trains it and compresses the earlier ones again."""
    records = list(synthetic_applicants(bodies.TRAIN_AFTER + 100, seed=6))
    connection = open_for_write(db_path)
    try:
        write_records(connection, records[:600])
        before = export_of(connection)
        assert dictionaries(connection) == []
        write_records(connection, records[600:])
        assert dictionaries(connection) == [1]
        assert set(kinds(connection)) == {1}
        exported = export_of(connection)
        assert set(before.splitlines()) <= set(exported.splitlines())
        assert sorted(exported.splitlines()) == sorted(
            applicant_encoder.encode(record) for record in records
        )
        (stored,) = connection.execute("SELECT avg(length(body)) FROM applicants").fetchone()
        assert stored * 4 < len(exported) / len(records)  # ~6.5x on seeded records
    finally:
        connection.close()


def test_a_large_first_write_trains_on_its_first_records(db_path: Path) -> None:
    connection = open_for_write(db_path)
    try:
        write_records(connection, synthetic_applicants(bodies.TRAIN_AFTER * 2, seed=8))
        assert dictionaries(connection) == [1]
        assert set(kinds(connection)) == {1}
    finally:
        connection.close()


def other_kind(count: int) -> Iterator[dict[str, Any]]:
    """Records unlike the seeded ones: custom_data of 60 long words each, drawn from a
    vocabulary of 600 (little repeats within a record; much across records)."""
    draw = random.Random(11)
    vocabulary = ["".join(draw.choices("abcdefghijklmnopqrstuvwxyz", k=14)) for _ in range(600)]
    for number in range(count):
        words = draw.sample(vocabulary, 60)
        yield {
            "x_id": f"other-{number}",
            "x_property_id": "P-OTHER",
            "property_id": "prop_other",
            "integration_id": "int_other",
            "integration_vendor": "OTHER",
            "custom_data": {words[i]: words[i + 1] for i in range(0, 60, 2)},
        }


async def test_records_of_another_kind_train_a_dictionary_of_their_own(
    trained_template: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copyfile(trained_template, db_path)
    monkeypatch.setattr(bodies, "WINDOW", 300)
    records = list(other_kind(900))
    connection = open_for_write(db_path)
    try:
        report = import_ndjson(connection, ndjson(records))
        assert report.counts.inserted == len(records)
        assert dictionaries(connection) == [1, 2]
        stored = kinds(connection)
        # The first window was written with the first dictionary; the rest with theirs.
        assert stored[: BASE + 300] == [1] * (BASE + 300)
        assert set(stored[BASE + 300 :]) == {2}
        ratios = dict(connection.execute("SELECT number, ratio FROM body_dictionaries"))
        assert ratios[2] > 2.5
        exported = export_of(connection).splitlines()
        assert len(exported) == BASE + len(records)
        assert all(line == canonical(line) for line in exported)
    finally:
        connection.close()
    # Pages whose records name either dictionary, served by a reader that loads them.
    check_served(await served_bodies(db_path))


def test_a_reader_learns_a_dictionary_written_after_it_started(
    trained_template: Path, db_path: Path
) -> None:
    shutil.copyfile(trained_template, db_path)
    connection = open_for_write(db_path)
    try:
        (stored,) = connection.execute("SELECT body FROM applicants LIMIT 1").fetchone()
        decoder = BodyDecoder()
        with pytest.raises(bodies.UnknownDictionary):
            decoder.decode(stored)
        decoder.add(connection.execute(bodies.DICTIONARIES))
        assert decoder.decode(stored) == canonical(decoder.decode(stored))
    finally:
        connection.close()


def make_version_2(path: Path) -> None:
    """Turn a database into one as schema version 2 left it: bodies stored as JSON text,
    no dictionaries."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        register_json_body(connection)
        connection.execute("UPDATE applicants SET body = json_body(body)")
        connection.execute("DROP TABLE body_dictionaries")
        connection.execute("PRAGMA user_version = 2")
    finally:
        connection.close()


async def test_a_database_from_before_is_served_as_it_stored_its_json(
    trained_template: Path, db_path: Path
) -> None:
    shutil.copyfile(trained_template, db_path)
    connection = open_for_write(db_path)
    try:
        exported = export_of(connection)
    finally:
        connection.close()
    make_version_2(db_path)
    connection = open_for_write(db_path)  # migrates
    try:
        assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert set(kinds(connection)) == {bodies.RAW}
        assert export_of(connection) == exported
        # A record written again is compressed, with a dictionary its first write
        # trained on the stored JSON; the others stay as they were.
        first = json.loads(exported.splitlines()[0])
        first["first_name"] = "Renamed"
        import_ndjson(connection, ndjson([first]))
        assert dictionaries(connection) == [1]
        assert sorted(set(kinds(connection))) == [1, bodies.RAW]
    finally:
        connection.close()
    served = await served_bodies(db_path)
    check_served(served)
    assert json.loads(served[first["id"]]["get"])["first_name"] == "Renamed"
