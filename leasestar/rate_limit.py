"""One rate limit per token for the whole server, however many worker processes it runs.

Litestar's `RateLimitMiddleware` keeps each client's history in a `Store`: it reads the
history, decides, and writes it back. Under `--workers N` every process has its own
memory store, so a token got N times its budget; and no `Store` can fix that, because a
read followed by a write is not atomic across processes (Litestar's lock is per
process, and `FileStore` replaces a file per write: two workers that read the same count
both write count + 1, and one request goes uncounted). The history is also a list of
every request's timestamp in the window, decoded and re-encoded on each request, which
grows with the budget.

So every worker counts in one small file beside the database, `<db>-ratelimit`, mapped
into memory: a table of 4,096 slots, each (the key's digest, requests in the window,
when the window ends). A request takes the file's lock (`flock`), finds its key's slot,
opens a new window or adds itself (past the budget the count stays at budget + 1: a
refused request is not counted and does not move the window's end, as with Litestar),
and lets go: two system calls and a few bytes, about 5 us. A table in SQLite did the
same with one `INSERT ... ON CONFLICT ... RETURNING` in 15-50 us (its locks and WAL
write), which cost get by id more than the 5 % this may take (benchmarks/RESULTS.md).
The lock is the kernel's, so a worker that dies holding it releases it.

Windows survive a restart of the server, and servers sharing a database share budgets.
A slot whose window has ended is free for another key, so 4,096 tokens can have a
window open at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from litestar.exceptions import TooManyRequestsException
from litestar.middleware.rate_limit import DURATION_VALUES, RateLimitConfig, RateLimitMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from leasestar.database import DatabaseError

_MAGIC: Final = b"leasestar rate limit v1\n"
_SLOTS: Final = 4096
_SLOT: Final = struct.Struct("<16sqq")  # key digest, count, window end (Unix seconds)
_WINDOW: Final = struct.Struct("<qq")
_FREE: Final = bytes(16)
_TABLE_AT: Final = len(_MAGIC)
_SIZE: Final = _TABLE_AT + _SLOTS * _SLOT.size
_KEYS_KEPT: Final = 4096  # callers whose key is remembered (tokens x routes)


def counter_path(db_path: Path) -> Path:
    """The rate-limit file of a database: beside it, named after it."""
    return db_path.with_name(db_path.name + "-ratelimit")


@dataclass(frozen=True, slots=True)
class Window:
    """A key's window after counting one request."""

    count: int  # requests in the window, this one included; budget + 1 when refused
    resets_at: int  # Unix seconds


class CounterFull(Exception):
    """Every slot holds a window still open: no room for another key."""


class WindowCounter:
    """The rate-limit file: counts requests per key, atomically across processes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise DatabaseError(
                f"cannot use the rate-limit file {path}: {error.strerror}"
            ) from None
        try:
            self._prepare()
            self._map = mmap.mmap(self._fd, _SIZE)
        except BaseException:
            os.close(self._fd)
            raise
        self._slots: dict[str, tuple[bytes, int]] = {}  # key -> (digest, slot offset)

    def _prepare(self) -> None:
        """Give a new file its table, under the lock (every worker starts at once)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(self._fd).st_size
            if size == 0:
                os.ftruncate(self._fd, _SIZE)
                os.pwrite(self._fd, _MAGIC, 0)
            elif size != _SIZE or os.pread(self._fd, len(_MAGIC), 0) != _MAGIC:
                raise DatabaseError(
                    f"{self._path} is not a leasestar rate-limit file: move it away "
                    "(it holds only counts of open windows)"
                )
        except OSError as error:
            raise DatabaseError(
                f"cannot use the rate-limit file {self._path}: {error.strerror}"
            ) from None
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    def count(self, key: str, budget: int, seconds: int) -> Window:
        """Count one request of `key` in a window of `seconds` holding `budget` requests."""
        now = int(time.time())
        known = self._slots.get(key)
        digest = known[0] if known else hashlib.blake2b(key.encode(), digest_size=16).digest()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            # Another key may have taken the slot over once this key's window ended.
            if known is None or self._map[known[1] : known[1] + 16] != digest:
                known = (digest, self._find(digest, now))
                self._slots[key] = known
            at = known[1] + 16
            count, resets_at = _WINDOW.unpack_from(self._map, at)
            if resets_at <= now:
                count, resets_at = 1, now + seconds
            else:
                count = min(count + 1, budget + 1)
            _WINDOW.pack_into(self._map, at, count, resets_at)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return Window(count, resets_at)

    def _find(self, digest: bytes, now: int) -> int:
        """The offset of `digest`'s slot, claiming one if it has none (the lock is held).

        Linear probing from the digest's home slot, up to the first never-used slot; a
        slot whose window has ended is taken over (its count no longer matters), so
        chains never break and the table never fills with old tokens.
        """
        home = int.from_bytes(digest[:8], "little") % _SLOTS
        reusable = None
        for step in range(_SLOTS):
            offset = _TABLE_AT + (home + step) % _SLOTS * _SLOT.size
            slot_digest, _, resets_at = _SLOT.unpack_from(self._map, offset)
            if slot_digest == digest:
                return offset
            if slot_digest == _FREE:  # never used: the digest is not further on
                reusable = offset if reusable is None else reusable
                break
            if reusable is None and resets_at <= now:
                reusable = offset
        if reusable is None:
            raise CounterFull(f"{self._path}: {_SLOTS} windows are open at once")
        _SLOT.pack_into(self._map, reusable, digest, 0, 0)
        return reusable


