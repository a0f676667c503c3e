"""/v1/webhooks/ in Propexo's shape, for tokens with the webhooks permission only
(issue 28, point 1)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from leasestar.config import Settings
from leasestar.main import create_app
from leasestar.replica.layout import ReplicaLayout, ReplicaMarker
from leasestar.tokens import create_token
from leasestar.webhooks.subscriptions import (
    MAX_ACTIVE_SUBSCRIPTIONS,
    create_subscription,
    revoke_subscription,
)
from tests.applicants.test_sync_feed import Client

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
NEW = {"url": "http://127.0.0.1:9/hook", "triggers": ["DATA_NEW"], "model": "applicants"}


@pytest.fixture
async def client(db_path: Path) -> AsyncIterator[Client]:
    async with AsyncTestClient(app=create_app(Settings(db_path=db_path))) as test_client:
        yield test_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_without_the_permission_the_routes_answer_as_unknown_ones(
    client: Client, db: sqlite3.Connection
) -> None:
    plain = bearer(create_token(db, "reader"))
    for method in METHODS:
        unknown = await client.request(method, "/v1/no-such-route/", headers=plain, json=NEW)
        for path in ("/v1/webhooks/", "/v1/webhooks", "/v1/webhooks/whk_0"):
            answer = await client.request(method, path, headers=plain, json=NEW)
            assert (answer.status_code, answer.content) == (unknown.status_code, unknown.content)
            assert answer.status_code == 404


async def test_create_list_get_delete(client: Client, db: sqlite3.Connection) -> None:
    manager = bearer(create_token(db, "manager", permissions=("webhooks",)))
    created = await client.post("/v1/webhooks/", headers=manager, json=NEW)
    assert created.status_code == 200, created.text
    result = created.json()["result"]
    assert result["url"] == NEW["url"]
    assert result["active"] is True
    assert [t["trigger"] for t in result["triggers"]] == ["DATA_NEW"]
    assert result["signing"] == "propexo"
    secret = result["secret"]
    stored = db.execute("SELECT secret FROM webhook_subscriptions WHERE id = ?", (result["id"],))
    assert stored.fetchone() == (secret,)
    listed = (await client.get("/v1/webhooks/", headers=manager)).json()
    assert [r["id"] for r in listed["results"]] == [result["id"]]
    assert "secret" not in listed["results"][0]
    one = await client.get(f"/v1/webhooks/{result['id']}", headers=manager)
    assert one.json()["result"] == {k: v for k, v in result.items() if k != "secret"}
    deleted = await client.delete(f"/v1/webhooks/{result['id']}", headers=manager)
    assert deleted.json() == {"result": {"id": result["id"]}}
    assert (await client.get(f"/v1/webhooks/{result['id']}", headers=manager)).status_code == 404
    assert (await client.get("/v1/webhooks/", headers=manager)).json()["results"] == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{", "request body"),
        (b'{"url": "http://127.0.0.1/", "triggers": ["JOB_FAILURE"]}', "triggers"),
        (b'{"url": "http://127.0.0.1/", "triggers": []}', "triggers"),
        (b'{"url": "ftp://127.0.0.1/", "triggers": ["DATA_NEW"]}', "url"),
        (b'{"url": "http://127.0.0.1/", "triggers": ["DATA_NEW"], "model": "leases"}', "model"),
        (b'{"url": "http://127.0.0.1/", "triggers": ["DATA_NEW"], "secret": "short"}', "secret"),
        (b'{"url": "http://127.0.0.1/", "triggers": ["DATA_NEW"], "other": 1}', "request body"),
    ],
)
async def test_bad_bodies_are_400_with_the_error_body(
    client: Client, db: sqlite3.Connection, body: bytes, expected: str
) -> None:
    manager = bearer(create_token(db, "manager", permissions=("webhooks",)))
    answer = await client.post(
        "/v1/webhooks/", headers={**manager, "content-type": "application/json"}, content=body
    )
    assert answer.status_code == 400
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert expected in error["message"]


async def test_a_scoped_manager_sees_and_makes_only_its_integrations(
    client: Client, db: sqlite3.Connection
) -> None:
    everything = bearer(create_token(db, "all", permissions=("webhooks",)))
    scoped = bearer(create_token(db, "one", ("int_1",), permissions=("webhooks",)))
    wide = (await client.post("/v1/webhooks/", headers=everything, json=NEW)).json()["result"]
    mine = (await client.post("/v1/webhooks/", headers=scoped, json=NEW)).json()["result"]
    assert mine["integrations"] == ["int_1"]
    listed = (await client.get("/v1/webhooks/", headers=scoped)).json()["results"]
    assert [r["id"] for r in listed] == [mine["id"]]
    assert (await client.get(f"/v1/webhooks/{wide['id']}", headers=scoped)).status_code == 404
    outside = await client.post(
        "/v1/webhooks/", headers=scoped, json={**NEW, "integrations": ["int_2"]}
    )
    assert outside.status_code == 400


async def test_with_the_permission_other_methods_are_405(
    client: Client, db: sqlite3.Connection
) -> None:
    manager = bearer(create_token(db, "manager", permissions=("webhooks",)))
    for method, path in (("PUT", "/v1/webhooks/"), ("PATCH", "/v1/webhooks/whk_0")):
        answer = await client.request(method, path, headers=manager, json=NEW)
        assert answer.status_code == 405
        assert answer.json()["error"]["code"]


async def test_a_write_while_an_import_holds_the_lock_is_a_503_to_retry(
    client: Client, db: sqlite3.Connection, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = bearer(create_token(db, "manager", permissions=("webhooks",)))
    kept = (await client.post("/v1/webhooks/", headers=manager, json=NEW)).json()["result"]
    # The wait for the lock, shortened from the server's 10 s: the answer is the same.
    monkeypatch.setattr("leasestar.webhooks.routes.BUSY_TIMEOUT_MS", 50)
    importing = sqlite3.connect(db_path, isolation_level=None)
    try:
        importing.execute("BEGIN IMMEDIATE")  # the write lock, as an import holds it
        created = await client.post("/v1/webhooks/", headers=manager, json=NEW)
        deleted = await client.delete(f"/v1/webhooks/{kept['id']}", headers=manager)
    finally:
        importing.execute("ROLLBACK")
        importing.close()
    for answer in (created, deleted):
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "5"
        assert answer.json()["error"]["code"] == "service_unavailable"
    listed = (await client.get("/v1/webhooks/", headers=manager)).json()
    assert [r["id"] for r in listed["results"]] == [kept["id"]]


async def test_on_a_replica_subscriptions_are_read_not_written(
    db: sqlite3.Connection, db_path: Path
) -> None:
    manager = bearer(create_token(db, "manager", permissions=("webhooks",)))
    kept = create_subscription(db, NEW["url"])
    layout = ReplicaLayout(db_path)
    layout.directory.mkdir()
    layout.write_marker(ReplicaMarker(of="primary-store", primary="primary"))
    async with AsyncTestClient(app=create_app(Settings(db_path=db_path))) as replica:
        created = await replica.post("/v1/webhooks/", headers=manager, json=NEW)
        deleted = await replica.delete(f"/v1/webhooks/{kept.id}", headers=manager)
        listed = (await replica.get("/v1/webhooks/", headers=manager)).json()
    for answer in (created, deleted):
        assert answer.status_code == 405
        assert answer.json()["error"]["code"] == "method_not_allowed"
    assert [r["id"] for r in listed["results"]] == [kept.id]
    assert db.execute("SELECT count(*), max(revoked_at) FROM webhook_subscriptions").fetchone() == (
        1,
        None,
    )


async def test_active_subscriptions_are_capped(client: Client, db: sqlite3.Connection) -> None:
    manager = bearer(create_token(db, "manager", permissions=("webhooks",)))
    for _ in range(MAX_ACTIVE_SUBSCRIPTIONS):
        create_subscription(db, NEW["url"])
    refused = await client.post("/v1/webhooks/", headers=manager, json=NEW)
    assert refused.status_code == 400
    assert "at most 50 active subscriptions" in refused.json()["error"]["message"]
    first = db.execute("SELECT id FROM webhook_subscriptions ORDER BY rowid").fetchone()[0]
    revoke_subscription(db, first)  # a revoked one leaves room
    created = await client.post("/v1/webhooks/", headers=manager, json=NEW)
    assert created.status_code == 200
    assert db.execute(
        "SELECT count(*) FROM webhook_subscriptions WHERE revoked_at IS NULL"
    ).fetchone() == (50,)
