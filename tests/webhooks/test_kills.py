"""Nothing lost, nothing invented (issue 28, point 3): the import and the server killed
with SIGKILL at seeded random moments, restarted, then every committed change is found
delivered at least once and nothing else is."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from leasestar.database import open_for_write
from leasestar.webhooks.subscriptions import create_subscription
from tests.applicants.lines import source
from tests.servers import free_port
from tests.test_hardening import ROOT, leasestar_command
from tests.webhooks.receiver import Receiver, receiving
from tests.webhooks.test_delivery import env

ROUNDS = 6
RECORDS_PER_ROUND = 400
SEED = 28


def start_server(path: Path, workers: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("ab") as err:
        process = subprocess.Popen(
            [*leasestar_command(), "serve", "--db", str(path), "--port", str(port),
             "--workers", str(workers), "--log-format", "off"],
            cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,  # its workers die with it: killpg
        )  # fmt: skip
    return process, f"http://127.0.0.1:{port}"


def wait_healthy(base_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"the server did not start: {log.read_text()[-2000:]}")


def kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def write_round(directory: Path, number: int) -> Path:
    path = directory / f"round-{number}.ndjson"
    with path.open("w") as out:
        for index in range(RECORDS_PER_ROUND):
            record = source(number * RECORDS_PER_ROUND + index, first_name=f"R{number}")
            out.write(json.dumps(record) + "\n")
    return path


def committed(path: Path) -> dict[int, str]:
    """change_seq -> applicant id of every row written (each record is written once)."""
    with sqlite3.connect(path) as connection:
        return dict(connection.execute("SELECT change_seq, id FROM applicants"))


def test_kills_at_random_moments_lose_and_invent_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    path = tmp_path / "leasestar.db"
    log = tmp_path / "serve.log"
    open_for_write(path).close()
    with receiving() as receiver:
        connection = open_for_write(path)
        try:
            create_subscription(connection, receiver.url, signing="propexo")
        finally:
            connection.close()
        for number in range(ROUNDS):
            server, base_url = start_server(path, workers=1 + number % 2, log=log)
            wait_healthy(base_url, server, log)
            importing = subprocess.Popen(
                [*leasestar_command(), "import", "--db", str(path),
                 str(write_round(tmp_path, number))],
                cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            # Seeded moments: the import killed (or let finish), then the server.
            import_kill = rng.choice([None, rng.uniform(0.0, 1.2)])
            try:
                importing.wait(timeout=import_kill if import_kill is not None else 120)
            except subprocess.TimeoutExpired:
                importing.send_signal(signal.SIGKILL)
                importing.wait(timeout=30)
            time.sleep(rng.uniform(0.0, 1.0))
            kill_group(server)
        server, base_url = start_server(path, workers=2, log=log)
        try:
            wait_healthy(base_url, server, log)
            expected = committed(path)
            assert expected, "no import committed: the kill points leave nothing to check"
            receiver.wait_for(
                lambda events: {event["change_seq"] for event in events} >= expected.keys(),
                "every committed change delivered",
            )
        finally:
            kill_group(server)
    assert_delivered_exactly_the_committed(receiver, expected)


def assert_delivered_exactly_the_committed(receiver: Receiver, expected: dict[int, str]) -> None:
    by_event: dict[str, dict[str, Any]] = {}
    for event in receiver.events():
        # A duplicate (sent again after a kill) is the same event: same id, same body.
        assert by_event.setdefault(event["event_id"], event) == event
    delivered = {event["change_seq"]: event["record_id"] for event in by_event.values()}
    missing = sorted(expected.keys() - delivered.keys())
    invented = sorted(delivered.keys() - expected.keys())
    assert (missing[:5], invented[:5]) == ([], []), (len(missing), len(invented))
    assert delivered == expected  # all of them, and nothing that never committed
    assert len(by_event) == len(expected)  # one event id per change
