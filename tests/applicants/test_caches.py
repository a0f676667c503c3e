"""Unit and property tests of leasestar/applicants/caches.py: the bounded maps, and the
pages kept when asked for again.

A kept page is only ever the page a read at the current data version returns: the
property below asks the same queries again and again, with scoped and unscoped tokens,
while rows are written between the asks, and judges every answer against the model of
the rows (`tests/strategies.py`), never against the server's own answers.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from leasestar.applicants.caches import LRU, SEEN_QUERIES, RecentPages
from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from tests.strategies import (
    INTEGRATIONS,
    ListQuery,
    ModelRow,
    applicant_rows,
    check_page,
    datasets,
    expected_matches,
    get_list,
    list_queries,
    serve,
    source_key,
)

SCOPES = {"all": (), "one": (INTEGRATIONS[0][0],), "two": (INTEGRATIONS[1][0], INTEGRATIONS[2][0])}


def test_a_weighed_lru_forgets_the_oldest_until_within_its_budget() -> None:
    lru: LRU[str, str] = LRU(10, weigh=len)
    for key, value in (("a", "xxxx"), ("b", "xxxx"), ("c", "xxx")):
        lru.put(key, value)
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == (None, "xxxx", "xxx")
    lru.put("b", "x")  # written again: its old weight is gone, and it is the newest
    lru.put("d", "xxxxxx")
    assert (lru.get("b"), lru.get("c"), lru.get("d")) == ("x", "xxx", "xxxxxx")
    assert lru.weight == 10
    lru.put("e", "x" * 20)  # heavier than the budget alone: kept, alone
    assert [lru.get(k) for k in "bcd"] == [None, None, None]
    assert lru.get("e") == "x" * 20


def test_a_page_is_kept_from_its_second_request_and_only_at_its_version() -> None:
    pages: RecentPages[str, bytes] = RecentPages(100, weigh=len)
    assert not pages.asked_before("q")
    assert pages.asked_before("q")
    pages.put("q", 7, b"page at 7")
    assert pages.get("q", 7) == b"page at 7"
    assert pages.get("q", 8) is None  # a write since: read again
    assert pages.get("other", 7) is None


def test_pages_weigh_at_most_the_budget_and_one_heavier_is_not_kept() -> None:
    pages: RecentPages[int, bytes] = RecentPages(100, weigh=len)
    for query in range(10):
        pages.put(query, 1, bytes(30))
        assert pages.weight <= 100
    assert [pages.get(query, 1) is not None for query in range(10)] == [False] * 7 + [True] * 3
    pages.put(99, 1, bytes(101))
    assert pages.get(99, 1) is None
    assert pages.get(9, 1) == bytes(30)  # nothing made room for a page never kept


def test_without_a_budget_nothing_is_remembered() -> None:
    pages: RecentPages[str, bytes] = RecentPages(0, weigh=len)
    assert not pages.asked_before("q")
    assert not pages.asked_before("q")


def test_a_query_is_remembered_for_at_least_the_last_seen_queries() -> None:
    pages: RecentPages[int, bytes] = RecentPages(100, weigh=len)
    assert not pages.asked_before(-1)
    for query in range(SEEN_QUERIES - 1):
        assert not pages.asked_before(query)
    assert pages.asked_before(-1)  # SEEN_QUERIES distinct ones later: still known
    for query in range(SEEN_QUERIES, 3 * SEEN_QUERIES):
        assert not pages.asked_before(query)
    assert not pages.asked_before(-1)  # forgotten: memory stays bounded


# --- the pages a server keeps -----------------------------------------------------------


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rows=datasets(max_size=12), data=st.data())
async def test_a_page_asked_again_is_the_page_of_the_data_as_it_is_now(
    rows: list[ModelRow], data: st.DataObject
) -> None:
    """Queries asked twice by each token (of different scopes) and again later, rows
    written in between: every answer is the model's page of the rows as they are at that
    moment, within the asking token's scope."""
    async with serve(rows, SCOPES) as served:
        client = served.client
        current = list(rows)
        asked = [ListQuery()]  # every row: any write changes its page
        for _ in range(data.draw(st.integers(1, 6), label="steps")):
            if data.draw(st.booleans(), label="write"):
                new = data.draw(st.lists(applicant_rows(), min_size=1, max_size=3), label="new")
                taken_ids = {row.record.id for row in current}
                taken_keys = {source_key(row) for row in current}
                new = [
                    row
                    for row in new
                    if row.record.id not in taken_ids and source_key(row) not in taken_keys
                ]
                new = list({source_key(row): row for row in new}.values())
                new = list({row.record.id: row for row in new}.values())
                connection = open_for_write(served.db_path)
                try:
                    write_records(connection, [row.record for row in new])
                finally:
                    connection.close()
                current += new
                note(f"wrote {len(new)}")
            if data.draw(st.booleans(), label="again"):
                query = data.draw(st.sampled_from(asked), label="asked before")
            else:
                query = data.draw(list_queries(current), label="query")
                asked.append(query)
            for _ask in range(2):  # asked again: kept, and served as kept from then on
                for name, integrations in SCOPES.items():
                    scope = frozenset(integrations) or None
                    client.headers["Authorization"] = f"Bearer {served.tokens[name]}"
                    body = await get_list(client, query.query_string())
                    expected = expected_matches(current, query, scope)
                    check_page(body, query, expected, query.offset, query.limit)


async def test_an_updated_record_is_served_updated_on_a_page_asked_again(
    seeded_db: Path, token: str, db: sqlite3.Connection
) -> None:
    """An update moves no row in or out of the page: its bytes still change."""
    app = create_app(Settings(db_path=seeded_db, page_cache_mb=1))
    async with AsyncTestClient(app=app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        for _ in range(3):
            first = await get_list(client, "limit=5")
        record = first["results"][0]
        updated = msgspec.convert(
            {**record, "last_name": record["last_name"] + " Updated"}, Applicant
        )
        write_records(db, [updated])
        again = await get_list(client, "limit=5")
        assert again["results"][0]["id"] == record["id"]
        assert again["results"][0]["last_name"] == record["last_name"] + " Updated"
