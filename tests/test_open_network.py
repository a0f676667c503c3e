"""Safe on an open network (issue 18), probed as an attacker would, against a real
`leasestar serve` over loopback sockets: bounded memory per connection whatever arrives,
timeouts for slow and idle clients, a connection cap, and the smaller signals closed.

Every load here is bounded (a few connections, tens of megabytes, seconds), and every wait
has a deadline; the only timing asserted is that a slow connection is closed before its
timeout plus a generous margin.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from leasestar.database import open_for_write
from leasestar.protocol import MAX_HEAD_BYTES
from leasestar.tokens import revoke_token
from tests.test_fuzz import assert_error_body
from tests.test_hardening import (
    ROOT,
    Server,
    copy_database,
    leasestar_command,
    new_token,
    parse_response,
    query_one,
    raw_request,
    serve,
)

LIST = "/v1/applicants"
HEAD_TIMEOUT = 2  # seconds, the server's --head-timeout in this module
KEEP_ALIVE = 1  # seconds, its --keep-alive-timeout
SEND_TIMEOUT = 2  # seconds, its --send-timeout
MAX_CONNECTIONS = 400  # above the slowloris test's 300 connections
MARGIN = 8.0  # seconds allowed beyond a timeout on a busy machine
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def network_db(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_database(seeded_template, tmp_path_factory.mktemp("network") / "leasestar.db")


@pytest.fixture(scope="module")
def network_token(network_db: Path) -> str:
    return new_token(network_db, "network-test")


@pytest.fixture(scope="module")
def server(network_db: Path, network_token: str) -> Iterator[Server]:
    flags = ("--rate-limit", "off", "--log-format", "off")
    limits = (
        *("--head-timeout", str(HEAD_TIMEOUT), "--keep-alive-timeout", str(KEEP_ALIVE)),
        *("--send-timeout", str(SEND_TIMEOUT)),
    )
    # The slowloris test opens all its connections from one address.
    caps = ("--max-connections", str(MAX_CONNECTIONS), "--max-connections-per-address", "400")
    with serve(network_db, *flags, *limits, *caps) as running:
        yield running


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def read_until_closed(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes the connection (True) or the deadline
    passes (False)."""
    received = b""
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received, True
        if not chunk:
            return received, True
        received += chunk
    return received, False


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def reset_peak_rss(pid: int) -> None:
    """Set the process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def flood(port: int, opening: bytes, filler: bytes, total: int) -> tuple[int, bytes]:
    """Send `opening`, then `filler` over and over up to `total` bytes or until the server
    stops reading; returns how much was sent and what the server answered."""
    sent = 0
    with connect(port) as sock:
        try:
            sock.sendall(opening)
            chunk = filler * max(1, 65536 // len(filler))
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the server closed the connection: what it said is still readable
        try:
            answer, _ = read_until_closed(sock, time.monotonic() + 30)
        except OSError:
            answer = b""
    return sent, answer


# --- 1. bounded memory per connection -------------------------------------------------------


def _flood_in_parallel(
    server: Server, connections: int, opening: bytes, filler: bytes, total: int
) -> tuple[int, list[tuple[int, bytes]]]:
    """Run `connections` floods at once; the server's peak RSS growth (KiB) and the answers."""
    pid = server.worker_pid
    reset_peak_rss(pid)
    before = rss_kib(pid)
    results: list[tuple[int, bytes]] = [(0, b"")] * connections

    def one(index: int) -> None:
        results[index] = flood(server.port, opening, filler, total)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return rss_kib(pid, "VmHWM") - before, results


def test_endless_header_lines_are_refused_431_with_memory_bounded(server: Server) -> None:
    line = b"X-Fill: " + b"f" * 990 + b"\r\n"
    growth, results = _flood_in_parallel(
        server, 5, b"GET /health HTTP/1.1\r\nHost: x\r\n", line, 20 * MIB
    )
    for sent, answer in results:
        # Refused long before the 20 MB were sent, with the error body. What a client gets
        # to send is the head's bound plus what the kernel's socket buffers take in before
        # the refusal reaches it: 4.4 MB once in a loaded CI run, so the bound is 8 MiB.
        assert sent < 8 * MIB, sent
        status, headers, body = parse_response(answer)
        assert status == 431
        assert headers["connection"] == "close"
        assert str(MAX_HEAD_BYTES) in assert_error_body(431, body)["message"]
    # 100 MB were offered; the server's peak RSS grew by a few MB at most (before the
    # limit, the first connection alone took 116 MB).
    assert growth < 24 * 1024, f"peak RSS grew by {growth} KiB"
    assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200


