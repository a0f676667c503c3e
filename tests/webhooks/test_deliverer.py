"""The deliverer inside one process, against real SQLite files and a loopback receiver."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from leasestar.database import open_for_write
from leasestar.webhooks.connection import refused
from leasestar.webhooks.deliverer import (
    Deliverer,
    _try_lock,
    lock_path,
    run_deliverer,
)
from leasestar.webhooks.retries import RetryPolicy
from tests.applicants.lines import source
from tests.webhooks.receiver import WAIT_SECONDS, receiving
from tests.webhooks.test_delivery import import_records, subscribe


async def test_a_database_error_never_stops_delivery_nor_its_shutdown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEASESTAR_WEBHOOK_ALLOW_PRIVATE", "on")  # the receiver is on loopback
    path = tmp_path / "leasestar.db"
    path.touch()  # an empty database: reading the subscriptions fails (no such table)
    deliverer = Deliverer(path, RetryPolicy(first_delay=0.05, timeout=30))
    with caplog.at_level(logging.ERROR, "leasestar.webhooks"), receiving() as receiver:
        delivering = asyncio.create_task(run_deliverer(deliverer))
        deadline = time.monotonic() + WAIT_SECONDS
        while not any("delivery stopped" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the error was not logged"
            await asyncio.sleep(0.05)
        assert not delivering.done()
        # The database becomes readable: the same task delivers, with no restart.
        subscribe(path, receiver.url)
        import_records(path, source(1))
        await asyncio.to_thread(receiver.wait_for_count, 1)
        delivering.cancel()
        await delivering  # never raises the earlier error
    assert [event["data"]["x_id"] for event in receiver.events()] == ["X0001"]


@pytest.mark.parametrize(
    ("address", "off_limits"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("169.254.169.254", True),  # cloud metadata
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("fd00::1", True),  # ULA
        ("fe80::1%eth0", True),
        ("224.0.0.1", True),
        ("0.0.0.0", True),
        ("::ffff:127.0.0.1", True),  # loopback, mapped into IPv6
        ("100.100.100.200", True),  # carrier-grade NAT: a cloud's metadata service
        ("100.64.0.1", True),
        ("2002:a9fe:a9fe::1", True),  # 169.254.169.254 inside 6to4
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", True),  # Teredo, a documentation address
        ("2002:5db8:d70e::1", False),  # 93.184.215.14 inside 6to4
        ("93.184.215.14", False),
        ("2606:4700::1111", False),
    ],
)
def test_which_receiver_addresses_are_off_limits(address: str, off_limits: bool) -> None:
    assert refused(address) is off_limits


async def test_a_deliverer_cancelled_while_taking_the_lock_leaves_it_free(
    tmp_path: Path,
) -> None:
    path = tmp_path / "leasestar.db"
    open_for_write(path).close()
    delivering = asyncio.create_task(run_deliverer(Deliverer(path, RetryPolicy())))
    await asyncio.sleep(0)  # started: its lock attempt is on a thread
    delivering.cancel()
    await delivering
    deadline = time.monotonic() + WAIT_SECONDS
    while (descriptor := _try_lock(lock_path(path))) is None:
        assert time.monotonic() < deadline, "the cancelled deliverer kept the lock"
        await asyncio.sleep(0.05)
    os.close(descriptor)
