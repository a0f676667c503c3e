"""Long polls of the sync feed (`changed_since=N&wait=S`), over a real server.

Writes are real imports by the `leasestar` command into the served file; the waits are
bounded by `wait` itself, and no assertion is about how fast anything was.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tests.applicants.conftest import RATE_LIMIT, SCOPE, Server, client_of
from tests.json_body import register_json_body
from tests.servers import clean_env
from tests.test_rate_limit import remaining

pytestmark = pytest.mark.e2e

OTHER = "int_mri_01"  # an integration outside the scoped token's


def _high_water(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        (sequence,) = connection.execute("SELECT max(change_seq) FROM applicants").fetchone()
    return int(sequence)


def _import_renamed(live_server: Server, tmp_path: Path, integration: str, name: str) -> set[str]:
    """Rewrite the first names of three records of `integration` by a real import."""
    with sqlite3.connect(live_server.path) as connection:
        register_json_body(connection)
        bodies = [
            row[0]
            for row in connection.execute(
                "SELECT json_body(body) FROM applicants WHERE integration_id = ? "
                "ORDER BY id LIMIT 3",
                (integration,),
            )
        ]
    records = [msgspec.json.decode(body) for body in bodies]
    for record in records:
        record["first_name"] = name
    source = tmp_path / f"{integration}-{name}.ndjson"
    source.write_bytes(b"\n".join(msgspec.json.encode(record) for record in records) + b"\n")
    done = subprocess.run(
        [sys.executable, "-m", "leasestar", "import", "--db", str(live_server.path), str(source)],
        capture_output=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {record["id"] for record in records}


def _poll_in_background(
    live_server: Server, params: dict[str, str], token: str | None = None
) -> tuple[threading.Thread, dict[str, Any]]:
    answer: dict[str, Any] = {}

    def poll() -> None:
        with client_of(live_server, token) as client:
            answer["response"] = client.get("/v1/applicants", params=params)

    thread = threading.Thread(target=poll)
    thread.start()
    return thread, answer


def test_a_long_poll_answers_with_the_records_an_import_writes(
    live_server: Server, tmp_path: Path
) -> None:
    since = _high_water(live_server.path)
    thread, answer = _poll_in_background(live_server, {"changed_since": str(since), "wait": "30"})
    written = _import_renamed(live_server, tmp_path, SCOPE, "Woken")
    thread.join(timeout=60)
    assert not thread.is_alive()
    response: httpx.Response = answer["response"]
    assert response.status_code == 200
    body = response.json()
    assert {record["id"] for record in body["results"]} == written
    assert {record["first_name"] for record in body["results"]} == {"Woken"}
    assert body["meta"]["changeSeq"] == _high_water(live_server.path)


def test_a_long_poll_with_records_waiting_answers_at_once(live_server: Server) -> None:
    with client_of(live_server) as client:
        waited = client.get("/v1/applicants", params={"changed_since": "0", "wait": "60"})
        plain = client.get("/v1/applicants", params={"changed_since": "0"})
    assert waited.status_code == 200
    assert waited.json()["results"] == plain.json()["results"]
    assert len(plain.json()["results"]) == 100


def test_a_long_poll_that_sees_no_write_ends_empty(live_server: Server) -> None:
    since = _high_water(live_server.path)
    with client_of(live_server) as client:
        response = client.get("/v1/applicants", params={"changed_since": str(since), "wait": "1"})
    assert response.status_code == 200
    body = response.json()
    assert body["results"] == []
    assert body["meta"]["hasMore"] is False
    assert body["meta"]["changeSeq"] == since


def test_another_tenants_import_does_not_answer_a_scoped_long_poll(
    live_server: Server, tmp_path: Path
) -> None:
    since = _high_water(live_server.path)
    thread, answer = _poll_in_background(
        live_server, {"changed_since": str(since), "wait": "3"}, live_server.scoped_token
    )
    _import_renamed(live_server, tmp_path, OTHER, "Elsewhere")
    thread.join(timeout=60)
    body = answer["response"].json()
    # Woken by the write, it found none of its records and waited out its time.
    assert body["results"] == []
    assert body["meta"]["changeSeq"] == since


def test_a_long_poll_counts_once_against_the_rate_limit(live_server: Server) -> None:
    since = _high_water(live_server.path)
    with client_of(live_server) as client:
        first = client.get("/v1/applicants", params={"changed_since": "0"})
        polled = client.get("/v1/applicants", params={"changed_since": str(since), "wait": "1"})
    assert 0 <= remaining(polled) < RATE_LIMIT  # (the server's token: its window is shared)
    assert remaining(polled) == remaining(first) - 1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"changed_since": "0", "wait": "61"}, "between 0 and 60"),
        ({"changed_since": "0", "wait": "-1"}, "between 0 and 60"),
        ({"changed_since": "0", "wait": "soon"}, "between 0 and 60"),
        ({"wait": "5"}, "only to the sync feed"),
        ({"wait": "5", "order-by": "last_name"}, "only to the sync feed"),
    ],
)
def test_wait_outside_its_rule_is_refused(
    live_server: Server, params: dict[str, str], message: str
) -> None:
    with client_of(live_server) as client:
        response = client.get("/v1/applicants", params=params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["details"] == {"parameter": "wait", "value": params["wait"]}
    assert message in error["message"]


def test_wait_follows_a_sync_cursor(live_server: Server) -> None:
    with client_of(live_server) as client:
        first = client.get("/v1/applicants", params={"changed_since": "0", "limit": "5"}).json()
        cursor = first["meta"]["next"]
        waited = client.get("/v1/applicants", params={"cursor": cursor, "wait": "10"})
        plain = client.get("/v1/applicants", params={"cursor": cursor})
    assert waited.status_code == 200
    assert waited.json()["results"] == plain.json()["results"]
