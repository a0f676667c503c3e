"""A real server's `/health` and its first lists agree while the columnar copy is built.

The server is started on a database without the copy's file while this test holds the
file's lock (as another worker building it would): however long the build would take,
the server cannot finish it until the lock is released, so the window is certain on a
loaded machine. Meanwhile `/health` answers 503 saying why, and every list answers (it
does not wait for the copy: a list that did would time out here) with the total SQLite
counts. Released, the copy is built, `/health` answers 200 within a bounded wait, and
only once the file is written and current.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from leasestar.applicants import copy_file
from leasestar.applicants.copy_columns import COLUMN_TYPES, GROUPINGS
from tests.applicants.test_copy_file import seeded
from tests.servers import ROOT, START_TIMEOUT, UVICORN, children, clean_env, free_port, stop
from tests.test_hardening import new_token, serve

ROWS = 3000
BOUND = "2024-01-01T00:00:00Z"
LIST = f"/v1/applicants?limit=5&updated_at_gte={BOUND}&order-by=last_name"
WHILE_HELD = 5  # requests of each kind while the lock is held
STOP_SECONDS = 10  # a server's drain is bounded well below this; a build (or its wait) is not
RUNNING: list[subprocess.Popen[bytes]] = []  # the servers `started` runs, to stop one early


@pytest.fixture
def database(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "large.db"
    seeded(path, ROWS, seed=21)
    return path, new_token(path, "ready")


def matches(path: Path) -> int:
    """The list's total, counted here from the contract's rule."""
    from leasestar.instants import parse_instant

    with contextlib.closing(sqlite3.connect(path)) as connection:
        (count,) = connection.execute(
            "SELECT count(*) FROM applicants WHERE updated_at >= ?", (parse_instant(BOUND),)
        ).fetchone()
    return int(count)


@contextlib.contextmanager
def held(path: Path) -> Iterator[int]:
    descriptor = os.open(copy_file.lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield descriptor
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def started(path: Path, log: Path) -> Iterator[str]:
    """A server on `path`, answering (whatever `/health` says)."""
    port = free_port()
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [*UVICORN, "--port", str(port)],
            cwd=ROOT,
            env=clean_env(LEASESTAR_DB=str(path)),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    RUNNING.append(process)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            with contextlib.suppress(httpx.TransportError):
                httpx.get(f"{base}/health", timeout=2)
                break
            time.sleep(0.1)
        yield base
    finally:
        RUNNING.remove(process)
        stop(process)


def test_health_and_the_first_lists_agree_while_the_copy_is_built(
    database: tuple[Path, str], tmp_path: Path
) -> None:
    path, token = database
    expected = matches(path)
    headers = {"Authorization": f"Bearer {token}"}
    with (
        held(path) as lock,
        started(path, tmp_path / "server.log") as base,
        httpx.Client(base_url=base, timeout=30) as http,
    ):
        for _ in range(WHILE_HELD):
            health = http.get("/health")
            assert health.status_code == 503
            error = health.json()["error"]
            assert error["code"] == "service_unavailable"
            assert error["message"].startswith("not ready: the columnar copy")
            page = http.get(LIST, headers=headers)
            assert page.status_code == 200
            assert page.json()["meta"]["total"] == expected
        assert not copy_file.path_of(path).exists()
        fcntl.flock(lock, fcntl.LOCK_UN)
        deadline = time.monotonic() + START_TIMEOUT
        while (health := http.get("/health")).status_code != 200:
            assert health.status_code == 503, health.text
            assert time.monotonic() < deadline, "not ready in time"
            page = http.get(LIST, headers=headers)
            assert (page.status_code, page.json()["meta"]["total"]) == (200, expected)
            time.sleep(0.05)
        assert health.json() == {"status": "ok"}
        # Ready only once the file holds the database at its version.
        mapped = copy_file.load(path, COLUMN_TYPES, GROUPINGS)
        with contextlib.closing(sqlite3.connect(path)) as connection:
            (version,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
        assert mapped.description.identity.change_seq == version
        page = http.get(LIST, headers=headers)
        assert (page.status_code, page.json()["meta"]["total"]) == (200, expected)


def test_two_workers_build_the_copy_once_and_map_the_same_file(
    database: tuple[Path, str],
) -> None:
    """`--workers 2` on a database without the copy's file: one worker builds it (one
    line), the other waits for its lock and maps what it wrote; both map that file."""
    path, _ = database
    with serve(path, "--workers", "2", "--rate-limit", "off") as server:
        columns = copy_file.path_of(path)
        deadline = time.monotonic() + START_TIMEOUT
        # (uvicorn's supervisor also starts a process of multiprocessing's own.)
        while len(mapped := mappings(children(server.process.pid), columns)) < 2:
            assert time.monotonic() < deadline, mapped
            httpx.get(f"{server.base_url}/health", timeout=5)
            time.sleep(0.1)
        assert list(mapped.values()) == [columns.stat().st_ino] * 2
        assert server.log().count("columnar copy: building") == 1


def mappings(pids: list[int], file: Path) -> dict[int, int]:
    """pid -> the inode of `file` as that process maps it, for those that map it."""
    found = {}
    for pid in pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5] == str(file.resolve()):
                found[pid] = int(fields[4])
    return found


def test_a_server_stopped_while_waiting_for_the_copy_stops_at_once(
    database: tuple[Path, str], tmp_path: Path
) -> None:
    """SIGTERM while the copy is being built (here: waited for, the lock held): the
    server shuts down at once, not when a build that can take a minute is done."""
    path, _ = database
    log = tmp_path / "server.log"
    with held(path), started(path, log) as base:
        assert httpx.get(f"{base}/health", timeout=5).status_code == 503
        (process,) = [p for p in RUNNING if p.poll() is None]
        process.terminate()
        process.wait(timeout=STOP_SECONDS)  # (uvicorn ends by raising the signal again)
        assert "Application shutdown complete" in log.read_text()
