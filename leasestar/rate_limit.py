"""One rate limit per token for the whole server, however many worker processes it runs.

Litestar's `RateLimitMiddleware` keeps each client's history in a `Store`: it reads the
history, decides, and writes it back. Under `--workers N` every process has its own
memory store, so a token got N times its budget; and no `Store` can fix that, because a
read followed by a write is not atomic across processes (Litestar's lock is per
process, and `FileStore` replaces a file per write: two workers that read the same count
both write count + 1, and one request goes uncounted). The history is also a list of
every request's timestamp in the window, decoded and re-encoded on each request, which
grows with the budget (at 600 it costs more than the page read it guards).

So the count lives in a small SQLite file beside the database (`<db>-ratelimit`), one
row per token: (requests in the window, when the window ends). A request is counted
by one atomic `INSERT ... ON CONFLICT DO UPDATE ... RETURNING`, which opens a new window,
adds the request, or (past the budget) leaves the count as it is, and answers the
count and the window's end. WAL and `synchronous = OFF` make that a few microseconds
and a few system calls: the file holds nothing that must survive a power cut (a lost
window at worst hands out one fresh budget). Two workers meet on the write lock only
for the microseconds of one statement, so a busy file is tried again at once rather
than through SQLite's busy handler, whose first pause (1 ms) would stall the event loop.
Windows survive a restart of the server, and servers sharing a database share budgets.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from litestar.datastructures import MutableScopeHeaders
from litestar.exceptions import TooManyRequestsException
from litestar.middleware.rate_limit import DURATION_VALUES, RateLimitMiddleware
from litestar.types import Message, Receive, Scope, Send

from leasestar.database import BUSY_TIMEOUT_MS, DatabaseError

# How long a request waits for another worker's increment before it gives up (a 500
# with the cause in the log): far beyond the microseconds one takes.
_BUSY_GIVE_UP_SECONDS: Final = 5.0
# Tries on the event loop before pausing: each waits for one statement of another worker.
_IMMEDIATE_TRIES: Final = 100
_PAUSE_SECONDS: Final = 0.0005

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS windows (
    key       TEXT    PRIMARY KEY,
    count     INTEGER NOT NULL,  -- requests counted in the window, at most budget + 1
    resets_at INTEGER NOT NULL   -- when the window ends, in Unix seconds
) WITHOUT ROWID
"""
# The whole decision in one statement, so no other worker comes between the read and
# the write. Past the budget the count stays at budget + 1: a refused request is not
# counted and does not move the window's end (as Litestar's limiter behaves).
_COUNT_REQUEST: Final = """
INSERT INTO windows (key, count, resets_at) VALUES (:key, 1, :now + :seconds)
ON CONFLICT (key) DO UPDATE SET
    count = CASE WHEN resets_at <= :now THEN 1 ELSE min(count + 1, :budget + 1) END,
    resets_at = CASE WHEN resets_at <= :now THEN :now + :seconds ELSE resets_at END
RETURNING count, resets_at
"""


def counter_path(db_path: Path) -> Path:
    """The rate-limit file of a database: beside it, named after it."""
    return db_path.with_name(db_path.name + "-ratelimit")


@dataclass(frozen=True, slots=True)
class Window:
    """A token's window after counting one request."""

    count: int  # requests in the window, this one included; budget + 1 when refused
    resets_at: int  # Unix seconds


class WindowCounter:
    """The rate-limit file: counts requests per key, atomically across processes."""

    def __init__(self, path: Path) -> None:
        # The file is created with SQLite's busy handler on, since every worker starts at
        # once and creating it takes the lock for longer than one count does.
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as error:
            raise DatabaseError(f"cannot use the rate-limit file {path}: {error}") from None
        try:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = OFF")
            self._db.execute(_SCHEMA)
            self._db.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as error:
            self._db.close()
            raise DatabaseError(f"cannot use the rate-limit file {path}: {error}") from None

    def close(self) -> None:
        self._db.close()

    def _try_count(self, key: str, budget: int, seconds: int) -> Window | None:
        """Count a request; None when another worker holds the file this instant."""
        parameters = {"key": key, "now": int(time.time()), "seconds": seconds, "budget": budget}
        try:
            count, resets_at = self._db.execute(_COUNT_REQUEST, parameters).fetchone()
        except sqlite3.OperationalError as error:
            if getattr(error, "sqlite_errorcode", -1) & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            return None
        return Window(count, resets_at)

    async def count(self, key: str, budget: int, seconds: int) -> Window:
        """Count one request of `key` in a window of `seconds` holding `budget` requests."""
        give_up = time.monotonic() + _BUSY_GIVE_UP_SECONDS
        tries = 0
        while (window := self._try_count(key, budget, seconds)) is None:
            tries += 1
            if time.monotonic() > give_up:
                raise sqlite3.OperationalError("the rate-limit file stayed locked")
            if tries < _IMMEDIATE_TRIES:
                os.sched_yield()  # the holder may be waiting for this core
            else:
                await asyncio.sleep(_PAUSE_SECONDS)
        return window


class SharedRateLimitMiddleware(RateLimitMiddleware):
    """Litestar's rate limiter (its configuration, keys and headers), counting in the
    server's `WindowCounter` (`app.state.rate_limit_counter`) instead of a store."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = scope["litestar_app"]
        counter: WindowCounter = app.state.rate_limit_counter
        key = self.cache_key_from_request(app.request_class(scope))
        window = await counter.count(key, self.max_requests, DURATION_VALUES[self.unit])
        headers = self.window_headers(window)
        if window.count > self.max_requests:
            raise TooManyRequestsException(headers=headers)
        await self.app(scope, receive, self._sending_headers(send, headers))

    def window_headers(self, window: Window) -> dict[str, str]:
        """The four rate-limit headers, as Litestar's limiter writes them."""
        config = self.config
        return {
            config.rate_limit_policy_header_key: (
                f"{self.max_requests}; w={DURATION_VALUES[self.unit]}"
            ),
            config.rate_limit_limit_header_key: str(self.max_requests),
            config.rate_limit_remaining_header_key: str(max(self.max_requests - window.count, 0)),
            config.rate_limit_reset_header_key: str(max(window.resets_at - int(time.time()), 0)),
        }

    @staticmethod
    def _sending_headers(send: Send, headers: dict[str, str]) -> Send:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                response_headers = MutableScopeHeaders(message)
                for name, value in headers.items():
                    response_headers[name] = value
            await send(message)

        return send_with_headers
