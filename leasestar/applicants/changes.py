"""Long polls of the sync feed: `changed_since=N&wait=S` holds the request until a write
lands or S seconds pass.

Waiting costs no query per waiting client. One watcher per process reads the data
version (one indexed row) every `POLL_INTERVAL` while anyone waits, and wakes every
waiter when it moves; each waiter then reads its own page once, and goes back to
waiting if the write was none of its business (another tenant's, or outside its
filters). With nobody waiting, the watcher stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Final

logger = logging.getLogger("leasestar.changes")
# How often the watcher reads the data version while requests wait: a write is seen
# within this, and the read costs ~10 us, so ten a second are nothing.
POLL_INTERVAL: Final = 0.1


class ChangeWatcher:
    """Wakes every waiting request when the data version moves; one poll for them all."""

    def __init__(
        self, read_version: Callable[[], Awaitable[int]], interval: float = POLL_INTERVAL
    ) -> None:
        self._read_version = read_version
        self._interval = interval
        self._version = -1
        self._moved = asyncio.Event()
        self._waiting = 0
        self._poller: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting now (for /metrics and tests)."""
        return self._waiting

    async def wait_past(self, version: int, deadline: float) -> int | None:
        """The data version once it is past `version`; None if the event loop's clock
        reaches `deadline` first."""
        loop = asyncio.get_running_loop()
        self._waiting += 1
        try:
            if self._poller is None or self._poller.done():
                self._version = await self._read_version()
                self._poller = asyncio.create_task(self._poll())
            while self._version <= version:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                moved = self._moved
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(moved.wait(), remaining)
            return self._version
        finally:
            self._waiting -= 1

    async def _poll(self) -> None:
        while self._waiting:
            await asyncio.sleep(self._interval)
            try:
                version = await self._read_version()
            except sqlite3.Error as error:  # the waiters time out; /health tells the rest
                logger.warning("change watcher cannot read the data version: %s", error)
                continue
            if version != self._version:
                self._version = version
                moved, self._moved = self._moved, asyncio.Event()
                moved.set()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
