"""The SQLite file: opening it safely, applying `schema.sql`, and the read pool.

Writers (the CLI's import and seed, and the server's first start) use plain sqlite3
connections in one transaction each.

The server reads two ways. Most statements of the API (a page whose total is cached, a
record by id) finish in about a hundred microseconds; handing each to a thread and back
costs about half as much again, and buys nothing on a server that runs one worker per
core. So every read is first tried on the event loop, on a read-only connection of its
own, under a time budget that SQLite's progress handler enforces: a statement that has
not finished when the budget runs out is interrupted and run again on a small pool of
read-only aiosqlite connections (one thread each), where it can take as long as it
needs without holding up other requests. Statements known to be long (counts over a
whole table, checkpoint scans) go to the pool directly. The loop is therefore held
for about the budget at most, whatever a client asks: SQLite checks it every thousand
steps, so a step that waits on a cold disk can overrun it by a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any, Final, Protocol

import aiosqlite

logger = logging.getLogger("leasestar.database")

SCHEMA_VERSION: Final = 4
# What an existing database of an older version needs beyond schema.sql's CREATE ... IF
# NOT EXISTS, by the version that brings it; run once, in the transaction that applies
# the schema.
MIGRATIONS: Final[dict[int, str]] = {
    # integration_versions, filled from the rows already stored.
    2: "INSERT OR REPLACE INTO integration_versions (integration_id, change_seq) "
    "SELECT integration_id, max(change_seq) FROM applicants GROUP BY integration_id;",
    # Compressed bodies and body_dictionaries (schema.sql). Bodies stored before stay JSON,
    # which every reader serves as it is (applicants/bodies.py, RAW); each is compressed
    # when next written, and a file is only as small as a new one once imported afresh.
    3: "",
    # Webhooks (schema.sql): new tables only.
    4: "",
}
SQLITE_HEADER: Final = b"SQLite format 3\x00"
_HEADER_BYTES: Final = 100  # the database header, before the first page's content
BUSY_TIMEOUT_MS: Final = 10_000
# The longest a read may hold the event loop before it moves to a pooled thread.
INLINE_BUDGET_SECONDS: Final = 0.002
# How often (in SQLite VM steps, about 20 to 70 a microsecond) the budget is checked.
_BUDGET_CHECK_STEPS: Final = 1000
# Faults after which an inline read is retried on the pool instead of failing: the
# budget ran out, or the database is momentarily busy (the inline connection never
# waits for a lock; the pool's connections do, up to BUSY_TIMEOUT_MS). Primary codes:
# Python reports the extended one (SQLITE_BUSY_RECOVERY is SQLITE_BUSY | 1 << 8).
_RETRY_ON_POOL: Final = frozenset(
    {sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
)
# Pauses before trying a busy inline read again (then it goes to the pool): ~30 ms.
_BUSY_PAUSES: Final = (0.001, 0.002, 0.004, 0.008, 0.016, None)
_PROBE_SECONDS: Final = 1.0  # `check`'s own budget for its one-row probe
# The page size of a new database. A write rewrites whole pages: a few random rows touch
# a leaf of each of the table's 24 indexes, so an import of 100 applicants into a million
# wrote 28-68 MB of WAL at 16 KiB pages and 14-25 MB at 4 KiB. Replicas ship and apply
# those bytes (issue 14): at a million applicants the lag from commit to replica fell
# from p50 2.3 s / p99 3.2 s to 1.55 s / 2.38 s. 16 KiB pages were chosen when a stored
# applicant took ~2 KB (a 4 KiB page held one; bulk index builds read 4x the pages);
# compressed to ~310 bytes (bodies.py), 4 KiB pages hold a dozen, the file is 2 % larger
# and reads served as fast (benchmarks/RESULTS.md). An existing database keeps its own.
PAGE_SIZE: Final = 4_096
# Page cache of each read connection, in KiB (SQLite's default is 2 MiB). A page's rows
# sit on as many table pages as it has rows (they are stored in import order, read in
# sort order): at 16 KiB a page (the page size then), SQLite's default cache held ~125,
# so a 250-row page re-read every table page from the OS on every request. Measured on
# 100k applicants, limit=250 took 1,440 us with the default cache and 180 us with this
# one; bounded, so memory stays flat however long the server runs.
READ_CACHE_KIB: Final = 32 * 1024
# Reads map the file rather than copy each page out of the OS cache with a system call:
# a page of rows in another part of the table (a client walking the list) then costs
# memory reads, not 100 preads. SQLite clamps this to its build's limit (2 GiB for
# Debian's); the rest of a larger file is read as before. Never written through: the
# connections are read-only, and leasestar never shrinks a database file under them.
READ_MMAP_BYTES: Final = 1 << 40
# How often a read looks whether the database's -shm (SQLite's WAL index) is still the
# one its connections share (`ReadPool._follow_wal_index`).
WAL_INDEX_CHECK_SECONDS: Final = 1.0
READ_PRAGMAS: Final = (
    "PRAGMA query_only = 1",
    f"PRAGMA cache_size = -{READ_CACHE_KIB}",
    f"PRAGMA mmap_size = {READ_MMAP_BYTES}",
)


# The tables of schema.sql, one row each if any: reads every table's root page.
_TABLE_ROOTS: Final = " UNION ALL ".join(
    f"SELECT * FROM (SELECT 1 FROM {table} LIMIT 1)"
    for table in ("applicants", "sync_state", "tokens")
)


def schema_sql() -> str:
    """The tables, from the package's `schema.sql` (the repository root's, put in the wheel)."""
    return files("leasestar").joinpath("schema.sql").read_text(encoding="utf-8")


class DatabaseError(Exception):
    """The database cannot be used; the message is one line, fit for a terminal."""


_RESTORE: Final = (
    "restore it from a backup or an earlier `leasestar export` (imported into a new file), "
    "or move it away to start a new one"
)


def _read_only_reason(directory: Path) -> str | None:
    """Why nothing can be written in `directory`, or None if it can be."""
    with contextlib.suppress(OSError):
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f"its directory {directory} is on a read-only file system"
    if not os.access(directory, os.W_OK):
        return f"its directory {directory} is not writable by this user"
    return None


def describe_failure(path: Path, error: sqlite3.Error) -> str:
    """One line that names what went wrong with the database at `path`, and what to do.

    SQLite's own messages name a symptom (`unable to open database file`, `database or
    disk is full`); an operator needs the cause and the file.
    """
    code = getattr(error, "sqlite_errorcode", -1) & 0xFF
    if code == sqlite3.SQLITE_FULL:
        return (
            f"no space left on device: database or disk is full writing {path}; nothing "
            "was written (free space on its disk, then run the command again)"
        )
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return (
            f"database {path} is locked by another program (waited "
            f"{BUSY_TIMEOUT_MS / 1000:g} s); nothing was written: run the command again "
            "once that program is done"
        )
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
        reason = _read_only_reason(path.parent)
        if reason is not None:
            return (
                f"cannot use database {path}: {reason}, and SQLite writes the database's "
                "-wal and -shm files there, even to read it; nothing was written"
            )
        if code == sqlite3.SQLITE_READONLY:
            return f"cannot write database {path}: the file is read-only; nothing was written"
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return f"database {path} is damaged ({error}): {_RESTORE}"
    if code == sqlite3.SQLITE_IOERR:
        return f"I/O error on database {path} ({error}): check its disk"
    return f"cannot use database {path}: {error}"


def _truncated(path: Path, header: bytes) -> str | None:
    """A refusal when the file is shorter than the pages its SQLite header records."""
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65_536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The page count is valid only when written by the last change (offsets 24 and 92),
    # and only then with no WAL beside the file (a checkpoint may be extending it) and no
    # rollback journal (a cut write into an empty database: the next open restores it).
    if header[24:28] != header[92:96] or any(
        Path(f"{path}-{journal}").exists() for journal in ("wal", "journal")
    ):
        return None
    size, expected = path.stat().st_size, pages * page_size
    if size >= expected:
        return None
    return (
        f"database {path} is truncated ({size:,} of the {expected:,} bytes it records): {_RESTORE}"
    )


def _check_file(path: Path, *, must_exist: bool) -> bool:
    """Refuse paths that cannot be a leasestar database; True when the file exists."""
    if not path.parent.is_dir():
        raise DatabaseError(f"database directory does not exist: {path.parent}")
    if not path.exists():
        if must_exist:
            raise DatabaseError(f"database does not exist: {path}")
        return False
    if not path.is_file():
        raise DatabaseError(f"database path is not a file: {path}")
    try:
        with path.open("rb") as handle:
            header = handle.read(_HEADER_BYTES)
    except OSError as error:
        raise DatabaseError(f"cannot read database {path}: {error.strerror}") from None
    if header and not header.startswith(SQLITE_HEADER):
        raise DatabaseError(f"not an SQLite database: {path}")
    if header and len(header) < _HEADER_BYTES:
        raise DatabaseError(f"database {path} is truncated (within its header): {_RESTORE}")
    refusal = _truncated(path, header) if header else None
    if refusal is not None:
        raise DatabaseError(refusal)
    return bool(header)


def _configure(connection: sqlite3.Connection) -> None:
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    connection.execute("PRAGMA synchronous = NORMAL")


def open_for_write(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the database for writing, with the schema applied.

    Refuses a non-SQLite file and a database of a newer schema version before writing
    anything, so nothing of the user's is ever overwritten.
    """
    existed = _check_file(path, must_exist=False)
    version = 0
    try:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as error:
        raise DatabaseError(describe_failure(path, error)) from None
    try:
        _configure(connection)
        if existed:
            (version,) = connection.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise DatabaseError(
                    f"database {path} has schema version {version}; this leasestar "
                    f"understands up to {SCHEMA_VERSION}: upgrade leasestar"
                )
            # Version 0 with tables: another application's database, not ours to change.
            if version == 0 and connection.execute("SELECT 1 FROM sqlite_master").fetchone():
                raise DatabaseError(f"not a leasestar database: {path} (it holds other tables)")
            if version == SCHEMA_VERSION:
                # Read each table's first page before anything is written (the switch to
                # WAL below writes the header): a damaged file is refused untouched.
                connection.execute(_TABLE_ROOTS).fetchall()
        # Only a new database takes it (an existing one keeps its page size): see
        # PAGE_SIZE.
        connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        connection.execute("PRAGMA journal_mode = WAL")
        migrations = "".join(MIGRATIONS.get(v, "") for v in range(version + 1, SCHEMA_VERSION + 1))
        connection.executescript(
            "BEGIN IMMEDIATE;"
            + schema_sql()
            + f";{migrations}PRAGMA user_version = {SCHEMA_VERSION};COMMIT;"
        )
    except DatabaseError:
        connection.close()
        raise
    except sqlite3.Error as error:
        connection.close()
        raise DatabaseError(describe_failure(path, error)) from None
    return connection


def read_uri(path: Path) -> str:
    """A read-only SQLite URI for the path (percent-encoded, so any file name works)."""
    return path.resolve().as_uri() + "?mode=ro"


class Reopened(Protocol):
    """A connection to the database held beside the pool's, closed and opened again with
    them when the WAL index was replaced (`ReadPool._follow_wal_index`)."""

    def close(self) -> None: ...

    def reopen(self) -> None: ...


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


class ReadPool:
    """Reads: on the event loop within a time budget, else on pooled aiosqlite threads.

    Once a second a read also looks whether the database's `-shm` file, SQLite's WAL
    index that every connection to the database maps and shares, is still the one its
    connections opened. Deleted or replaced, the server went on reading through the old
    one: stale answers at best, and, once a writer with the new index had checkpointed and
    restarted the WAL, pages of the wrong frames, every `/v1` request a 500 until a
    restart. Then the connections are closed and opened again (`_follow_wal_index`).

    A `-shm` cut short is another matter: SQLite maps it and never looks at its size
    again, so the next read of a lost page kills the process with SIGBUS, which no check
    made before the read can rule out (the cut may come just after it) and which Python
    cannot catch. With `--workers 2` or more the supervisor names the signal in one line
    and starts a new worker, which rebuilds the index from the WAL (commands.py,
    `NamingSupervisor`); a single-process server ends, killed by the signal.
    """

    def __init__(self, path: Path, size: int, inline_budget: float = INLINE_BUDGET_SECONDS) -> None:
        self._path = path
        self._size = size
        self._inline_budget = inline_budget
        self._deadline = 0.0
        self._inline: sqlite3.Connection | None = None
        self.moved_to_pool = 0  # reads that outlasted the budget (or met a lock) inline
        self._idle: asyncio.LifoQueue[aiosqlite.Connection] = asyncio.LifoQueue()
        self._all: list[aiosqlite.Connection] = []
        self._wal_index = Path(f"{path}-shm")
        self._wal_index_identity: tuple[int, int] | None = None
        self._next_wal_index_check = 0.0
        self._beside: list[Reopened] = []

    def reopen_with(self, connection: Reopened) -> None:
        """Close and open `connection` again with the pool's when the WAL index is
        replaced: a connection of the process still open keeps the old one in use."""
        self._beside.append(connection)

    @property
    def path(self) -> Path:
        """The database file the pool reads."""
        return self._path

    async def open(self) -> None:
        await self._open_pooled()
        self._open_inline()
        await self._note_wal_index()
        self._next_wal_index_check = time.monotonic() + WAL_INDEX_CHECK_SECONDS

    async def _open_pooled(self) -> None:
        for _ in range(self._size):
            connection = await aiosqlite.connect(read_uri(self._path), uri=True)
            await connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            for pragma in READ_PRAGMAS:
                await connection.execute(pragma)
            self._all.append(connection)
            self._idle.put_nowait(connection)

    def _open_inline(self) -> None:
        if self._inline_budget > 0:
            # timeout=0: never wait for a lock on the loop; the pool waits instead.
            inline = sqlite3.connect(
                read_uri(self._path), uri=True, timeout=0, check_same_thread=False
            )
            for pragma in READ_PRAGMAS:
                inline.execute(pragma)
            inline.set_progress_handler(self._over_budget, _BUDGET_CHECK_STEPS)
            self._inline = inline

    async def _note_wal_index(self) -> None:
        """Read once, which opens the WAL index, and note which file it is."""
        async with self.connection() as connection:
            await connection.execute_fetchall("SELECT 1 FROM sqlite_master LIMIT 1")
        self._wal_index_identity = _identity(self._wal_index)

    async def _follow_wal_index(self) -> None:
        """Open the connections again if the WAL index was deleted or replaced.

        SQLite shares one mapping of it among all the connections of a process to the
        same database, so all of them close before any opens: the pool's (waiting for
        the reads in flight), then, without yielding to another request, the event loop's
        and those beside it (`reopen_with`), which open again at once; the pool's last.
        A stream's own connection open meanwhile keeps the old index until it ends.
        """
        self._next_wal_index_check = float("inf")  # (one at a time)
        try:
            if _identity(self._wal_index) == self._wal_index_identity:
                return
            closing = [await self._idle.get() for _ in self._all]
            for connection in closing:
                await connection.close()
            self._all.clear()
            if self._inline is not None:
                self._inline.close()
                self._inline = None
            for beside in self._beside:
                beside.close()
            self._open_inline()
            for beside in self._beside:
                beside.reopen()
            await self._open_pooled()
            await self._note_wal_index()
            # One line per worker process: each opens its own connections again.
            logger.warning(
                "the database's WAL index %s was deleted or replaced while serving: this "
                "server process opened its connections to the database again (reads in "
                "the second before may have missed the latest writes)",
                self._wal_index,
            )
        finally:
            self._next_wal_index_check = time.monotonic() + WAL_INDEX_CHECK_SECONDS

    async def close(self) -> None:
        for connection in self._all:
            await connection.close()
        self._all.clear()
        if self._inline is not None:
            self._inline.close()
            self._inline = None

    def _over_budget(self) -> int:
        # Non-zero interrupts the running statement (SQLITE_INTERRUPT).
        return time.perf_counter() > self._deadline

    async def fetchall(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """The statement's rows: computed on the event loop if that takes no longer than
        the budget, else on a pooled connection. Each statement reads one snapshot."""
        if time.monotonic() >= self._next_wal_index_check:
            await self._follow_wal_index()
        if self._inline is not None:
            for pause in _BUSY_PAUSES:
                self._deadline = time.perf_counter() + self._inline_budget
                try:
                    return self._inline.execute(sql, parameters).fetchall()
                except sqlite3.OperationalError as error:
                    code = getattr(error, "sqlite_errorcode", -1) & 0xFF
                    if code not in _RETRY_ON_POOL:
                        raise
                    if code == sqlite3.SQLITE_INTERRUPT or pause is None:
                        break
                # A writer's checkpoint holds the file for a moment: a short read waits
                # it out here rather than queue behind long statements on the pool.
                await asyncio.sleep(pause)
            self.moved_to_pool += 1
        return await self.fetchall_on_pool(sql, parameters)

    async def fetchall_on_pool(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """The statement's rows, read on a pooled thread: for statements known to be long."""
        if time.monotonic() >= self._next_wal_index_check:
            await self._follow_wal_index()
        async with self.connection() as connection:
            return list(await connection.execute_fetchall(sql, parameters))

    async def check(self) -> None:
        """Raise unless both the event loop's connection and a pooled one read the file."""
        probe = "SELECT change_seq FROM sync_state"
        if self._inline is not None:
            # A deadline of its own: the progress handler fires every 1000 steps a cached
            # statement has run in all (SQLite counts them across runs), so a probe run
            # a hundred times met a stale deadline and was interrupted: a spurious 503.
            self._deadline = time.perf_counter() + _PROBE_SECONDS
            self._inline.execute(probe).fetchall()
        await self.fetchall_on_pool(probe)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[aiosqlite.Connection]:
        connection = await self._idle.get()
        try:
            yield connection
        finally:
            self._idle.put_nowait(connection)
