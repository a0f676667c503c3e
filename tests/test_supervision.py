"""The parent of a `--workers 1` server (leasestar/supervision.py), against a real
`leasestar serve`: it serves through one forked worker and only waits for it.

A worker killed by a signal is named in one line and replaced; SIGTERM and SIGINT to
the parent drain the worker and exit 0; a `kill -9` of the parent takes the worker with
it (no orphan left answering on the port).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import children
from tests.test_file_faults import lines_saying, total
from tests.test_hardening import copy_database, new_token, query_one, serve

GONE_WITHIN = 30.0  # seconds, on a loaded machine


@pytest.fixture
def db(seeded_template: Path, tmp_path: Path) -> Path:
    return copy_database(seeded_template, tmp_path / "leasestar.db")


@pytest.fixture
def token(db: Path) -> str:
    return new_token(db, "supervision")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def spawned_workers(pid: int) -> set[int]:
    """The workers uvicorn's supervisor `pid` spawned (not multiprocessing's resource
    tracker, also its child)."""
    found = set()
    for child in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(child)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + GONE_WITHIN
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.05)


def test_a_worker_killed_by_a_signal_is_named_and_replaced(db: Path, token: str) -> None:
    """As the kernel's out-of-memory killer would: SIGKILL to the worker."""
    rows = query_one(db, "SELECT count(*) FROM applicants")
    with serve(db, "--rate-limit", "off", "--log-format", "json") as server:
        first = server.worker_pid
        assert first != server.process.pid
        os.kill(first, signal.SIGKILL)
        wait_gone(first)
        deadline = time.monotonic() + GONE_WITHIN
        answered = None
        while answered is None:
            assert time.monotonic() < deadline, server.log()
            try:
                answered = total(server, token)
            except httpx.TransportError:  # the new worker not yet listening
                time.sleep(0.1)
        assert answered == rows
        assert server.worker_pid != first
        assert server.process.poll() is None
        assert lines_saying(server, "was killed by", 1) == [
            f"worker process [{first}] was killed by SIGKILL (by the system's out-of-memory "
            "killer, or by its supervisor when it stopped answering the supervisor's health "
            "check); starting another"
        ]


def test_a_worker_of_several_killed_by_a_signal_is_named_once_and_replaced(
    db: Path, token: str
) -> None:
    """Under uvicorn's supervisor (`--workers 2`): the worker killed is named once, by
    its pid and signal, and another takes its place."""
    rows = query_one(db, "SELECT count(*) FROM applicants")
    with serve(db, "--rate-limit", "off", "--log-format", "json", "--workers", "2") as server:
        assert total(server, token) == rows
        first, _ = sorted(spawned_workers(server.process.pid))
        os.kill(first, signal.SIGKILL)
        wait_gone(first)
        deadline = time.monotonic() + GONE_WITHIN
        serving = spawned_workers(server.process.pid)
        while first in serving or len(serving) < 2:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
            serving = spawned_workers(server.process.pid)
        assert total(server, token) == rows
        lines = lines_saying(server, "was killed by", 1)
        assert lines == [
            f"worker process [{first}] was killed by SIGKILL (by the system's out-of-memory "
            "killer, or by its supervisor when it stopped answering the supervisor's health "
            "check); starting another"
        ]
        time.sleep(1.5)  # three more passes of the supervisor: still named once
        assert len(lines_saying(server, "was killed by")) == 1


def test_a_worker_that_stops_answering_its_supervisor_is_killed_named_and_replaced(
    db: Path, token: str
) -> None:
    """A worker that no longer answers uvicorn's health check (stopped here with SIGSTOP,
    as a worker stuck holding the interpreter would be) is killed by the supervisor after
    its timeout and replaced: named once, by its pid and SIGKILL. (Named from a check
    before uvicorn's pass, it was not: it was alive then.)"""
    rows = query_one(db, "SELECT count(*) FROM applicants")
    with serve(db, "--rate-limit", "off", "--log-format", "json", "--workers", "2") as server:
        assert total(server, token) == rows
        stuck, _ = sorted(spawned_workers(server.process.pid))
        os.kill(stuck, signal.SIGSTOP)
        lines = lines_saying(server, "was killed by", 1)
        assert lines == [
            f"worker process [{stuck}] was killed by SIGKILL (by the system's out-of-memory "
            "killer, or by its supervisor when it stopped answering the supervisor's health "
            "check); starting another"
        ], server.log()
        wait_gone(stuck)
        assert total(server, token) == rows


@pytest.mark.parametrize("stop_with", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_parent_drains_the_worker_and_exits_0(
    db: Path, token: str, stop_with: signal.Signals
) -> None:
    with serve(db, "--rate-limit", "off", "--log-format", "json") as server:
        worker = server.worker_pid
        assert total(server, token) == query_one(db, "SELECT count(*) FROM applicants")
        server.process.send_signal(stop_with)
        assert server.process.wait(timeout=GONE_WITHIN) == 0
        wait_gone(worker)
        assert lines_saying(server, "was killed by") == []
        assert "Finished server process" in server.log()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_killed_parent_takes_its_workers_with_it(db: Path, token: str, workers: str) -> None:
    """A fork, or a worker uvicorn's supervisor spawned: none outlives a `kill -9` of the
    server to go on answering on its port."""
    with serve(db, "--rate-limit", "off", "--log-format", "off", "--workers", workers) as server:
        assert total(server, token) == query_one(db, "SELECT count(*) FROM applicants")
        below = children(server.process.pid)  # (and multiprocessing's resource tracker)
        assert len(below) >= int(workers)
        server.process.send_signal(signal.SIGKILL)
        assert server.process.wait(timeout=GONE_WITHIN) == -signal.SIGKILL
        for pid in below:
            wait_gone(pid)  # the kernel's PR_SET_PDEATHSIG
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.base_url}/health", timeout=5)