def test_one_endless_header_line_is_refused_as_well(server: Server) -> None:
    growth, results = _flood_in_parallel(
        server, 2, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: ", b"v" * 4096, 20 * MIB
    )
    for sent, answer in results:
        assert sent < 4 * MIB, sent
        assert parse_response(answer)[0] == 431
    assert growth < 24 * 1024, f"peak RSS grew by {growth} KiB"


def test_an_endless_request_line_is_refused_414(server: Server) -> None:
    growth, results = _flood_in_parallel(server, 2, b"GET /health?x=", b"a" * 4096, 20 * MIB)
    for sent, answer in results:
        assert sent < 4 * MIB, sent
        status, _, body = parse_response(answer)
        assert status == 414
        assert_error_body(414, body)
    assert growth < 24 * 1024, f"peak RSS grew by {growth} KiB"


@pytest.mark.parametrize(
    "announce",
    [b"Content-Length: 20000000\r\n", b"Transfer-Encoding: chunked\r\n"],
    ids=["content-length", "chunked"],
)
def test_a_body_sent_to_a_get_is_refused_413_unread(server: Server, announce: bytes) -> None:
    opening = b"GET /health HTTP/1.1\r\nHost: x\r\n" + announce + b"\r\n"
    growth, results = _flood_in_parallel(server, 2, opening, b"b" * 4096, 20 * MIB)
    for sent, answer in results:
        assert sent < 4 * MIB, sent
        status, headers, body = parse_response(answer)
        assert status == 413
        assert headers["connection"] == "close"
        assert_error_body(413, body)
    assert growth < 24 * 1024, f"peak RSS grew by {growth} KiB"


def test_an_empty_body_is_no_body(server: Server, network_token: str) -> None:
    status, _, body = raw_request(
        server.port,
        b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_a_head_just_under_the_app_limits_is_still_judged_by_the_app(
    server: Server, network_token: str
) -> None:
    """Between the app's limits and the connection's, the app's precise answers stand."""
    padding = "".join(f"X-Pad-{n}: {'p' * 200}\r\n" for n in range(100)).encode()
    status, _, body = raw_request(
        server.port,
        b"GET /v1/applicants HTTP/1.1\r\nHost: x\r\n" + padding + b"Connection: close\r\n\r\n",
    )
    assert status == 431
    assert "16384" in assert_error_body(431, body)["message"]


# --- 2. timeouts and the connection cap ----------------------------------------------------


def test_slowloris_connections_are_closed_on_time_while_a_normal_client_is_served(
    server: Server, network_token: str
) -> None:
    """300 connections: 150 send nothing, 150 trickle a header line every 0.3 s. Each is
    closed within the head timeout (plus a margin); meanwhile a normal client gets every
    answer, in full."""
    opened = time.monotonic()
    silent = [connect(server.port) for _ in range(150)]
    trickling = [connect(server.port) for _ in range(150)]
    for sock in trickling:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    open_ = {sock.fileno(): sock for sock in silent + trickling}
    closed_at: dict[int, float] = {}
    answers: list[int] = []
    expected_total = query_one(server_db(server), "SELECT count(*) FROM applicants")
    with httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {network_token}"}
    ) as client:
        deadline = opened + HEAD_TIMEOUT + MARGIN
        next_trickle = time.monotonic()
        while open_ and time.monotonic() < deadline:
            if time.monotonic() >= next_trickle:
                for sock in trickling:
                    if sock.fileno() in open_:
                        with contextlib.suppress(OSError):
                            sock.sendall(b"X-Slow: 1\r\n")
                next_trickle = time.monotonic() + 0.3
            page = client.get(LIST, params={"limit": 2}, timeout=30)
            answers.append(page.status_code)
            assert page.json()["meta"]["total"] == expected_total
            readable, _, _ = select.select(list(open_.values()), [], [], 0.05)
            for sock in readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    closed_at[sock.fileno()] = time.monotonic() - opened
                    del open_[sock.fileno()]
    for sock in silent + trickling:
        sock.close()
    assert not open_, f"{len(open_)} slow connections still open after {deadline - opened} s"
    assert len(closed_at) == 300
    assert answers
    assert set(answers) == {200}


