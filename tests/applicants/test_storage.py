"""Unit tests of leasestar/applicants/storage.py: the count cache and the shared reads.

`meta.total` without counting rows on each request (issues 4 and 17): the broad filters'
totals come from the columnar copy (match_counter.py), never from SQLite; a selective
filter's shape is counted by SQLite once per data version, shared by every page and
request of that shape; both are exact again right after a write.

Counting is observed where it happens, in SQLite: every statement the server's read
connections run is traced, and a statement that counts applicants (`count(*) FROM
applicants`) is told apart from the page statement, which only counts its own page.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from leasestar.applicants import planner, storage
from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant
from leasestar.applicants.storage import SingleFlight
from leasestar.config import Settings
from leasestar.main import create_app
from leasestar.tokens import create_token
from tests.applicants.test_copy_file import flip_in_section
from tests.applicants.test_direct_route import log_lines

Client = AsyncTestClient  # type: ignore[type-arg]
COUNTS_ROWS = re.compile(r"count\(\*\) FROM applicants")
COPY_READ_POLLS = 3000  # of 10 ms


class Traced:
    """Every statement the app's read connections ran since the last `take()`."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def record(self, sql: str) -> None:
        self.statements.append(sql)

    def take(self) -> list[str]:
        taken, self.statements = self.statements, []
        return [sql for sql in taken if COUNTS_ROWS.search(sql)]


@pytest.fixture
async def traced_client(seeded_db: Path, token: str) -> AsyncIterator[tuple[Client, Traced]]:
    app = create_app(Settings(db_path=seeded_db, log_format="off"))
    traced = Traced()
    async with AsyncTestClient(app=app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        pool = app.state.read_pool
        for connection in pool._all:
            await connection.set_trace_callback(traced.record)
        if pool._inline is not None:
            pool._inline.set_trace_callback(traced.record)
        yield client, traced


def first_value(path: Path, sql: str, params: tuple[str, ...] = ()) -> Any:
    """The first column of the first row a statement reads, on a connection of its own."""
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql, params).fetchone()[0]
    finally:
        connection.close()


def direct_count(path: Path, where: str = "", params: tuple[str, ...] = ()) -> int:
    return int(first_value(path, f"SELECT count(*) FROM applicants {where}", params))


def some_property(path: Path) -> str:
    sql = "SELECT property_id FROM applicants GROUP BY property_id ORDER BY count(*) DESC"
    return str(first_value(path, sql))


async def total(client: Client, **params: str | int) -> int:
    response = await client.get("/v1/applicants", params=params)
    assert response.status_code == 200, response.text
    return int(response.json()["meta"]["total"])


def some_email(path: Path) -> str:
    sql = "SELECT email_1 FROM applicants WHERE email_1 IS NOT NULL LIMIT 1"
    return str(first_value(path, sql))


async def copy_read(client: Client) -> None:
    """Wait until the reader's columnar copy (match_counter.py) has been read: the app
    runs on the test client's own loop, so its read is polled, up to a bound."""
    reader = client.app.state.reader
    await total(client, property_id="starts-the-read")
    for _ in range(COPY_READ_POLLS):
        if reader._counter.ready:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the columnar copy was not read in 30 s")


async def test_broad_filters_are_counted_from_the_copy_not_by_sqlite(
    traced_client: tuple[Client, Traced], seeded_db: Path
) -> None:
    client, traced = traced_client
    everything = direct_count(seeded_db)
    prop = some_property(seeded_db)
    in_prop = direct_count(seeded_db, "WHERE property_id = ?", (prop,))
    await copy_read(client)
    traced.take()
    for params in ({"limit": 5, "offset": 5}, {"limit": 250}, {"order-by": "last_name"}, {}):
        assert await total(client, **params) == everything
    assert await total(client, property_id=prop) == in_prop
    assert await total(client, property_id=prop, updated_at_gte="2024-01-01") == direct_count(
        seeded_db, "WHERE property_id = ? AND updated_at >= 1704067200000000", (prop,)
    )
    assert traced.take() == []


