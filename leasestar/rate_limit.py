"""One rate limit per token for the whole server, however many worker processes it runs.

Litestar's `RateLimitMiddleware` keeps each client's history in a `Store`: it reads the
history, decides, and writes it back. Under `--workers N` every process has its own
memory store, so a token got N times its budget; and no `Store` can fix that, because a
read followed by a write is not atomic across processes (Litestar's lock is per
process, and `FileStore` replaces a file per write: two workers that read the same count
both write count + 1, and one request goes uncounted). The history is also a list of
every request's timestamp in the window, decoded and re-encoded on each request, which
grows with the budget.

So every worker counts in one small file beside the database, `<db>-ratelimit`: a
table of 4,096 slots, each (the key's digest, requests in the window, when the window
ends). A request takes the file's lock (`flock`), reads its key's slot, opens a new
window or adds itself (past the budget the count stays at the budget: a refused request
is not counted and does not move the window's end, as with Litestar), writes the slot's
two numbers back and lets go: four system calls and a few bytes, a few microseconds. A
table in SQLite did the same with one `INSERT ... ON CONFLICT ... RETURNING` in 15-50 us
(its locks and WAL write), which cost get by id more than the 5 % this may take
(benchmarks/RESULTS.md). The lock is the kernel's, so a worker that dies holding it
releases it.

The file is read and written with `pread`/`pwrite`, never mapped into memory: a mapped
file that another program cuts short (`truncate`, or `chattr +i` on a page about to be
written) kills the process with SIGBUS at the next touch of a lost page, with nothing
logged, and no check made before the touch can close that race. A system call on a cut
file only reads short or fails, which the counter notices and answers (`_check`):

- cut or overwritten: it is cleared under the lock and counting goes on in it (every
  token's window starts again), one line logged by the worker that cleared it (a new
  file is made whole under another name and linked to the path, so a short file at
  the path was always cut, even when a worker starting late is the first to see it);
- deleted, or another file moved in its place: the workers notice within a second
  (its link count, or the path's inode) and count in the file now at the path, creating
  it if none is, so servers sharing the database share one budget again; one line,
  logged by the worker that created it;
- not writable (`chattr +i`, a read-only file system) or not openable (a directory):
  the worker counts in its own memory (a budget per worker process), one line, and goes
  back to the file, one more line, once it can be used again.

A worker takes a large budget's requests from the file a few at a time (a lease: one
per 256 of the budget, at most 16), and counts the rest of a lease in its own memory,
without the lock: the file is locked once every few requests. A lease is spent only in
its own window. So a token may be refused while another worker still holds a part of a
lease: at most (workers - 1) x 15 requests short of the budget, under 0.4 % of it per
worker; a budget under 512 is counted one request at a time, exactly.

Windows survive a restart of the server, and servers sharing a database share budgets.
A slot whose window has ended is free for another key, so 4,096 tokens can have a
window open at once.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import math
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from litestar.exceptions import ImproperlyConfiguredException, TooManyRequestsException
from litestar.middleware.rate_limit import DURATION_VALUES, RateLimitConfig, RateLimitMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from leasestar.asgi import RESPONSE_HEADERS
from leasestar.database import DatabaseError
from leasestar.disconnect import ClientGone, unless_gone
from leasestar.token_concurrency import QUEUE, TokenConcurrency

logger = logging.getLogger("leasestar.rate_limit")

_MAGIC: Final = b"leasestar rate limit v1\n"
_SLOTS: Final = 4096
# A slot: the key's digest, its count, its window's end (Unix seconds). In the machine's
# byte order: the file never leaves the machine of its database.
_SLOT: Final = struct.Struct("=16sqq")
_WINDOW: Final = struct.Struct("=qq")  # a slot's count and window end, written at once
_NUMBER: Final = struct.Struct("=q")
_FREE: Final = bytes(16)
_TABLE_AT: Final = len(_MAGIC)
assert (_TABLE_AT + 16) % 8 == 0  # every count and window end 8-byte aligned
assert _SLOT.size % 8 == 0
_SIZE: Final = _TABLE_AT + _SLOTS * _SLOT.size
_KEYS_KEPT: Final = 4096  # keys whose digest, slot and lease are remembered
_LEASE_PER_BUDGET: Final = 256  # a lease of one request per this much of the budget
_LEASE_MOST: Final = 16
_FOREIGN: Final = "is not a leasestar rate-limit file"
_OPEN_TRIES: Final = 3  # a file made and deleted by others between our tries, at most


def counter_path(db_path: Path) -> Path:
    """The rate-limit file of a database: beside it, named after it."""
    return db_path.with_name(db_path.name + "-ratelimit")


Window = tuple[int, int]
"""A key's window after counting one request: (requests in it, this one included, or
budget + 1 when refused, other workers' unspent leases counted as spent: the budget they
leave to this worker; seconds until it ends). A plain tuple: it is made on every request,
and a NamedTuple's constructor is a Python call (0.4 us, a tenth of the limiter's work)."""


class _Lease:
    """Requests of a key this worker took from the file and has not spent yet."""

    __slots__ = ("count_at", "left", "resets_at", "told")

    def __init__(self, left: int, resets_at: int, count_at: int, told: int) -> None:
        self.left = left
        self.resets_at = resets_at  # the window it was taken in, and is spent in only
        # Where the key's count is in the file (its slot is the key's while the window
        # lasts), and the count this worker last answered with.
        self.count_at = count_at
        self.told = told


class CounterFull(Exception):
    """Every slot holds a window still open: no room for another key."""


class _Unusable(Exception):
    """The file read or wrote short: cut, or overwritten, under the counter."""


def _probe(table: bytes, digest: bytes, now: int) -> tuple[int | None, int | None]:
    """(`digest`'s slot, the first slot it could claim) in the file's `table` (its bytes
    after the magic), each a file offset or None.

    Linear probing from the digest's home slot, up to the first never-used slot; a
    slot whose window has ended is taken over (its count no longer matters), so
    chains never break and the table never fills with old tokens.
    """
    home = int.from_bytes(digest[:8], "little") % _SLOTS
    reusable = None
    for step in range(_SLOTS):
        at = (home + step) % _SLOTS * _SLOT.size
        slot_digest, _, resets_at = _SLOT.unpack_from(table, at)
        if slot_digest == digest:
            return _TABLE_AT + at, reusable
        if slot_digest == _FREE:  # never used: the digest is not further on
            return None, _TABLE_AT + at if reusable is None else reusable
        if reusable is None and resets_at <= now:
            reusable = _TABLE_AT + at
    return None, reusable


def _write_empty_table(fd: int) -> None:
    """Give an empty file the counter's magic and 4,096 free slots (zeros)."""
    os.ftruncate(fd, _SIZE)
    os.pwrite(fd, _MAGIC, 0)


def _make_whole(fd: int) -> str | None:
    """Clear the file if it is not a whole table (the lock is held): how it was found
    then, else None (whole: another worker may have cleared it first)."""
    size = os.fstat(fd).st_size
    if size == _SIZE and os.pread(fd, len(_MAGIC), 0) == _MAGIC:
        return None
    os.ftruncate(fd, 0)
    _write_empty_table(fd)
    return f"cut to {size:,} of its {_SIZE:,} bytes" if size < _SIZE else "overwritten"


class WindowCounter:
    """The rate-limit file: counts requests per key, atomically across processes.

    Opening it refuses, with a `DatabaseError`, a file that cannot be used (the server's
    start names it in one line); with `fallback`, as each worker opens it, such a file is
    logged and the worker counts in its own memory instead. Once a second a count checks
    that the file is still the path's, whole and writable (`_check`).
    """

    def __init__(self, path: Path, *, fallback: bool = False) -> None:
        self._path = path
        self._slots: dict[str, tuple[bytes, int]] = {}  # key -> (digest, slot offset)
        self._leases: dict[str, _Lease] = {}
        self._checked_at = 0
        self._in_memory = False
        self._fd = -1
        # Serving (a worker's counter), a file damaged since the server's start is ours
        # to clear; at the start it may be another program's, and is refused.
        self._serving = fallback
        try:
            fd, _ = self._open_path()
        except DatabaseError as error:
            if not fallback:
                raise
            self._count_in_memory(str(error))
        else:
            self._use(fd, in_memory=False)

    def _open_path(self) -> tuple[int, bool]:
        """A descriptor of the file at the path, its table ready, and whether this call
        created the file."""
        try:
            for _ in range(_OPEN_TRIES):
                try:
                    fd, created = os.open(self._path, os.O_RDWR | os.O_CLOEXEC), False
                    break
                except FileNotFoundError:
                    published = self._publish_new()
                    if published is not None:
                        fd, created = published, True
                        break
                    # Another worker published one first: open that.
            else:  # (a name that exists yet opens nothing: a link to a missing file)
                raise DatabaseError(
                    f"cannot use the rate-limit file {self._path}: it is a link to a file "
                    "that does not exist"
                )
        except OSError as error:
            raise DatabaseError(
                f"cannot use the rate-limit file {self._path}: {error.strerror}"
            ) from None
        if created:
            return fd, True
        try:
            cleared = self._prepare(fd)
        except BaseException:
            os.close(fd)
            raise
        if cleared is not None:
            self._say_cleared(cleared)
        return fd, False

    def _publish_new(self) -> int | None:
        """A new file with its table, put at the path only once whole (None: a file was
        there first).

        Made under a name of its own (`mkstemp`) and linked to the path, so no worker ever
        opens a file another is still filling: at the path, a file shorter than a table
        has been cut (an empty one counted as just made, and quietly filled, let a
        worker starting late clear a file cut under the others without a word).
        """
        fd, name = tempfile.mkstemp(dir=self._path.parent, prefix=f".{self._path.name}.")
        making = Path(name)
        try:
            _write_empty_table(fd)
            os.link(making, self._path)
        except BaseException as error:
            os.close(fd)
            if isinstance(error, FileExistsError):
                return None
            raise
        finally:
            making.unlink(missing_ok=True)
        return fd

    def _prepare(self, fd: int) -> str | None:
        """Check a file found at the path, under the lock; when serving, clear a damaged
        one and say how it was found."""
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if self._serving:
                return _make_whole(fd)
            size = os.fstat(fd).st_size
            if size == 0:  # (left by a start that died, or by a version before this one)
                _write_empty_table(fd)
                return None
            if size != _SIZE or os.pread(fd, len(_MAGIC), 0) != _MAGIC:
                raise DatabaseError(
                    f"{self._path} {_FOREIGN}: move it away (it holds only counts of open windows)"
                )
            return None
        except OSError as error:
            raise DatabaseError(
                f"cannot use the rate-limit file {self._path}: {error.strerror}"
            ) from None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _say_cleared(self, how: str) -> None:
        logger.warning(
            "rate-limit file %s was %s while serving: cleared it, every token's window "
            "starts again",
            self._path,
            how,
        )

    def _use(self, fd: int, *, in_memory: bool) -> None:
        """Count in `fd` from now on; what this worker knew of the last one is dropped."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._in_memory = in_memory
        self._slots.clear()
        self._leases.clear()

    def _count_in_memory(self, reason: str) -> None:
        # A file of the worker's own, that no other program can reach to cut or lock.
        fd = os.memfd_create("leasestar-ratelimit", os.MFD_CLOEXEC)
        _write_empty_table(fd)
        self._use(fd, in_memory=True)
        logger.warning(
            "%s: this worker process counts the rate limit in its own memory until the file "
            "can be used (every token's window starts again, and each worker process has a "
            "budget of its own meanwhile)",
            reason,
        )

    def _check(self, now: int) -> None:
        """Follow the path if the file was deleted or replaced, clear it if it was cut or
        overwritten, and go back to it from memory once it can be used."""
        self._checked_at = now
        if self._in_memory:
            try:
                fd, _ = self._open_path()
            except DatabaseError:
                return  # still unusable: said once already
            self._use(fd, in_memory=False)
            logger.warning(
                "rate-limit file %s can be used again: counting in it (one budget per token "
                "for every worker process)",
                self._path,
            )
            return
        if not self._follow_path():
            try:
                whole = (
                    os.fstat(self._fd).st_size == _SIZE
                    and os.pread(self._fd, len(_MAGIC), 0) == _MAGIC
                )
            except OSError as error:
                self._count_in_memory(
                    f"cannot read the rate-limit file {self._path}: {error.strerror}"
                )
                return
            if not whole:
                self._clear()

    def _follow_path(self) -> bool:
        """Whether the file counted in was no longer the path's (and is not now)."""
        held = os.fstat(self._fd)
        try:
            at_path: os.stat_result | None = os.stat(self._path)
        except OSError:  # gone, or its directory no longer searchable: opened again below
            at_path = None
        if (
            at_path is not None
            and held.st_nlink > 0
            and (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)
        ):
            return False
        try:
            fd, created = self._open_path()
        except DatabaseError as error:
            self._count_in_memory(str(error))
            return True
        self._use(fd, in_memory=False)
        if created:  # (the other workers find the file this one made, and say nothing)
            logger.warning(
                "rate-limit file %s was deleted while serving: counting in a new one (every "
                "token's window starts again)",
                self._path,
            )
        return True

    def _clear(self) -> None:
        """Give the cut or overwritten file a new table, under the lock: the worker that
        finds it so first does it, and logs it."""
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            cleared = _make_whole(fd)
        except OSError as error:
            failure: str | None = f"cannot write the rate-limit file {self._path}: {error.strerror}"
        else:
            failure = None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        if failure is not None:
            self._count_in_memory(failure)
            return
        self._slots.clear()
        self._leases.clear()
        if cleared is not None:
            self._say_cleared(cleared)

    def _recover(self, error: Exception) -> None:
        """After a read or write of the file failed: find why, and make the next one work."""
        if self._follow_path():
            return
        if isinstance(error, OSError) and error.errno != errno.EINTR:
            self._count_in_memory(
                f"cannot write the rate-limit file {self._path}: {error.strerror}"
            )
        else:
            self._clear()

    def close(self) -> None:
        os.close(self._fd)
        self._fd = -1

    def count(self, key: str, budget: int, seconds: int) -> Window:
        """Count one request of `key` in a window of `seconds` holding `budget` requests."""
        now = math.floor(time.time())  # (int() of a float costs twice as much)
        if now != self._checked_at:
            self._check(now)
        lease = self._leases.get(key)
        if lease is not None and lease.left and lease.resets_at > now:
            lease.left -= 1
            # The file's count as every worker has taken it, less what this one still
            # holds: read without the lock, for the fields only. A count only rises in
            # its window, so what reads lower (a read racing another worker's write, or
            # a file cut since) is answered as one more than the last.
            try:
                told = _NUMBER.unpack(os.pread(self._fd, 8, lease.count_at))[0] - lease.left
            except (OSError, struct.error):
                told = 0
            if not lease.told < told <= budget:
                told = lease.told + 1
            lease.told = told
            return told, lease.resets_at - now
        try:
            return self._take_lease(key, budget, seconds, now)
        except (OSError, struct.error, _Unusable) as error:
            self._recover(error)
            return self._take_lease(key, budget, seconds, now)  # in the file as it is now

    def _take_lease(self, key: str, budget: int, seconds: int, now: int) -> Window:
        """Count one request in the file, with the rest of a lease for this worker."""
        known = self._slots.get(key)
        if known is None:
            if len(self._slots) >= _KEYS_KEPT:
                self._slots.clear()
                self._leases.clear()
            known = (hashlib.blake2b(key.encode(), digest_size=16).digest(), -1)
        digest, offset = known
        size = min(_LEASE_MOST, max(1, budget // _LEASE_PER_BUDGET))
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            slot = os.pread(fd, _SLOT.size, offset) if offset >= 0 else b""
            # Another key may have taken the slot over once this key's window ended.
            if slot[:16] != digest:
                offset, slot = self._find(digest, now)
                self._slots[key] = (digest, offset)
            _, count, resets_at = _SLOT.unpack(slot)
            if resets_at <= now:
                count, resets_at = 0, now + seconds
            taken = min(size, budget - count)
            if taken > 0:  # (past the budget nothing is written: a refusal is not counted)
                count += taken
                # One write of both numbers: a worker reading the count without the lock
                # (`count`'s lease path) sees the old value or the new one.
                if os.pwrite(fd, _WINDOW.pack(count, resets_at), offset + 16) != _WINDOW.size:
                    raise _Unusable
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        if taken <= 0:
            # Refused. The file's count stays at the budget: another worker's lease,
            # taken before, is still granted in full (a count written past the budget
            # refused its last request).
            return budget + 1, resets_at - now
        left = taken - 1
        self._leases[key] = _Lease(left, resets_at, offset + 16, count - left)
        return count - left, resets_at - now

    def peek(self, key: str, seconds: int) -> Window:
        """`key`'s window as it stands, without counting a request (none open, or the
        file unreadable: an empty window that the next request would open)."""
        now = math.floor(time.time())
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        requests = resets_at = 0
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            table = self._table()
        except (OSError, _Unusable):
            table = None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        if table is not None:
            offset, _ = _probe(table, digest, now)
            if offset is not None:
                _, requests, resets_at = _SLOT.unpack_from(table, offset - _TABLE_AT)
        if resets_at <= now:
            requests, resets_at = 0, now + seconds
        return requests, resets_at - now

    def _table(self) -> bytes:
        """The file's slots, read at once (the lock is held)."""
        table = os.pread(self._fd, _SIZE - _TABLE_AT, _TABLE_AT)
        if len(table) != _SIZE - _TABLE_AT:
            raise _Unusable
        return table

    def _find(self, digest: bytes, now: int) -> tuple[int, bytes]:
        """The offset and bytes of `digest`'s slot, claiming one if it has none (the lock
        is held)."""
        table = self._table()
        found, reusable = _probe(table, digest, now)
        if found is not None:
            return found, table[found - _TABLE_AT : found - _TABLE_AT + _SLOT.size]
        if reusable is None:
            raise CounterFull(f"{self._path}: {_SLOTS} windows are open at once")
        slot = _SLOT.pack(digest, 0, 0)
        if os.pwrite(self._fd, slot, reusable) != _SLOT.size:
            raise _Unusable
        return reusable, slot


class TokenLimits:
    """The per-token limits of one worker process: the window counter, opened with the
    app (`open`, `close`), and the turns of each token's requests in progress (None
    without a cap: nothing to count then, and a request pays nothing for it)."""

    counter: WindowCounter
    turns: TokenConcurrency | None

    def __init__(self, path: Path, concurrency: int | None) -> None:
        self._path = path
        self._concurrency = concurrency
        self._open_turns()

    def open(self) -> None:
        # A worker that cannot use the file counts in its own memory, and says so: its
        # start failing would have the supervisor start it again, and again.
        self.counter = WindowCounter(self._path, fallback=True)
        self._open_turns()

    def _open_turns(self) -> None:
        self.turns = None if self._concurrency is None else TokenConcurrency(self._concurrency)

    def close(self) -> None:
        self.counter.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> TokenLimits:
        # Litestar deep-copies a Router when it is registered, its middleware's arguments
        # included: every copy must count in these limits, the process's only ones.
        return self


class TooManyAtOnce(TooManyRequestsException):
    """A token already has its most requests in progress, and waiting, on this worker
    process."""


# The limit's two fields, as the IETF's RateLimit header fields draft defines them
# (draft-ietf-httpapi-ratelimit-headers-10): the policy, constant, and its state after
# this request. Two fields where the draft's earlier versions (and Litestar's limiter)
# send four: uvicorn scans every byte of every field against a pattern, and with the
# limiter's work to make them the two fields more cost a get by id about 6 % of its
# instructions (benchmarks/rate_limit_instructions.py at commit d986a0d). The state goes
# with every answer; the policy, which the draft wants "consistent over a sequence of
# HTTP responses" and lets a server leave out ("clients can still use the RateLimit
# header field to throttle"), with the answer that opens a window and with every 429: on
# every answer it was a quarter of the limit's cost (6,300 instructions of a get's
# 355,000).
POLICY_FIELD: Final = "RateLimit-Policy"
STATE_FIELD: Final = "RateLimit"
POLICY_NAME: Final = "token"  # each token has its own budget
# The one budget every request without a token counts against (`OPTIONS`, which
# Litestar's authentication does not check): not a token's name, which cannot be empty.
ANONYMOUS: Final = ""


Turn = tuple[TokenConcurrency, str, bool]
"""A request's turn at being served under the per-token cap: (the worker's turns, its
token's key, whether it must `turns.wait_turn(key)` first). Handed back with
`turns.finish(key)` once the request is answered, whatever happens. A plain tuple, its
turns called on directly: a method of the limiter on the way cost a get by id about 600
instructions (callgrind), a sixth of all the cap's work on it."""


async def waited_for(turn: Turn, receive: Receive) -> bool:
    """Wait for a queued request's turn: False when its client left meanwhile (it leaves
    the queue, nobody is left to answer, and it has no turn to finish). If this raises
    (the request cancelled), the request has no turn to finish either: one handed to it
    in the moment before is handed on here."""
    turns, key, _ = turn
    granted = False

    async def wait() -> None:
        nonlocal granted
        await turns.wait_turn(key)
        granted = True

    try:
        await unless_gone(wait(), receive)
    except ClientGone:
        return False
    except BaseException:
        if granted:  # the turn came, then the request was cancelled before taking it
            turns.finish(key)
        raise
    return True


class SharedRateLimitMiddleware(RateLimitMiddleware):
    """Litestar's rate limiter (its configuration), counting per token in the server's
    `WindowCounter` instead of a store, telling clients their budget in the IETF draft's
    two fields (`RateLimit-Policy`, `RateLimit`); and each token's turns at being served
    in this worker process (leasestar/token_concurrency.py).

    It runs on every API request, behind authentication: a request's key is its token's
    name, read from the scope (Litestar's own key needs a Request built and a format per
    request). What does not change between requests is made once: the policy field,
    already encoded, and the limits themselves, handed over when the app is built (an
    attribute of `app.state` is looked up after a failed attribute lookup: each cost as
    much as the window's count, measured by callgrind).
    It is mounted on the routes it limits alone (`main.py`): it excludes no paths.
    """

    def __init__(self, app: ASGIApp, config: RateLimitConfig, limits: TokenLimits) -> None:
        super().__init__(app, config)
        if (
            self.exclude_pattern is not None
            or self.exclude_opt_key
            or config.check_throttle_handler
        ):
            raise ImproperlyConfiguredException(
                "mount SharedRateLimitMiddleware on the routes it limits: it excludes none"
            )
        self._limits = limits
        self._seconds = DURATION_VALUES[self.unit]
        self._policy = f'"{POLICY_NAME}";q={self.max_requests};w={self._seconds}'
        self._policy_field = (POLICY_FIELD.lower().encode(), self._policy.encode())
        self._state_name = STATE_FIELD.lower().encode()
        self._state_format = f'"{POLICY_NAME}";r=%d;t=%d'.encode()

    async def _limit(self, scope: Scope, receive: Receive, send: Send) -> None:
        turn = self.admit(scope)
        if turn is None:
            await self.app(scope, receive, send)
            return
        turns, key, waits = turn
        if waits and not await waited_for(turn, receive):
            return
        try:
            await self.app(scope, receive, send)
        finally:
            turns.finish(key)

    def admit(self, scope: Scope) -> Turn | None:
        """Count this request in its token's window and, under a per-token cap, give it a
        turn (`Turn`); or raise the 429 that refuses it. None without a cap: no turn to
        wait for or hand back.

        A plain call, so that a route answered outside the router
        (`applicants/direct_route.py`) applies the same rules without a layer of its own.
        """
        try:
            key: str = scope["user"].name  # token names are unique (auth.py)
        except KeyError:
            if scope.get("method") != "OPTIONS":  # (mounted where no authentication ran)
                raise
            key = ANONYMOUS  # authentication lets OPTIONS through without a token
        limits = self._limits
        turns = limits.turns
        if turns is None:
            turn = None
        elif turns.try_start(key):
            turn = (turns, key, False)
        else:
            turn = self._queue(key, turns)
        budget = self.max_requests
        try:
            requests, resets_in = limits.counter.count(key, budget, self._seconds)
            if requests > budget:
                raise TooManyRequestsException(headers=self.window_fields(requests, resets_in))
        except BaseException:  # refused, or the count failed (`CounterFull`): not served
            if turn is not None and not turn[2]:
                turn[0].finish(key)  # it had started: its turn goes to the next one
            raise
        state = (self._state_name, self._state_format % (budget - requests, resets_in))
        # Added to whatever answers the request, by the layer that already rewrites the
        # response's start (`RESPONSE_HEADERS`, leasestar/asgi.py): a wrapper of `send`
        # here was a coroutine more per message; appended to that list here, not through
        # `add_response_headers`, a call and a tuple less (650 instructions). As they are:
        # no route sets these fields itself. The policy with the answer that opens a
        # window alone (and every 429: `window_fields`); why, at `POLICY_FIELD`.
        added = scope.setdefault(RESPONSE_HEADERS, [])  # type: ignore[typeddict-item]
        if requests == 1:
            added.append(self._policy_field)
        added.append(state)
        return turn

    def _queue(self, key: str, turns: TokenConcurrency) -> Turn:
        """A place in the token's queue, for a request over its cap; refused (before
        counting: like a 429 for the budget, it spends none of it) when that is full too."""
        if turns.full(key):
            raise self._too_many_at_once(self._limits.counter.peek(key, self._seconds), turns)
        return turns, key, True  # no await since `full`: there is room to wait

    def window_fields(self, requests: int, resets_in: int) -> dict[str, str]:
        """The limit's fields for a refusal: the policy, its state (`r`: what is left of
        the budget, none past it) and `Retry-After`, the seconds until the window ends
        (a refusal for too many requests at once puts 1 there instead)."""
        remaining = max(self.max_requests - requests, 0)
        return {
            POLICY_FIELD: self._policy,
            STATE_FIELD: (self._state_format % (remaining, resets_in)).decode(),
            "Retry-After": str(resets_in),
        }

    def _too_many_at_once(self, window: Window, turns: TokenConcurrency) -> TooManyAtOnce:
        # The window's fields as they stand (this request was not counted), and a retry
        # soon: the token's requests in progress take about that long to make room.
        return TooManyAtOnce(
            detail=f"this token already has {turns.cap} requests in progress and {QUEUE} "
            "waiting, the most a server process takes at once; send more when some are "
            "answered",
            headers={**self.window_fields(*window), "Retry-After": "1"},
        )


# AbstractMiddleware wraps each subclass's `__call__` in a check of the scope type, the
# excluded paths and an opt-out key, one more coroutine per request (6 % of this
# middleware's work by callgrind). Mounted on the routes it limits, with nothing
# excluded (checked in `__init__`), it is its own ASGI callable.
SharedRateLimitMiddleware.__call__ = SharedRateLimitMiddleware._limit  # type: ignore[method-assign,assignment]