def test_an_idle_kept_alive_connection_is_closed(server: Server) -> None:
    with connect(server.port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        received, closed = read_until_closed(sock, start + KEEP_ALIVE + MARGIN)
    assert closed, "the idle connection was not closed"
    assert parse_response(received)[0] == 200


def test_a_kept_alive_connection_trickling_its_next_head_is_closed(server: Server) -> None:
    """Each byte restarts the keep-alive timer; the head deadline still holds."""
    with connect(server.port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + HEAD_TIMEOUT + MARGIN
        first, closed = read_until_closed(sock, time.monotonic() + 0.5)
        assert not closed
        assert parse_response(first)[0] == 200
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"X: 1\r\n")
            except OSError:
                break
            _rest, closed = read_until_closed(sock, time.monotonic() + 0.4)
            if closed:
                break
        else:
            pytest.fail("the trickling connection was not closed")


def test_a_busy_connection_outlives_the_head_timeout_and_names_no_server(
    network_db: Path, tmp_path: Path
) -> None:
    """The head deadline runs from each response, not from the connection's opening: a
    connection sending one request after another for longer than the head timeout is
    served throughout. And no answer says which server software runs (`Server`).

    A server of its own, whose keep-alive outlasts its head timeout: only a client stalled
    for the whole head timeout (4 s) between two requests could see its connection closed.
    """
    head_timeout = 4
    db = copy_database(network_db, tmp_path / "busy.db")
    limits = ("--head-timeout", str(head_timeout), "--keep-alive-timeout", "60")
    with (
        serve(db, "--rate-limit", "off", "--log-format", "off", *limits) as server,
        connect(server.port) as sock,
    ):
        end = time.monotonic() + 2 * head_timeout + 1
        served = 0
        while time.monotonic() < end:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            while True:  # one whole answer: its head, then content-length bytes of body
                chunk = sock.recv(65536)
                assert chunk, f"closed after {served} requests"
                received += chunk
                if b"\r\n\r\n" not in received:
                    continue
                status, headers, body = parse_response(received)
                if len(body) >= int(headers["content-length"]):
                    break
            assert status == 200
            assert "server" not in headers, headers
            served += 1
            time.sleep(0.05)  # a client's pace, not a core's worth of requests
    assert served > 1


def test_a_client_that_stops_reading_is_disconnected(server: Server, network_token: str) -> None:
    """40 pipelined requests for 250-record pages (about 20 MB of answers), none read: the
    server gives up on the connection once its send buffer stayed full SEND_TIMEOUT s."""
    request = (
        f"GET {LIST}?limit=250 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {network_token}\r\n\r\n"
    ).encode()
    with connect(server.port) as sock:
        sock.sendall(request * 40)
        time.sleep(SEND_TIMEOUT + 3)  # not reading: the server's timer runs
        received, closed = read_until_closed(sock, time.monotonic() + MARGIN)
    assert closed
    # Closed before the 40 answers were written.
    assert received.count(b"HTTP/1.1 200 OK") < 40


def test_past_the_connection_cap_a_request_gets_503_with_the_error_body(
    network_db: Path, tmp_path: Path
) -> None:
    db = copy_database(network_db, tmp_path / "cap.db")
    with serve(db, "--log-format", "off", "--max-connections", "5") as capped:
        held = [connect(capped.port) for _ in range(5)]
        try:
            time.sleep(0.2)  # let the server accept them
            status, headers, body = raw_request(
                capped.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            assert status == 503
            assert headers["retry-after"] == "1"
            assert headers["connection"] == "close"
            assert "5 connections" in assert_error_body(503, body)["message"]
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, _, _ = raw_request(
                capped.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200


# --- 3. nothing crosses tenants --------------------------------------------------------------


def _import(db: Path, lines: list[bytes]) -> None:
    """`leasestar import` in its own process, as a deployment's writer runs it."""
    source = db.with_name(f"import-{time.monotonic_ns()}.ndjson")
    source.write_bytes(b"\n".join(lines) + b"\n")
    done = subprocess.run(
        [*leasestar_command(), "import", "--db", str(db), str(source)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _changed_records(db: Path, integration: str, count: int) -> list[bytes]:
    """`count` stored records of `integration`, each with a new first name."""
    exported = subprocess.run(
        [*leasestar_command(), "export", "--db", str(db)],
        capture_output=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    records = [json.loads(line) for line in exported]
    chosen = [r for r in records if r["integration_id"] == integration][:count]
    assert len(chosen) == count
    for record in chosen:
        record["first_name"] = f"Changed {time.monotonic_ns()}"
        record.pop("updated_at")  # a changed field moves it, as a real source's would
    return [json.dumps(record).encode() for record in chosen]


def test_a_scoped_tokens_view_is_unchanged_by_another_tenants_import(
    network_db: Path, tmp_path: Path
) -> None:
    """ETags, meta (totals, cursors, the sync feed's changeSeq) and 304s of a token scoped
    to integration A hold still while only integration B is written; A's own writes move
    them."""
    db = copy_database(network_db, tmp_path / "tenants.db")
    tenant_a = query_one(db, "SELECT min(integration_id) FROM applicants")
    tenant_b = query_one(db, "SELECT max(integration_id) FROM applicants")
    a_record = query_one(db, f"SELECT id FROM applicants WHERE integration_id = '{tenant_a}'")
    scoped = new_token(db, "tenant-a", tenant_a)
    everyone = new_token(db, "everyone")
    urls = [
        f"{LIST}?limit=5",
        f"{LIST}?limit=250&changed_since=0",
        f"{LIST}?limit=3&order-by=last_name",
        f"{LIST}/{a_record}",
    ]
    with (
        serve(db, "--rate-limit", "off", "--log-format", "off") as up,
        httpx.Client(base_url=up.base_url, timeout=30) as client,
    ):

        def view(token: str) -> list[tuple[int, str, bytes]]:
            answers = [
                client.get(url, headers={"Authorization": f"Bearer {token}"}) for url in urls
            ]
            return [(a.status_code, a.headers["etag"], a.content) for a in answers]

        before, everyone_before = view(scoped), view(everyone)
        assert {status for status, _, _ in before} == {200}
        _import(db, _changed_records(db, tenant_b, 5))
        after = view(scoped)
        # Byte for byte, ETags included: the import wrote, but nothing A sees.
        assert after == before
        assert [etag for _, etag, _ in view(everyone)] != [e for _, e, _ in everyone_before]
        for url, (_, etag, _) in zip(urls, before, strict=True):
            revalidated = client.get(
                url, headers={"Authorization": f"Bearer {scoped}", "If-None-Match": etag}
            )
            assert revalidated.status_code == 304, url
        # A write to A's own data moves A's validators.
        _import(db, _changed_records(db, tenant_a, 1))
        moved = client.get(
            urls[0], headers={"Authorization": f"Bearer {scoped}", "If-None-Match": before[0][1]}
        )
        assert moved.status_code == 200
        assert moved.headers["etag"] != before[0][1]


# --- 4. the smaller signals ----------------------------------------------------------------


def test_request_ids_are_random(server: Server) -> None:
    ids = [
        httpx.get(f"{server.base_url}/health", timeout=30).headers["x-request-id"]
        for _ in range(40)
    ]
    assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in ids)
    assert len(set(ids)) == len(ids)
    # No position is fixed (a per-process prefix) and none counts (a sequence): every
    # hex digit position takes several values across 40 draws.
    for position in range(32):
        assert len({value[position] for value in ids}) > 1, position


def test_a_clients_request_id_is_echoed_only_when_plain(server: Server) -> None:
    echo = httpx.get(f"{server.base_url}/health", headers={"X-Request-ID": "trace.me:1-2_3"})
    assert echo.headers["x-request-id"] == "trace.me:1-2_3"
    for bad in ("x" * 129, "has space", "semi;colon"):
        replaced = httpx.get(f"{server.base_url}/health", headers={"X-Request-ID": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"])


def test_metrics_are_not_on_the_public_listener_by_default(server: Server) -> None:
    response = httpx.get(f"{server.base_url}/metrics", timeout=30)
    assert response.status_code == 404
    assert_error_body(404, response.content)


def test_metrics_are_served_on_their_own_address_only(network_db: Path, tmp_path: Path) -> None:
    db = copy_database(network_db, tmp_path / "metrics.db")
    with serve(db, "--log-format", "off", metrics=True) as up:
        assert up.metrics_url is not None
        public = httpx.get(f"{up.base_url}/metrics", timeout=30)
        assert public.status_code == 404
        assert_error_body(404, public.content)
        scraped = httpx.get(up.metrics_url, timeout=30)
        assert scraped.status_code == 200
        assert scraped.headers["content-type"].startswith("text/plain; version=")
        assert "leasestar_applicants 300.0" in scraped.text


@pytest.mark.parametrize(
    "path",
    [
        "/schema/swagger",
        "/schema/redoc",
        "/schema/elements",
        "/schema/rapidoc",
        "/schema/scalar",
        "/schema/anything/else",
        "/schema/openapi.yaml",
        "/schema/assets/missing.js",
    ],
)
def test_every_unserved_path_under_schema_answers_the_error_body(server: Server, path: str) -> None:
    response = httpx.get(f"{server.base_url}{path}", timeout=30)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    assert_error_body(404, response.content)


def test_the_readme_states_the_allow_header_the_server_sends(server: Server) -> None:
    sent = httpx.options(f"{server.base_url}{LIST}", timeout=30).headers["allow"]
    claimed = set(re.findall(r"`Allow: ([A-Z, ]+)`", (ROOT / "README.md").read_text()))
    assert claimed == {sent}


# --- 5. what held, kept holding -------------------------------------------------------------


def server_db(server: Server) -> Path:
    """The database file a `serve` fixture runs on (the path after --db)."""
    args = server.process.args
    assert isinstance(args, list)
    return Path(str(args[args.index("--db") + 1]))


@pytest.mark.parametrize(
    "request_bytes",
    [
        # Smuggling: two lengths, a length and chunked, an obfuscated transfer coding.
        b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n",
        # Malformed heads: a bare LF in a value, a space in a name, a TLS hello.
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\nb\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHo st: x\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 64,
    ],
)
def test_hostile_framing_gets_a_clear_refusal_and_no_5xx(
    server: Server, request_bytes: bytes
) -> None:
    with connect(server.port) as sock:
        sock.sendall(request_bytes)
        received, closed = read_until_closed(sock, time.monotonic() + 30)
    assert closed, "the connection stayed open after a refusal"
    status, _, body = parse_response(received)
    assert 400 <= status < 500, received[:200]
    assert_error_body(status, body)
    # Nothing smuggled behind the refusal was answered.
    assert received.count(b"HTTP/1.1 ") == 1


def test_foreign_and_nonexistent_ids_answer_alike_over_http(
    server: Server, network_db: Path
) -> None:
    integration, foreign = (
        query_one(network_db, "SELECT min(integration_id) FROM applicants"),
        query_one(network_db, "SELECT max(integration_id) FROM applicants"),
    )
    assert integration != foreign
    foreign_id = query_one(
        network_db, f"SELECT id FROM applicants WHERE integration_id = '{foreign}' LIMIT 1"
    )
    scoped = new_token(network_db, "scoped-probe", integration)
    answers = []
    with httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {scoped}"}, timeout=30
    ) as client:
        for some_id in (foreign_id, "app_000000000000000000000000"):
            response = client.get(f"{LIST}/{some_id}")
            headers = {
                k: v for k, v in response.headers.items() if k not in ("date", "x-request-id")
            }
            answers.append((response.status_code, headers, response.content))
    assert answers[0][0] == 404
    assert answers[0] == answers[1]


def test_cursors_do_not_cross_scopes_and_cannot_be_forged_over_http(
    server: Server, network_db: Path, network_token: str
) -> None:
    integration = query_one(network_db, "SELECT min(integration_id) FROM applicants")
    scoped = new_token(network_db, "cursor-probe", integration)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        page = client.get(
            LIST, params={"limit": 1}, headers={"Authorization": f"Bearer {network_token}"}
        )
        cursor = page.json()["meta"]["next"]
        crossed = client.get(
            LIST, params={"cursor": cursor}, headers={"Authorization": f"Bearer {scoped}"}
        )
        forged = client.get(
            LIST,
            params={"cursor": cursor[:-4] + ("AAAA" if not cursor.endswith("AAAA") else "BBBB")},
            headers={"Authorization": f"Bearer {network_token}"},
        )
    for refused in (crossed, forged):
        assert refused.status_code == 400
        assert assert_error_body(400, refused.content)["details"]["parameter"] == "cursor"


def exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request and its response on an open (kept-alive) connection."""
    sock.sendall(request)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed"
        received += chunk
    status, headers, body = parse_response(received)
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed"
        body += chunk
    return status, headers, body


def test_revocation_reaches_a_kept_alive_connection(server: Server, network_db: Path) -> None:
    token = new_token(network_db, "revoked-probe")
    request = (
        f"GET {LIST}?limit=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
    ).encode()
    with connect(server.port) as sock:
        assert exchange(sock, request)[0] == 200
        connection = open_for_write(network_db)
        try:
            revoke_token(connection, "revoked-probe")
        finally:
            connection.close()
        # The same connection, kept alive, carries the next request: refused.
        status, _, body = exchange(sock, request)
    assert status == 401
    assert_error_body(401, body)