async def test_each_selective_shape_is_counted_once_per_data_version(
    traced_client: tuple[Client, Traced], seeded_db: Path
) -> None:
    """A selective filter's few rows are counted by SQLite through its own index: once
    for the first request of a shape, never again for its other pages."""
    client, traced = traced_client
    email = some_email(seeded_db)
    in_email = direct_count(seeded_db, "WHERE email_1 = ? COLLATE NOCASE", (email,))
    await copy_read(client)
    traced.take()
    assert await total(client, email_1=email) == in_email
    assert len(traced.take()) == 1
    assert await total(client, email_1=email, offset=1) == in_email
    assert await total(client, email_1=email, limit=1) == in_email
    assert traced.take() == []


async def test_a_write_moves_the_data_version_and_the_total_is_exact_again(
    traced_client: tuple[Client, Traced], seeded_db: Path, db: sqlite3.Connection
) -> None:
    client, traced = traced_client
    before = direct_count(seeded_db)
    assert await total(client) == before
    traced.take()

    new = [
        Applicant(
            x_id=f"NEW-{n}",
            x_property_id="P-new",
            property_id="prop_new",
            integration_id="int_new",
            integration_vendor="NEWVENDOR",
        )
        for n in range(3)
    ]
    email = some_email(seeded_db)
    in_email = direct_count(seeded_db, "WHERE email_1 = ? COLLATE NOCASE", (email,))
    assert await total(client, email_1=email) == in_email
    await copy_read(client)
    traced.take()
    new[0] = msgspec.structs.replace(new[0], email_1=email.upper())
    write_records(db, new)
    assert await total(client) == before + 3 == direct_count(seeded_db)
    assert await total(client, integration_id="int_new") == 3
    assert traced.take() == []  # the copy followed the write
    assert await total(client, email_1=email) == in_email + 1
    assert len(traced.take()) == 1  # counted again, once, for the new version
    assert await total(client, email_1=email, limit=1) == in_email + 1
    assert traced.take() == []


# --- concurrent requests for the same slow read share one statement (SingleFlight) ---


