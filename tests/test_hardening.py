"""Request hygiene (issue 5, part 3): size limits, the headers of the API, the access log,
and how tokens are compared.

The limits are checked against a real `leasestar serve` (uvicorn over a socket), so what
is measured is what a client meets: the request target as the server hands it over, and
the server's own parsers in front of the app. The same run's stderr is the access log the
token must never appear in.

The helpers at the top (`serve`, `free_port`, ...) are shared with test_faults.py and
test_rate_limit.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

import leasestar.auth
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.tokens import create_token
from tests.servers import ROOT, START_TIMEOUT, children, clean_env, free_port
from tests.test_fuzz import assert_error_body

Client = AsyncTestClient  # type: ignore[type-arg]

MAX_TARGET = 8 * 1024
MAX_HEADERS = 16 * 1024
MAX_PARAMETERS = 64
LIST = "/v1/applicants"
API_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


# --- a real `leasestar serve` ---------------------------------------------------------


def leasestar_command() -> list[str]:
    """The installed console script, or the same entry point through the interpreter."""
    script = Path(sys.executable).with_name("leasestar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "leasestar"]


def copy_database(source: Path, target: Path) -> Path:
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    return target


def query_one(path: Path, sql: str) -> Any:
    """The first column of the first row of `sql`, read with plain sqlite3."""
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql).fetchone()[0]
    finally:
        connection.close()


def new_token(path: Path, name: str, *integrations: str) -> str:
    connection = open_for_write(path)
    try:
        return create_token(connection, name, integrations)
    finally:
        connection.close()


@dataclass
class Server:
    base_url: str
    port: int
    process: subprocess.Popen[bytes]
    stderr: Path
    metrics_url: str | None = None  # where /metrics is served, when asked for

    def log(self) -> str:
        return self.stderr.read_text(encoding="utf-8", errors="replace")

    @property
    def worker_pid(self) -> int:
        """The process that serves under `--workers 1`: a fork of `process`, which only
        waits to replace it (leasestar/supervision.py)."""
        found = children(self.process.pid)
        assert len(found) == 1, found
        return found[0]


def wait_until_healthy(server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"server exited with {server.process.returncode}: {server.log()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"server did not answer /health in {START_TIMEOUT} s: {server.log()}")


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    return process.returncode


@contextmanager
def serve(
    db: Path, *flags: str, env: dict[str, str] | None = None, metrics: bool = False
) -> Iterator[Server]:
    """`leasestar serve --db DB FLAGS` on a free port, stderr to a file; stopped on exit.
    With `metrics`, /metrics is served on a second free port (`Server.metrics_url`)."""
    port = free_port()
    metrics_url = None
    if metrics:
        metrics_port = free_port()
        flags = (*flags, "--metrics-address", f"127.0.0.1:{metrics_port}")
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    stderr = db.with_name(f"serve-{port}.stderr")
    with stderr.open("wb") as err, open(os.devnull, "wb") as out:
        process = subprocess.Popen(
            [*leasestar_command(), "serve", "--db", str(db), "--port", str(port), *flags],
            cwd=ROOT,
            env=env if env is not None else clean_env(),
            stdout=out,
            stderr=err,
        )
    server = Server(f"http://127.0.0.1:{port}", port, process, stderr, metrics_url)
    try:
        wait_until_healthy(server)
        yield server
    finally:
        stop(process)


def raw_request(port: int, head: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send bytes no HTTP client library would build; parse the answer (Connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(head)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return parse_response(received)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (names in lower case) and body of one raw HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def assert_api_headers(headers: Any) -> None:
    for name, value in API_HEADERS.items():
        assert headers.get(name) == value, (name, dict(headers))


# --- size limits, over a real server --------------------------------------------------


@pytest.fixture(scope="module")
def hygiene_db(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_database(seeded_template, tmp_path_factory.mktemp("hygiene") / "leasestar.db")


@pytest.fixture(scope="module")
def hygiene_token(hygiene_db: Path) -> str:
    return new_token(hygiene_db, "hygiene-test")


@pytest.fixture(scope="module")
def server(hygiene_db: Path, hygiene_token: str) -> Iterator[Server]:
    """One real server for the module: JSON access log on stderr, no rate limit."""
    with serve(hygiene_db, "--log-format", "json", "--rate-limit", "off") as running:
        yield running


@pytest.fixture(scope="module")
def http(server: Server, hygiene_token: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.base_url,
        headers={"Authorization": f"Bearer {hygiene_token}"},
        timeout=30,
    ) as client:
        yield client


def _target(length: int) -> str:
    """A list URL whose path and query string together (the `?` between them not
    counted) are exactly `length` bytes: one known parameter with a long value, so
    anything within the limit answers 200."""
    prefix = f"{LIST}?email_1="
    return prefix + "a" * (length - len(prefix) + 1)


def test_target_of_8_KiB_is_served_one_byte_more_is_414(server: Server, hygiene_token: str) -> None:
    auth = f"Authorization: Bearer {hygiene_token}\r\n".encode()
    for length, expected in ((MAX_TARGET, 200), (MAX_TARGET + 1, 414)):
        target = _target(length).encode()
        assert len(target.replace(b"?", b"")) == length
        status, headers, body = raw_request(
            server.port,
            b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"Connection: close\r\n\r\n",
        )
        assert status == expected, body[:200]
        assert_api_headers(headers)
    error = assert_error_body(414, body)
    assert str(MAX_TARGET) in error["message"]


@pytest.mark.parametrize(
    "url",
    [
        f"{LIST}/{'a' * MAX_TARGET}",
        f"/v1/nowhere?{'b' * MAX_TARGET}",
        f"/health?x={'c' * MAX_TARGET}",
    ],
)
def test_long_targets_are_414_on_every_path(http: httpx.Client, url: str) -> None:
    response = http.get(url)
    assert response.status_code == 414
    assert response.headers["content-type"].startswith("application/json")
    assert_error_body(414, response.content)


def test_long_target_is_414_before_authentication(server: Server) -> None:
    response = httpx.get(f"{server.base_url}{_target(MAX_TARGET + 100)}", timeout=30)
    assert response.status_code == 414
    assert_api_headers(response.headers)
    assert_error_body(414, response.content)


def test_headers_over_16_KiB_are_431(http: httpx.Client) -> None:
    # Total of names and values, the Authorization header and the client's own included.
    small = http.get(LIST, params={"limit": 1}, headers={"X-Padding": "p" * (MAX_HEADERS // 2)})
    assert small.status_code == 200
    big = http.get(LIST, params={"limit": 1}, headers={"X-Padding": "p" * MAX_HEADERS})
    assert big.status_code == 431
    assert_api_headers(big.headers)
    error = assert_error_body(431, big.content)
    assert str(MAX_HEADERS) in error["message"]


def test_many_small_headers_over_16_KiB_are_431(http: httpx.Client) -> None:
    headers = {f"X-Pad-{n}": "v" * 100 for n in range(200)}
    response = http.get(LIST, headers=headers)
    assert response.status_code == 431
    assert_error_body(431, response.content)


def test_more_than_64_query_parameters_is_400(http: httpx.Client) -> None:
    at_limit = "&".join(["limit=1"] * MAX_PARAMETERS)
    over = "&".join(["limit=1"] * (MAX_PARAMETERS + 1))
    allowed = http.get(f"{LIST}?{at_limit}")
    # 64 parameters pass the count and meet the ordinary rules (a repeated parameter).
    assert allowed.status_code == 400
    assert "more than once" in assert_error_body(400, allowed.content)["message"]
    refused = http.get(f"{LIST}?{over}")
    assert refused.status_code == 400
    assert_api_headers(refused.headers)
    error = assert_error_body(400, refused.content)
    assert f"at most {MAX_PARAMETERS} query parameters" in error["message"]


# --- headers of the authenticated API --------------------------------------------------


def test_no_store_and_nosniff_on_every_api_answer(http: httpx.Client, hygiene_db: Path) -> None:
    some_id = query_one(hygiene_db, "SELECT id FROM applicants LIMIT 1")
    listed = http.get(LIST, params={"limit": 2})
    answers = {
        "200 list": listed,
        "200 record": http.get(f"{LIST}/{some_id}"),
        "304": http.get(
            LIST, params={"limit": 2}, headers={"If-None-Match": listed.headers["etag"]}
        ),
        "HEAD": http.head(LIST),
        "400": http.get(LIST, params={"limit": 0}),
        "401": http.get(LIST, headers={"Authorization": "Bearer nope"}),
        "404 record": http.get(f"{LIST}/app_unknown"),
        "404 route": http.get("/v1/nothing-here"),
        "405": http.post(LIST),
    }
    expected = {"200 list": 200, "200 record": 200, "304": 304, "HEAD": 200, "400": 400}
    expected |= {"401": 401, "404 record": 404, "404 route": 404, "405": 405}
    assert {name: r.status_code for name, r in answers.items()} == expected
    for name, response in answers.items():
        assert response.headers.get("cache-control") == "no-store", name
        assert response.headers.get("x-content-type-options") == "nosniff", name


# --- the access log -------------------------------------------------------------------


def test_access_log_never_holds_the_authorization_header(
    server: Server, http: httpx.Client, hygiene_token: str
) -> None:
    wrong_secret = hygiene_token[:-6] + "AAAAAA"
    unknown = "lst_000000000000_" + "B" * 43
    http.get(LIST, params={"limit": 1})
    http.get(LIST, headers={"Authorization": f"Bearer {wrong_secret}"})
    http.get(LIST, headers={"Authorization": f"Bearer {unknown}"})
    http.get(LIST, headers={"Authorization": "Basic dXNlcjpwYXNz"})
    http.get("/v1/nothing-here", headers={"X-Request-ID": "trace-me-1"})
    deadline = time.monotonic() + 10
    while "trace-me-1" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = server.log()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    lines = [record for record in records if "request_id" in record]  # the access lines
    assert any(line["request_id"] == "trace-me-1" for line in lines), log[-2000:]
    # Who called is logged by the token's name, never by the token.
    assert any(line["token"] == "hygiene-test" for line in lines)
    secret = hygiene_token.rsplit("_", 1)[1]
    for needle in (hygiene_token, secret, wrong_secret, unknown, "dXNlcjpwYXNz", "Bearer"):
        assert needle not in log
    assert "authorization" not in log.lower()


async def test_text_access_log_never_holds_the_token(
    seeded_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = new_token(seeded_copy, "text-log")
    app = create_app(Settings(db_path=seeded_copy, log_format="text"))
    async with AsyncTestClient(app=app) as client:
        assert (await client.get(LIST, headers={"Authorization": f"Bearer {token}"})).is_success
        await client.get(LIST, headers={"Authorization": f"Bearer {token}x"})
    log = capsys.readouterr().err
    assert "token=text-log" in log
    assert token.split("_", 2)[2] not in log  # the secret (it may itself hold "_")
    assert "Bearer" not in log


# --- token comparison -----------------------------------------------------------------


@pytest.fixture
async def anonymous(seeded_copy: Path) -> AsyncIterator[Client]:
    async with AsyncTestClient(app=create_app(Settings(db_path=seeded_copy))) as client:
        yield client


def _comparable(response: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body, less the headers that differ on every answer."""
    headers = {k: v for k, v in response.headers.items() if k not in ("x-request-id", "date")}
    return response.status_code, headers, response.content


