"""Incremental sync (issue 7): `changed_since`, `meta.changeSeq` and `meta.next`.

The truth a sync is checked against is the database itself, read with sqlite3: each
applicant's stored body (what the API serves, byte for byte) and its change sequence,
which the schema says every write moves to the next value. Hand-built cases pin the
recipe down; a Hypothesis property then interleaves imports (`write_records`) with sync
passes, imports landing between the pages of a pass too, and checks the client's mirror.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import create_token
from tests.json_body import register_json_body
from tests.strategies import INTEGRATIONS, ModelRow, applicant_rows, datasets, serve, text

Client = AsyncTestClient  # type: ignore[type-arg]
Record = dict[str, Any]


# --- the database as it is ----------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    seq: int
    record: Record
    integration_id: str


def stored(path: Path) -> dict[str, Stored]:
    """id -> (change sequence, served record) for every applicant, straight from SQLite."""
    connection = sqlite3.connect(path)
    register_json_body(connection)
    try:
        return {
            identifier: Stored(seq, json.loads(body), integration)
            for identifier, seq, body, integration in connection.execute(
                "SELECT id, change_seq, json_body(body), integration_id FROM applicants"
            )
        }
    finally:
        connection.close()


def high_water(path: Path) -> int:
    connection = sqlite3.connect(path)
    try:
        return int(connection.execute("SELECT change_seq FROM sync_state").fetchone()[0])
    finally:
        connection.close()


def hand(number: int, **fields: Any) -> Applicant:
    values: dict[str, Any] = {
        "id": f"app_sync_{number:03d}",
        "created_at": "2024-01-01T00:00:00.000Z",
        "updated_at": "2024-01-01T00:00:00.000Z",
        "last_seen": "2024-01-01T00:00:00.000Z",
        "x_id": f"X{number:03d}",
        "x_property_id": "P1",
        "property_id": "prop_1",
        "integration_id": "int_one" if number % 2 else "int_two",
        "integration_vendor": "V",
    }
    values.update(fields)
    return Applicant(**values)


async def sync(
    client: Client, since: int, limit: int = 100, **filters: str
) -> tuple[list[Record], int]:
    """One pass of the README's recipe: every change after `since`, and the seq to store."""
    response = await client.get(
        "/v1/applicants", params={"changed_since": since, "limit": limit, **filters}
    )
    delivered: list[Record] = []
    while True:
        assert response.status_code == 200, response.text
        body = response.json()
        meta = body["meta"]
        assert ("next" in meta) == meta["hasMore"], meta
        assert meta["orderBy"] == [{"field": "change_seq", "direction": "asc"}]
        delivered += body["results"]
        if "next" not in meta:
            return delivered, int(meta["changeSeq"])
        response = await client.get("/v1/applicants", params={"cursor": meta["next"]})


@pytest.fixture
async def client(db_path: Path, token: str) -> AsyncIterator[Client]:
    """The app over an empty database: each test writes its own records."""
    async with AsyncTestClient(app=create_app(Settings(db_path=db_path))) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


# --- the recipe, case by case ---------------------------------------------------------------


async def test_a_first_sync_gets_everything_in_write_order(
    client: Client, db: sqlite3.Connection, db_path: Path
) -> None:
    start = high_water(db_path)
    write_records(db, [hand(n) for n in (5, 3, 9, 1)])
    write_records(db, [hand(3, first_name="Ann"), hand(7)])
    for limit in (1, 2, 100):
        delivered, seq = await sync(client, 0, limit)
        # 3 was written again after 1: the feed is in write order, each record once.
        assert [r["id"] for r in delivered] == [f"app_sync_{n:03d}" for n in (5, 9, 1, 3, 7)]
        assert seq == high_water(db_path) == start + 6
        assert {r["id"]: r for r in delivered} == {i: s.record for i, s in stored(db_path).items()}


async def test_change_seq_is_the_last_records_or_the_given_one(
    client: Client, db: sqlite3.Connection
) -> None:
    empty = await client.get("/v1/applicants", params={"changed_since": 0})
    assert empty.json()["meta"] | {"next": None} == {
        "offset": 0,
        "limit": 100,
        "orderBy": [{"field": "change_seq", "direction": "asc"}],
        "hasMore": False,
        "total": 0,
        "changeSeq": 0,
        "next": None,
    }
    start = int(db.execute("SELECT change_seq FROM sync_state").fetchone()[0])
    write_records(db, [hand(n) for n in range(1, 6)])
    page = (
        await client.get("/v1/applicants", params={"changed_since": start + 1, "limit": 2})
    ).json()
    assert [r["id"] for r in page["results"]] == ["app_sync_002", "app_sync_003"]
    assert page["meta"]["changeSeq"] == start + 3
    assert page["meta"]["total"] == 4
    for since in (start + 5, start + 6, start + 1000, 2**63 - 1):
        meta = (await client.get("/v1/applicants", params={"changed_since": since})).json()["meta"]
        assert (meta["changeSeq"], meta["total"], meta["hasMore"]) == (since, 0, False)