class SharedRateLimitMiddleware(RateLimitMiddleware):
    """Litestar's rate limiter (its configuration, keys and headers), counting in the
    server's `WindowCounter` (`app.state.rate_limit_counter`) instead of a store.

    It runs on every API request, so what does not change between requests is made once:
    a caller's key (per authenticated user and route; Litestar builds a Request to find
    it) and the two constant headers, already encoded.
    """

    def __init__(self, app: ASGIApp, config: RateLimitConfig) -> None:
        super().__init__(app, config)
        self._seconds = DURATION_VALUES[self.unit]
        self._keys: dict[tuple[Any, Any], str] = {}
        self._constant_headers = [
            (
                config.rate_limit_policy_header_key.encode("latin-1"),
                f"{self.max_requests}; w={self._seconds}".encode("latin-1"),
            ),
            (
                config.rate_limit_limit_header_key.encode("latin-1"),
                str(self.max_requests).encode("latin-1"),
            ),
        ]
        self._remaining_header = config.rate_limit_remaining_header_key.encode("latin-1")
        self._reset_header = config.rate_limit_reset_header_key.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        counter: WindowCounter = scope["litestar_app"].state.rate_limit_counter
        window = counter.count(self._key(scope), self.max_requests, self._seconds)
        if window.count > self.max_requests:
            raise TooManyRequestsException(headers=self.window_headers(window))
        await self.app(scope, receive, self._sending_headers(send, window))

    def _key(self, scope: Scope) -> str:
        """Litestar's key for this caller (the token) and route, made once for each."""
        caller = (scope.get("user"), scope["route_handler"])
        key = self._keys.get(caller)
        if key is None:
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            request = scope["litestar_app"].request_class(scope)
            key = self._keys[caller] = self.cache_key_from_request(request)
        return key

    def window_headers(self, window: Window) -> dict[str, str]:
        """The four rate-limit headers, as Litestar's limiter writes them."""
        return {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in self._constant_headers + self._varying_headers(window)
        }

    def _varying_headers(self, window: Window) -> list[tuple[bytes, bytes]]:
        remaining = max(self.max_requests - window.count, 0)
        reset = max(window.resets_at - int(time.time()), 0)
        return [
            (self._remaining_header, str(remaining).encode("latin-1")),
            (self._reset_header, str(reset).encode("latin-1")),
        ]

    def _sending_headers(self, send: Send, window: Window) -> Send:
        # Appended as they are: no route sets these headers itself, so there is nothing
        # to replace (Litestar's MutableScopeHeaders searches the list for each).
        added = self._constant_headers + self._varying_headers(window)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *added]
            await send(message)

        return send_with_headers
