"""The SQLite file: opening it safely, applying `schema.sql`, and the read pool.

Writers (the CLI's import and seed, and the server's first start) use plain sqlite3
connections in one transaction each. The server reads through a small pool of
read-only aiosqlite connections: aiosqlite runs one thread per connection and queues
every call on it, so a single shared connection would serialise all requests.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import aiosqlite

SCHEMA_VERSION: Final = 1
SCHEMA_PATH: Final = Path(__file__).resolve().parent.parent / "schema.sql"
SQLITE_HEADER: Final = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS: Final = 10_000
PAGE_SIZE: Final = 16_384


class DatabaseError(Exception):
    """The database cannot be used; the message is one line, fit for a terminal."""


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
            header = handle.read(len(SQLITE_HEADER))
    except OSError as error:
        raise DatabaseError(f"cannot read database {path}: {error.strerror}") from None
    if header and header != SQLITE_HEADER:
        raise DatabaseError(f"not an SQLite database: {path}")
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
    try:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as error:
        raise DatabaseError(f"cannot open database {path}: {error}") from None
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
        # Only a new database takes it (an existing one keeps its page size). A stored
        # applicant is ~2 KB: a 4 KB page holds one and leaves ~40% empty, 16 KB pages
        # hold seven. The file is ~20% smaller and a bulk import, whose index rebuild
        # scans the table once per index, reads a quarter of the pages. Measured on a
        # million seeded applicants in one transaction: rows, index rebuild and commit
        # took 67 s instead of 234 s, and the index rebuild alone 40 s instead of 178 s.
        connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.executescript(
            "BEGIN IMMEDIATE;"
            + SCHEMA_PATH.read_text(encoding="utf-8")
            + f";PRAGMA user_version = {SCHEMA_VERSION};COMMIT;"
        )
    except DatabaseError:
        connection.close()
        raise
    except sqlite3.Error as error:
        connection.close()
        raise DatabaseError(f"cannot use database {path}: {error}") from None
    return connection


def read_uri(path: Path) -> str:
    """A read-only SQLite URI for the path (percent-encoded, so any file name works)."""
    return path.resolve().as_uri() + "?mode=ro"


class ReadPool:
    """A fixed set of read-only aiosqlite connections handed out one request at a time."""

    def __init__(self, path: Path, size: int) -> None:
        self._path = path
        self._size = size
        self._idle: asyncio.LifoQueue[aiosqlite.Connection] = asyncio.LifoQueue()
        self._all: list[aiosqlite.Connection] = []

    async def open(self) -> None:
        for _ in range(self._size):
            connection = await aiosqlite.connect(read_uri(self._path), uri=True)
            await connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            await connection.execute("PRAGMA query_only = 1")
            self._all.append(connection)
            self._idle.put_nowait(connection)

    async def close(self) -> None:
        for connection in self._all:
            await connection.close()
        self._all.clear()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[aiosqlite.Connection]:
        connection = await self._idle.get()
        try:
            yield connection
        finally:
            self._idle.put_nowait(connection)