async def test_the_next_sync_gets_exactly_what_changed_in_its_latest_state(
    client: Client, db: sqlite3.Connection, db_path: Path
) -> None:
    write_records(db, [hand(n) for n in range(1, 11)])
    _, since = await sync(client, 0, 3)
    # Unchanged records seen again are not writes; a record written twice comes once.
    write_records(db, [hand(n) for n in range(1, 11)])
    assert await sync(client, since, 3) == ([], since)
    write_records(db, [hand(4, last_name="Lee"), hand(11)])
    write_records(db, [hand(4, last_name="Li"), hand(2, notes="moved")])
    delivered, new_since = await sync(client, since, 1)
    assert [r["id"] for r in delivered] == ["app_sync_011", "app_sync_004", "app_sync_002"]
    now = stored(db_path)
    assert all(r == now[r["id"]].record for r in delivered)
    assert delivered[1]["last_name"] == "Li"
    assert new_since == high_water(db_path)
    assert await sync(client, new_since) == ([], new_since)


async def test_a_service_field_alone_is_a_change(client: Client, db: sqlite3.Connection) -> None:
    write_records(db, [hand(1), hand(2)])
    _, since = await sync(client, 0)
    write_records(db, [hand(2, last_seen="2024-02-01T00:00:00Z")])
    delivered, _ = await sync(client, since)
    assert [(r["id"], r["last_seen"]) for r in delivered] == [
        ("app_sync_002", "2024-02-01T00:00:00.000Z")
    ]


async def test_filters_combine_with_changed_since(
    client: Client, db: sqlite3.Connection, db_path: Path
) -> None:
    start = int(db.execute("SELECT change_seq FROM sync_state").fetchone()[0])
    write_records(db, [hand(n) for n in range(1, 21)])
    ones, since_one = await sync(client, 0, 4, integration_id="int_one")
    assert [r["id"] for r in ones] == [f"app_sync_{n:03d}" for n in range(1, 21, 2)]
    twos, since_two = await sync(client, 0, 4, integration_id="int_two")
    assert [r["id"] for r in twos] == [f"app_sync_{n:03d}" for n in range(2, 21, 2)]
    assert since_one == start + 19
    assert since_two == start + 20
    write_records(db, [hand(3, city="Austin"), hand(4, city="Austin"), hand(21), hand(22)])
    ones, since_one = await sync(client, since_one, 1, integration_id="int_one")
    assert [r["id"] for r in ones] == ["app_sync_003", "app_sync_021"]
    assert since_one == start + 23  # the last int_one record's sequence, not the high water
    assert await sync(client, since_one, 1, integration_id="int_one") == ([], since_one)
    twos, since_two = await sync(client, since_two, 1, integration_id="int_two")
    assert [r["id"] for r in twos] == ["app_sync_004", "app_sync_022"]
    # And with the other filter a sync may use on top: x_property_id never changes.
    write_records(db, [hand(5, city="Waco"), hand(7, city="Waco")])
    narrow, _ = await sync(client, since_one, 1, integration_id="int_one", x_property_id="P1")
    assert [r["id"] for r in narrow] == ["app_sync_005", "app_sync_007"]
    assert all(r == stored(db_path)[r["id"]].record for r in narrow)
    assert await sync(client, 0, 1, integration_id="int_one", x_property_id="P-none") == ([], 0)


