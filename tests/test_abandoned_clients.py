"""Clients that leave (issue 29, points 2 and 4), against a real `leasestar serve` over
loopback sockets and a real SQLite file.

An NDJSON stream reads one snapshot: while it is open, no checkpoint can copy the WAL
past it. Once its client is gone (cut, stalled and closed, or a HEAD that reads no body
at all), the snapshot must end: the WAL is checkpointed whole (`PRAGMA
wal_checkpoint(PASSIVE)` returns checkpointed == log) after a write, and the server's
open files come back to what they were. A long poll, or a request waiting for its
token's turn, whose client goes must hand the turn back at once.

Every wait has a deadline; nothing asserts how fast, only that it happens well within
the time the old behaviour took (a stream's snapshot was held until the garbage
collector ran, a poll's turn until its `wait` ran out).
"""

from __future__ import annotations

import json
import os
import select
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from leasestar.applicants.pipeline import write_records
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from leasestar.token_concurrency import QUEUE
from tests.test_hardening import Server, new_token, parse_response, query_one, serve
from tests.test_open_network import rss_kib

pytestmark = pytest.mark.e2e

# Enough records that a stream (~2 KB a line) is many times what the sockets' buffers
# hold: a client that stops reading leaves the server in the middle of it.
RECORDS = 12_000
LIST = "/v1/applicants"
AT_ONCE = 2  # --token-concurrency
WAIT = 60  # a long poll's wait: far longer than any deadline below
RELEASED_WITHIN = 30.0  # seconds for the server to let go of what a client left
ANSWERED_WITHIN = 10.0  # seconds for the next request after abandoned polls
ABANDONED_STREAMS = 40
SHORT_SEND_TIMEOUT = 2  # seconds
# Files the server may hold beyond those at rest: SQLite keeps the descriptor of a closed
# connection's database file open, to reuse, while another connection of the process
# holds a lock on that file (a POSIX lock would go with it), as the read pool's do.
SPARE_FILES = 2
# RSS the server may gain over 40 abandoned streams, once a few have warmed it up: each
# holds one batch (~2 MB) and its connection's 8 MiB cache while it runs, none after.
RSS_GROWTH_KIB = 48 * 1024


def import_records(db: Path, count: int, seed: int) -> None:
    """What an import does to the database and its WAL: records committed by another
    program than the server."""
    connection = open_for_write(db)
    try:
        write_records(connection, synthetic_applicants(count, seed=seed))
    finally:
        connection.close()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("abandoned") / "leasestar.db"
    import_records(path, RECORDS, seed=29)
    return path


@pytest.fixture(scope="module")
def token(db: Path) -> str:
    return new_token(db, "leaver")


@pytest.fixture(scope="module")
def server(db: Path) -> Iterator[Server]:
    flags = ("--rate-limit", "10000/minute", "--token-concurrency", str(AT_ONCE))
    with serve(db, *flags, "--log-format", "json", "--send-timeout", "30") as running:
        yield running


def until(condition: Callable[[], bool], seconds: float = RELEASED_WITHIN) -> bool:
    """Whether `condition` holds within `seconds` (checked every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def checkpoint(db: Path) -> tuple[int, int, int]:
    """(busy, frames in the WAL, frames checkpointed) of a passive checkpoint."""
    connection = sqlite3.connect(db)
    try:
        busy, log, done = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return busy, log, done
    finally:
        connection.close()


def whole_wal_checkpointed(db: Path) -> bool:
    busy, log, done = checkpoint(db)
    return busy == 0 and log == done


seeds = iter(range(10_000, 1_000_000))


def write_some(db: Path) -> None:
    import_records(db, 50, seed=next(seeds))


def open_files(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.worker_pid}/fd"))


def stream_request(token: str, method: str = "GET") -> bytes:
    return (
        f"{method} {LIST} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        "Accept: application/x-ndjson\r\n\r\n"
    ).encode()


def receive(sock: socket.socket, at_least: int) -> bytes:
    """At least `at_least` bytes of what the server sends (bounded in time)."""
    received = b""
    deadline = time.monotonic() + RELEASED_WITHIN
    while len(received) < at_least:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(received)} bytes came in {RELEASED_WITHIN} s"
        readable, _, _ = select.select([sock], [], [], left)
        if readable:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            received += chunk
    return received


def cut_stream(server: Server, token: str, after: int = 100_000) -> None:
    """A stream whose client reads `after` bytes, then closes its socket."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(stream_request(token))
        receive(sock, after)