async def test_right_id_wrong_secret_answers_exactly_like_an_unknown_token(
    anonymous: Client, seeded_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = new_token(seeded_copy, "real")
    public_id, secret = token.removeprefix("lst_").split("_", 1)
    wrong_secret = f"lst_{public_id}_{secret[::-1] if secret[::-1] != secret else 'A' * 43}"
    unknown_id = f"lst_{'0' * 12}_{secret}"
    compared: list[tuple[bytes, bytes]] = []
    real_compare: Callable[[bytes, bytes], bool] = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(leasestar.auth.hmac, "compare_digest", spy)
    answers = [
        await anonymous.get(LIST, headers={"Authorization": f"Bearer {candidate}"})
        for candidate in (wrong_secret, unknown_id, "lst_nonsense")
    ]
    assert [a.status_code for a in answers] == [401, 401, 401]
    assert _comparable(answers[0]) == _comparable(answers[1]) == _comparable(answers[2])
    # The secret was judged by comparing SHA-256 digests with hmac.compare_digest (constant
    # time), never by comparing token text.
    stored = query_one(seeded_copy, "SELECT token_hash FROM tokens WHERE name = 'real'")
    assert (bytes(stored), hashlib.sha256(wrong_secret.encode()).digest()) in [
        (bytes(a), bytes(b)) for a, b in compared
    ]
    ok = await anonymous.get(LIST, headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
