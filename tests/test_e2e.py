"""End to end: the real server (uvicorn in a subprocess) spoken to over real HTTP."""

from __future__ import annotations

import json
import queue
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from leasestar.database import open_for_write
from leasestar.tokens import create_token
from tests.json_body import register_json_body
from tests.servers import ROOT, START_TIMEOUT, clean_env, free_port, serving, stop, wait_for_health

pytestmark = pytest.mark.e2e

CURL = re.compile(r"curl -H 'Authorization: Bearer (?P<token>[^']+)' '(?P<url>http://[^']+)'")


def raw_http(port: int, target: bytes, token: str) -> bytes:
    """Send a request line no HTTP client library would build; return the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(
            b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\nConnection: close\r\n\r\n"
        )
        received = b""
        while b"\r\n" not in received:
            chunk = connection.recv(4096)
            if not chunk:
                break
            received += chunk
    return received.split(b"\r\n", 1)[0]


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, seeded_template: Path
) -> Iterator[tuple[str, str, Path, int]]:
    """uvicorn serving a copy of the seeded database: (base URL, token, db path, port)."""
    directory = tmp_path_factory.mktemp("e2e")
    path = directory / "leasestar.db"
    source, target = sqlite3.connect(seeded_template), sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    connection = open_for_write(path)
    try:
        token = create_token(connection, "e2e")
    finally:
        connection.close()
    with serving(path, directory / "server.log") as (base_url, port):
        yield base_url, token, path, port


def test_list_auth_and_one_record_over_http(server: tuple[str, str, Path, int]) -> None:
    base_url, token, path, _ = server
    with httpx.Client(base_url=base_url, timeout=10) as client:
        listing = client.get("/v1/applicants", headers={"Authorization": f"Bearer {token}"})
        assert listing.status_code == 200
        assert listing.headers["content-type"].startswith("application/json")
        body = listing.json()
        assert len(body["results"]) == 100
        assert body["meta"]["total"] == 300
        assert body["meta"]["hasMore"] is True

        anonymous = client.get("/v1/applicants")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert anonymous.json()["error"]["code"] == "unauthorized"

        connection = sqlite3.connect(path)
        register_json_body(connection)
        try:
            (stored,) = connection.execute(
                "SELECT json_body(body) FROM applicants ORDER BY created_at DESC, id DESC LIMIT 1"
            ).fetchone()
        finally:
            connection.close()
        expected = json.loads(stored)
        assert body["results"][0] == expected
        one = client.get(
            f"/v1/applicants/{expected['id']}", headers={"Authorization": f"Bearer {token}"}
        )
        assert one.status_code == 200
        assert one.json()["results"] == expected
        assert one.json()["meta"]["total"] == 1

        missing = client.get(
            "/v1/applicants/app_nope", headers={"Authorization": f"Bearer {token}"}
        )
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert client.get("/schema/openapi.json").status_code == 200


def test_malformed_requests_over_a_real_socket(server: tuple[str, str, Path, int]) -> None:
    _, token, _, port = server
    for target, expected in (
        (b"/v1/applicants?limit=" + b"9" * 5000, b" 400 "),  # beyond int()'s digit limit
        (b"/v1/applicants?email_1=%FF", b" 400 "),
        (b"/v1/applicants?updated_at_gte=2024-01-01T00:00:00+00:00&limit=1", b" 200 "),
        (b"/v1/applicants?email_1=\xff\xfe", None),  # the HTTP parser may refuse it first
        (b"/v1/applicants/\xff", None),
        (b"/v1/applicants?%", b" 400 "),
    ):
        status_line = raw_http(port, target, token)
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        code = int(status_line.split()[1])
        assert code < 500, (target[:60], status_line)
        if expected is not None:
            assert expected in status_line + b" ", (target[:60], status_line)


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def test_serve_on_a_new_database_prints_a_working_curl_line(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "leasestar", "serve", "--db", str(path), "--port", str(port)],
            cwd=ROOT,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True)
    try:
        # A thread keeps draining stdout, so the server can never block on a full pipe.
        reader.start()
        printed: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT
        curl = None
        while curl is None:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no curl line: {printed} {log.read_text()}") from None
            printed.append(line.rstrip("\n"))
            curl = CURL.search(line)
        token, url = curl["token"], curl["url"]
        assert any(line.strip() == token for line in printed)  # the token line
        assert url == f"http://127.0.0.1:{port}/v1/applicants"
        wait_for_health(f"http://127.0.0.1:{port}", process, log)
        response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert response.status_code == 200
        assert len(response.json()["results"]) == 100
        assert response.json()["meta"]["total"] == 1000
        assert httpx.get(url, timeout=10).status_code == 401
    finally:
        stop(process)
        if reader.ident is not None:
            reader.join(timeout=10)  # it ends at EOF, once the server is gone
        process.stdout.close()