@pytest.fixture(scope="module")
def idle_files(server: Server, token: str) -> int:
    """The server's open files at rest, once a whole stream has been served (the read
    pool and the caches are open, as they stay)."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        whole = client.get(
            LIST, headers={"Authorization": f"Bearer {token}", "Accept": "application/x-ndjson"}
        )
    assert whole.status_code == 200
    assert whole.content.count(b"\n") == RECORDS
    return open_files(server)


def access_lines(server: Server) -> list[dict[str, object]]:
    """The access log's lines (the server's other lines are JSON too, without a method)."""
    lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    return [line for line in lines if "method" in line]


def logged_statuses(server: Server) -> list[object]:
    return [line["status"] for line in access_lines(server) if line["path"] == LIST]


def assert_released(server: Server, db: Path, idle_files: int) -> None:
    """Nothing of a stream is left: a write is checkpointed whole, the files are closed."""
    write_some(db)
    assert until(lambda: whole_wal_checkpointed(db)), checkpoint(db)
    most = idle_files + SPARE_FILES
    assert until(lambda: open_files(server) <= most), (open_files(server), most)


def test_a_cut_streams_snapshot_ends_with_it(
    server: Server, db: Path, token: str, idle_files: int
) -> None:
    cut_stream(server, token)
    assert_released(server, db, idle_files)


def test_a_stream_stalled_then_closed_releases_its_snapshot(
    server: Server, db: Path, token: str, idle_files: int
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(stream_request(token))
        receive(sock, 1)  # the stream has begun: its snapshot is taken
        # The client reads no more: while it stays, the snapshot holds the WAL (a write
        # now cannot be checkpointed past it) ...
        write_some(db)
        assert until(lambda: not whole_wal_checkpointed(db)), checkpoint(db)
    # ... and once it has gone, nothing does.
    assert_released(server, db, idle_files)


@pytest.fixture(scope="module")
def impatient_server(db: Path) -> Iterator[Server]:
    """A server that disconnects a client taking none of a response for 2 s."""
    flags = ("--rate-limit", "off", "--log-format", "off")
    with serve(db, *flags, "--send-timeout", str(SHORT_SEND_TIMEOUT)) as running:
        yield running


def test_a_stream_stalled_past_the_send_timeout_releases_its_snapshot(
    impatient_server: Server, db: Path, token: str
) -> None:
    with socket.create_connection(("127.0.0.1", impatient_server.port), timeout=30) as sock:
        sock.sendall(stream_request(token))
        receive(sock, 1)
        write_some(db)
        # The client stays connected and reads nothing: the connection layer resets it
        # after the send timeout, and the stream ends with it.
        assert until(lambda: whole_wal_checkpointed(db)), checkpoint(db)


def test_a_head_of_a_stream_reads_no_snapshot(
    server: Server, db: Path, token: str, idle_files: int
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(stream_request(token, "HEAD"))
        head = receive(sock, 1)
        while b"\r\n\r\n" not in head:
            head += receive(sock, 1)
        status, headers, body = parse_response(head)
        assert status == 200
        assert headers["content-type"] == "application/x-ndjson"
        assert body == b""
        # The connection stays open, kept alive: the HEAD holds nothing meanwhile.
        assert_released(server, db, idle_files)
    assert until(lambda: any(line["method"] == "HEAD" for line in access_lines(server)))
    (logged,) = [line for line in access_lines(server) if line["method"] == "HEAD"]
    assert logged["status"] == 200
    assert logged["bytes"] == 0  # not one record read for a body the server would drop


def test_forty_cut_streams_leave_files_memory_and_the_wal_as_they_were(
    server: Server, db: Path, token: str, idle_files: int
) -> None:
    for _ in range(3):  # the allocator's arenas grow to a stream's size once
        cut_stream(server, token)
    assert until(lambda: open_files(server) <= idle_files + SPARE_FILES)
    rss_before = rss_kib(server.worker_pid)
    for _ in range(ABANDONED_STREAMS):
        cut_stream(server, token)
    assert_released(server, db, idle_files)
    grown = rss_kib(server.worker_pid) - rss_before
    assert grown <= RSS_GROWTH_KIB, f"RSS grew {grown} KiB over {ABANDONED_STREAMS} streams"


def long_poll(server: Server, token: str, since: int) -> socket.socket:
    """A long poll of `token` (nothing is written meanwhile: it waits out `WAIT`)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(
        f"GET {LIST}?changed_since={since}&wait={WAIT}&limit=1 HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    return sock


def answered(polls: list[socket.socket]) -> socket.socket | None:
    """A poll the server has answered, if any."""
    readable, _, _ = select.select(polls, [], [], 0)
    return readable[0] if readable else None


def test_abandoned_long_polls_and_waiting_requests_give_the_token_its_turns_back(
    server: Server, db: Path
) -> None:
    token = new_token(db, "poller")
    since = int(query_one(db, "SELECT change_seq FROM sync_state"))
    # One more than the worker holds of a token: AT_ONCE in progress, QUEUE waiting.
    polls = [long_poll(server, token, since) for _ in range(AT_ONCE + QUEUE + 1)]
    try:
        # Nothing is written, so the only answer is the refusal of the one that came
        # last: then every other poll is in progress or waiting its turn.
        assert until(lambda: answered(polls) is not None)
        refused = answered(polls)
        assert refused is not None
        status, _, _ = parse_response(receive(refused, 1))
        assert status == 429
    finally:
        for sock in polls:
            sock.close()  # every client goes, long before its wait would end
    with httpx.Client(base_url=server.base_url, timeout=ANSWERED_WITHIN) as client:
        # Before: the token waited for (AT_ONCE + QUEUE) / AT_ONCE polls of WAIT seconds.
        answer = client.get(LIST, params={"limit": 1}, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    # Those left in the queue were not answered: logged as their clients closing them.
    assert until(lambda: logged_statuses(server).count(499) >= QUEUE - AT_ONCE)