async def test_concurrent_reads_of_one_key_run_once_and_all_get_the_answer() -> None:
    flight = SingleFlight()
    runs = 0
    release = asyncio.Event()

    async def read() -> int:
        nonlocal runs
        runs += 1
        await release.wait()
        return 42

    tasks = [asyncio.create_task(flight.run("k", read)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*tasks) == [42] * 5
    assert runs == 1


async def test_different_keys_and_later_reads_run_again() -> None:
    flight = SingleFlight()
    runs: list[str] = []

    async def read(key: str) -> str:
        runs.append(key)
        await asyncio.sleep(0)
        return key

    assert await asyncio.gather(
        flight.run("a", lambda: read("a")), flight.run("b", lambda: read("b"))
    ) == ["a", "b"]
    assert await flight.run("a", lambda: read("a")) == "a"
    assert runs == ["a", "b", "a"]


async def test_when_the_first_read_fails_the_others_read_themselves() -> None:
    flight = SingleFlight()
    release = asyncio.Event()
    calls = 0

    async def read() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()
            raise RuntimeError("first read failed")
        return 7

    first = asyncio.create_task(flight.run("k", read))
    await asyncio.sleep(0)
    second = asyncio.create_task(flight.run("k", read))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(RuntimeError, match="first read failed"):
        await first
    assert await second == 7
    assert calls == 2


SEEKING = (
    ("property_id:desc", {"integration_vendor": "ENTRATA"}, "property_id DESC, id DESC"),
    ("x_property_id:asc", {"updated_at_lte": "2025-01-01"}, "x_property_id, id"),
    ("created_at:desc", {"updated_at_lte": "2024-06-01"}, "created_at DESC, id DESC"),
    ("last_seen:asc", {"integration_id": "int_mri_01"}, "last_seen, id"),
    (
        "integration_vendor:desc,last_seen:desc",
        {},
        "integration_vendor DESC, last_seen DESC, id DESC",
    ),
    (
        "property_id:asc,created_at:desc",
        {"last_seen_gte": "2025-01-01"},
        "property_id, created_at DESC, id DESC",
    ),
    # Served by one index (last_name, first_name, id) when both keys go the same way.
    ("last_name:asc,first_name:asc", {"updated_at_lte": "2024-06-01"}, "last_name, first_name, id"),
    # Nullable keys: the first page of an asc order lies in their NULLs.
    ("state:asc,city:asc,zip:asc", {}, "state, city, zip, id"),
    (
        "state:desc,city:asc,zip:desc",
        {"updated_at_lte": "2024-06-01"},
        "state DESC, city, zip DESC, id DESC",
    ),
    ("zip:asc", {"last_seen_gte": "2025-01-01"}, "zip, id"),
)


@pytest.mark.parametrize("read_by", ["ranges", "rowids"])
@pytest.mark.parametrize(("order", "filters", "sql_order"), SEEKING)
async def test_pages_told_where_their_matches_lie_are_the_pages(
    traced_client: tuple[Client, Traced],
    seeded_db: Path,
    order: str,
    filters: dict[str, str],
    sql_order: str,
    read_by: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """First pages and offsets of orders led by a column of the copy (which seek to the
    range their matches lie in, match_counter.seek) hold the records SQLite orders:
    read through the ranges, or by the rowids of the matches within them (every seed's
    are few enough; each way is made the cheaper in turn)."""
    if read_by == "ranges":
        monkeypatch.setattr(planner, "ROWID_READ_MOST", -1)
    else:  # by rowid even where a walk of the range would cost less
        monkeypatch.setattr(planner, "ROWID_READ_COST", 0)
    client, traced = traced_client
    await copy_read(client)
    traced.statements.clear()
    instants = {"updated_at_lte": "updated_at <= ?", "last_seen_gte": "last_seen >= ?"}
    clauses, params = [], []
    for name, value in filters.items():
        if name in instants:
            clauses.append(instants[name])
            params.append(
                int(datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()) * 10**6
            )
        else:
            clauses.append(f"{name} = ?")
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    connection = sqlite3.connect(seeded_db)
    try:
        expected = [
            row[0]
            for row in connection.execute(
                f"SELECT id FROM applicants {where} ORDER BY {sql_order}", params
            )
        ]
    finally:
        connection.close()
    assert len(expected) > 10  # the seed gives each case something to find
    for offset, limit in ((0, 5), (0, 100), (7, 3), (len(expected) - 2, 5)):
        response = await client.get(
            "/v1/applicants",
            params={"order-by": order, "offset": offset, "limit": limit, **filters},
        )
        assert response.status_code == 200, response.text
        served = [record["id"] for record in response.json()["results"]]
        assert served == expected[offset : offset + limit], (order, filters, offset)
        assert response.json()["meta"]["total"] == len(expected)
    if read_by == "ranges":
        # They sought: to a range, or to the NULLs a nullable key's asc order starts with.
        assert any(" BETWEEN " in sql or " IS NULL" in sql for sql in traced.statements)
    else:
        assert any("rowid IN (SELECT value FROM json_each" in sql for sql in traced.statements)


async def test_rowid_reads_asked_at_every_offset_keep_their_rowids_within_a_budget(
    traced_client: tuple[Client, Traced], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rowid read's choice holds up to planner.ROWID_READ_MOST rowids: pages a client
    asks at ever new offsets (each a new choice) keep at most ROWID_CHOICE_BYTES of
    them, not one list per offset."""
    monkeypatch.setattr(planner, "ROWID_READ_COST", 0)  # by rowid wherever the copy can
    client, traced = traced_client
    await copy_read(client)
    reader = client.app.state.reader
    budget = 3000
    monkeypatch.setattr(
        reader, "_rowid_choices", storage.LRU(budget, weigh=lambda how: len(how.rowids or ""))
    )
    traced.statements.clear()
    for offset in range(40):
        response = await client.get(
            "/v1/applicants",
            params={"order-by": "zip:asc", "last_seen_gte": "2025-01-01", "offset": offset},
        )
        assert response.status_code == 200, response.text
    by_rowid = [sql for sql in traced.statements if "rowid IN (SELECT value FROM json_each" in sql]
    assert len(by_rowid) >= 40  # every page a rowid read, each chosen anew
    kept = list(reader._rowid_choices._entries.values())
    held = sum(len(how.rowids) for how in kept)
    assert 0 < held <= budget
    assert len(kept) < 40


async def test_matches_are_collected_through_the_filter_that_keeps_fewest_rows(
    traced_client: tuple[Client, Traced],
    seeded_db: Path,
    db: sqlite3.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token of two integrations, a date bound that a few rows meet, an order the copy
    does not hold: the matches are collected through the date's index, which the copy
    counts as keeping the fewest rows, never the integrations' (found at 1,000,000 rows:
    left to itself SQLite took the integrations' index, 250,000 rows read for the 4,000
    matches of a bound that kept 12,000: 3.5 s a page instead of ~40 ms)."""
    monkeypatch.setattr(planner, "ROWID_READ_MOST", -1)  # never read by rowid
    client, traced = traced_client
    scope = ("int_mri_01", "int_entrata_01")
    scoped = create_token(db, "two-integrations", scope)
    await copy_read(client)
    instants = sorted(
        row[0]
        for row in db.execute(
            "SELECT updated_at FROM applicants WHERE integration_id IN (?, ?)", scope
        )
    )
    bound = instants[-3]  # three of the scope's rows meet it, a few more outside it
    expected = [
        row[0]
        for row in db.execute(
            "SELECT id FROM applicants WHERE updated_at >= ? AND integration_id IN (?, ?) "
            "ORDER BY email_1 DESC, id DESC",
            (bound, *scope),
        )
    ]
    in_scope = direct_count(seeded_db, "WHERE integration_id IN (?, ?)", scope)
    assert in_scope > 6 * 5  # the scope keeps many more rows than the bound
    traced.statements.clear()
    instant = datetime.fromtimestamp(bound / 10**6, UTC).isoformat().replace("+00:00", "Z")
    response = await client.get(
        "/v1/applicants",
        params={"order-by": "email_1:desc", "updated_at_gte": instant},
        headers={"Authorization": f"Bearer {scoped}"},
    )
    assert response.status_code == 200, response.text
    assert [record["id"] for record in response.json()["results"]] == expected
    assert response.json()["meta"]["total"] == len(expected)
    (page,) = [sql for sql in traced.statements if "LIMIT" in sql and "ORDER BY" in sql]
    plan = "\n".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {page}"))
    assert "USING INDEX applicants_by_updated_at" in plan, f"{page}\n{plan}"
    assert "+integration_id IN" in page


async def test_keys_a_seek_holds_to_one_value_leave_the_page_statements_order(
    traced_client: tuple[Client, Traced], seeded_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page whose matches share one value of each key the seek holds (here one match,
    so state, city and zip are each one value) is ordered by the id alone, which the last
    key's index, (zip, id), gives in order (found at 1,000,000 rows: ordered by all four
    keys, SQLite sorted the 100,000 rows where zip is NULL, ~180 ms a page)."""
    monkeypatch.setattr(planner, "ROWID_READ_MOST", -1)  # read through the ranges
    client, traced = traced_client
    expected = first_value(seeded_db, "SELECT id FROM applicants ORDER BY state, city, zip, id")
    await copy_read(client)
    traced.statements.clear()
    response = await client.get("/v1/applicants", params={"order-by": "state,city,zip", "limit": 1})
    assert response.status_code == 200, response.text
    assert [record["id"] for record in response.json()["results"]] == [expected]
    (page,) = [sql for sql in traced.statements if "LIMIT" in sql and "ORDER BY" in sql]
    assert "ORDER BY id ASC LIMIT" in page, page


async def test_a_damaged_column_is_answered_by_sqlite_while_the_copy_is_built_again(
    seeded_db: Path, token: str
) -> None:
    """A column of the copy's file is checked when first read: found damaged, the request
    reading it is counted by SQLite (the exact total, 200), and the copy is built again
    from the database and serves the next ones, with one line."""
    first = create_app(Settings(db_path=seeded_db, log_format="off"))
    async with AsyncTestClient(app=first) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        await copy_read(client)  # the copy's file written
    flip_in_section(seeded_db, "integration_vendor")
    prop = some_property(seeded_db)
    vendor = first_value(
        seeded_db, "SELECT integration_vendor FROM applicants WHERE property_id = ?", (prop,)
    )
    expected = direct_count(
        seeded_db, "WHERE property_id = ? AND integration_vendor = ?", (prop, vendor)
    )
    with log_lines("leasestar.columnar_copy") as heard:
        heard.setLevel(logging.WARNING)
        app = create_app(Settings(db_path=seeded_db, log_format="off"))
        async with AsyncTestClient(app=app) as client:
            client.headers["Authorization"] = f"Bearer {token}"
            reader = app.state.reader
            assert reader._counter.ready  # mapped, its columns unread
            assert await total(client, property_id=prop, integration_vendor=vendor) == expected
            await copy_read(client)  # built again
            assert await total(client, property_id=prop, integration_vendor=vendor) == expected
    assert len(heard.lines) == 1, heard.lines
    assert "its column integration_vendor is damaged" in heard.lines[0]
