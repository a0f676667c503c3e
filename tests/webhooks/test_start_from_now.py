"""`changed_since=latest` (issue 28, point 5): the feed from now, without the history."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from leasestar.applicants.pipeline import write_records
from leasestar.config import Settings
from leasestar.main import create_app
from leasestar.seed.generator import synthetic_applicants
from tests.applicants.test_sync_feed import Client, hand, high_water


@pytest.fixture
async def client(db_path: Path, token: str) -> AsyncIterator[Client]:
    async with AsyncTestClient(app=create_app(Settings(db_path=db_path))) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


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
async def test_anything_else_is_refused(client: Client, text: str) -> None:
    answer = await client.get("/v1/applicants", params={"changed_since": text})
    assert answer.status_code == 400
    assert answer.json()["error"]["details"]["parameter"] == "changed_since"