async def test_a_scoped_token_syncs_only_its_integrations(
    db: sqlite3.Connection, db_path: Path
) -> None:
    start = int(db.execute("SELECT change_seq FROM sync_state").fetchone()[0])
    write_records(db, [hand(n) for n in range(1, 9)])
    scoped = create_token(db, "scoped-sync", ["int_two"])
    async with AsyncTestClient(app=create_app(Settings(db_path=db_path))) as client:
        client.headers["Authorization"] = f"Bearer {scoped}"
        delivered, since = await sync(client, 0, 3)
        assert [r["id"] for r in delivered] == [f"app_sync_{n:03d}" for n in (2, 4, 6, 8)]
        assert since == start + 8
        write_records(db, [hand(1, city="X"), hand(2, city="X")])
        delivered, since = await sync(client, since, 3)
        assert [r["id"] for r in delivered] == ["app_sync_002"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("property_id", "prop_1"),
        ("integration_vendor", "V"),
        ("email_1", "a@example.com"),
        ("phone_1", "5125550100"),
        ("updated_at_gte", "2024-01-01"),
        ("updated_at_lte", "2024-01-01"),
        ("last_seen_gte", "2024-01-01"),
        ("last_seen_lte", "2024-01-01"),
    ],
)
async def test_a_filter_on_a_field_that_can_change_is_refused_with_changed_since(
    client: Client, name: str, value: str
) -> None:
    """A record could leave such a filter's matches by a write, and the feed could never
    tell the client: only integration_id, x_property_id and x_id, which never change."""
    response = await client.get("/v1/applicants", params={"changed_since": 0, name: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["details"] == {"parameter": name, "value": value}
    assert "cannot be combined with changed_since" in error["message"]


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "0x10", str(2**63), "1" * 30, "\u0661"])
async def test_changed_since_out_of_its_rule_is_400(client: Client, value: str) -> None:
    response = await client.get("/v1/applicants", params={"changed_since": value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["details"] == {"parameter": "changed_since", "value": value}


# --- the property -------------------------------------------------------------------------

SYNC_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CHANGEABLE = (
    "created_at",
    "updated_at",
    "last_seen",
    "property_id",
    "first_name",
    "last_name",
    "email_1",
    "city",
    "notes",
    "address_1",
)


@dataclass
class Writer:
    """Draws batches of writes over the records written so far."""

    records: dict[str, Applicant] = field(default_factory=dict)  # id -> last written
    keys: set[tuple[str, str, str]] = field(default_factory=set)
    counter: int = 0

    def note_written(self, records: list[Applicant]) -> None:
        for record in records:
            assert record.id is not None
            self.records[record.id] = record
            self.keys.add((record.integration_id, record.x_property_id, record.x_id))

    def fresh(self, row: ModelRow) -> Applicant:
        self.counter += 1
        record = row.record
        assert record.id is not None
        identifier = record.id if record.id not in self.records else f"{record.id}~{self.counter}"
        key = (record.integration_id, record.x_property_id, record.x_id)
        x_id = record.x_id if key not in self.keys else f"{record.x_id}~{self.counter}"
        return msgspec.structs.replace(
            record,
            id=identifier,
            x_id=x_id,
            applications=[
                msgspec.structs.replace(a, applicant_id=x_id) for a in record.applications
            ],
        )


@st.composite
def batches(draw: st.DrawFn, writer: Writer) -> list[Applicant]:
    """1-4 records in one import: new, changed, or written again unchanged."""
    out: dict[str, Applicant] = {}
    for _ in range(draw(st.integers(1, 4))):
        existing = sorted(set(writer.records) - set(out))
        kind = draw(st.sampled_from(("new", "change", "change", "same") if existing else ("new",)))
        if kind == "new":
            record = writer.fresh(draw(applicant_rows()))
            if record.id in out:
                continue
            writer.keys.add((record.integration_id, record.x_property_id, record.x_id))
        else:
            old = writer.records[draw(st.sampled_from(existing))]
            record = old
            if kind == "change":
                name = draw(st.sampled_from(CHANGEABLE))
                if name in ("notes", "address_1"):
                    value = draw(st.none() | text())
                else:
                    value = getattr(draw(applicant_rows()).record, name)
                record = msgspec.structs.replace(old, **{name: value})
        assert record.id is not None
        out[record.id] = record
    return list(out.values())


@dataclass
class SyncClient:
    """The sync client of the README: a mirror and the last sequence it stored."""

    since: int = 0
    mirror: dict[str, Record] = field(default_factory=dict)
    last_change_seq: int = 0  # every meta.changeSeq seen, to check it never goes back


@SYNC_SETTINGS
@given(rows=datasets(max_size=10), data=st.data())
async def test_interleaved_imports_and_syncs_deliver_every_change_once(
    rows: list[ModelRow], data: st.DataObject
) -> None:
    integration = data.draw(
        st.none() | st.sampled_from([i for i, _ in INTEGRATIONS]), label="filter"
    )
    filters = {} if integration is None else {"integration_id": integration}

    def visible(now: dict[str, Stored]) -> dict[str, Stored]:
        return {i: s for i, s in now.items() if integration in (None, s.integration_id)}

    async with serve(rows, {"all": ()}) as served:
        client = served.client
        client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        path = served.db_path
        writer = Writer()
        writer.note_written([row.record for row in rows])
        connection = open_for_write(path)

        def do_import() -> None:
            batch = data.draw(batches(writer), label="import")
            write_records(connection, batch)
            writer.note_written(batch)
            note(f"import {[r.id for r in batch]} -> high water {high_water(path)}")

        async def sync_pass(state: SyncClient, *, writes_between_pages: bool) -> None:
            limit = data.draw(st.integers(1, 4), label="limit")
            at_start = visible(stored(path))
            pending = {i: s for i, s in at_start.items() if s.seq > state.since}
            delivered_seqs: list[int] = []
            delivered: set[str] = set()
            url_params: dict[str, Any] = {"changed_since": state.since, "limit": limit, **filters}
            for _ in range(200):
                now = visible(stored(path))
                response = await client.get("/v1/applicants", params=url_params)
                assert response.status_code == 200, response.text
                body = response.json()
                meta = body["meta"]
                assert ("next" in meta) == meta["hasMore"], meta
                for result in body["results"]:
                    current = now.get(result["id"])
                    assert current is not None, f"{result['id']!r} is not visible"
                    assert result == current.record, "a record not in its latest state"
                    # Strictly increasing sequences: nothing twice unless written again
                    # since it was delivered, and nothing at or before the stored seq.
                    assert current.seq > max([state.since, *delivered_seqs]), (
                        result["id"],
                        current.seq,
                        delivered_seqs,
                    )
                    delivered_seqs.append(current.seq)
                    delivered.add(result["id"])
                    state.mirror[result["id"]] = result
                change_seq = int(meta["changeSeq"])
                assert change_seq >= state.last_change_seq, "meta.changeSeq went back"
                assert change_seq == (delivered_seqs[-1] if delivered_seqs else state.since)
                state.last_change_seq = change_seq
                if "next" not in meta:
                    break
                if writes_between_pages and data.draw(st.booleans(), label="import between pages"):
                    do_import()
                url_params = {"cursor": meta["next"]}
            else:
                raise AssertionError("the sync pass did not end")
            assert not meta["hasMore"]
            end = visible(stored(path))
            # Every change pending at the start is delivered, unless written again during
            # the pass (then its newer state is after the stored seq: checked below).
            for identifier, was in pending.items():
                if end[identifier].seq == was.seq:
                    assert identifier in delivered, f"{identifier!r} (seq {was.seq}) was missed"
            state.since = change_seq
            assert state.since <= high_water(path)
            # Nothing missed: wherever the mirror is behind, the change is still ahead of
            # the stored sequence, so the next pass will bring it.
            for identifier, now_stored in end.items():
                if state.mirror.get(identifier) != now_stored.record:
                    assert now_stored.seq > state.since, f"{identifier!r} will never come"
            event(f"pass of {len(delivered_seqs)} deliveries")

        try:
            state = SyncClient()
            for _ in range(data.draw(st.integers(1, 6), label="steps")):
                if data.draw(st.booleans(), label="import (else sync)"):
                    do_import()
                else:
                    await sync_pass(state, writes_between_pages=True)
            # A final pass with nothing written meanwhile: the mirror is the database.
            await sync_pass(state, writes_between_pages=False)
            assert state.mirror == {i: s.record for i, s in visible(stored(path)).items()}
            # And then there is nothing new.
            await sync_pass(state, writes_between_pages=False)
        finally:
            connection.close()


# --- starting from now: changed_since=latest (issue 28) -------------------------------------


async def test_latest_is_an_empty_page_at_the_current_sequence_then_the_feed_goes_on(
    client: Client, db: sqlite3.Connection, db_path: Path
) -> None:
    write_records(db, synthetic_applicants(50, seed=1))
    page = (await client.get("/v1/applicants", params={"changed_since": "latest"})).json()
    assert page["results"] == []
    assert page["meta"]["changeSeq"] == high_water(db_path)
    assert (page["meta"]["total"], page["meta"]["hasMore"]) == (0, False)
    write_records(db, [hand(1), hand(2)])
    after = (
        await client.get("/v1/applicants", params={"changed_since": page["meta"]["changeSeq"]})
    ).json()
    assert [record["id"] for record in after["results"]] == ["app_sync_001", "app_sync_002"]


async def test_latest_as_ndjson_is_only_the_closing_sequence(
    client: Client, db: sqlite3.Connection, db_path: Path
) -> None:
    write_records(db, synthetic_applicants(20, seed=2))
    answer = await client.get(
        "/v1/applicants",
        params={"changed_since": "latest"},
        headers={"accept": "application/x-ndjson"},
    )
    assert answer.status_code == 200
    assert answer.content.splitlines() == [b'{"changeSeq":%d}' % high_water(db_path)]


@pytest.mark.parametrize("text", ["Latest", "latest1", "-1", "now"])
async def test_changed_since_other_words_are_refused(client: Client, text: str) -> None:
    answer = await client.get("/v1/applicants", params={"changed_since": text})
    assert answer.status_code == 400
    assert answer.json()["error"]["details"]["parameter"] == "changed_since"
