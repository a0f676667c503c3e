"""Copying the file Litestream follows into the database a replica serves.

`litestream restore -f` writes pages straight into its file, around SQLite, under
SQLite's own lock bytes: a reader that holds SQLITE's SHARED lock on that file sees it
between two applied transactions, never in the middle of one. A connection kept open
on it would not notice the pages change under its cache, so it is read only through a
fresh ATTACH, inside one write transaction on the served database:

- the rows whose change sequence is above the served database's, and the token table if
  it differs, are written in one transaction, so readers of the served database (in WAL
  mode, like a primary) see the old state or the new one, and every cache keyed by the
  change sequence moves with it;
- the followed file must come from the same primary (`primary_identity`), be no older
  than what is served, and have the same schema; otherwise nothing is written.

Every write to an applicant gives it a new change sequence and records are never deleted
(`leasestar/applicants/writer.py`), so those rows are exactly what changed. They are
written with the primary's rowids: the primary updates a record in place, and the
columnar copy that counts totals (`applicants/columnar_copy.py`) is indexed by rowid, so
an updated record must not move to a new one on a replica. The cost is that of writing
the changed rows, as it was on the primary, instead of a copy of the whole database per
change (measured in `docs/replicas.md`).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from leasestar.applicants.writer import BULK_MIN_ROWS as LARGE_CHANGE_ROWS
from leasestar.applicants.writer import WRITE_CACHE_KIB
from leasestar.database import BUSY_TIMEOUT_MS, READ_CACHE_KIB, SCHEMA_VERSION, read_uri
from leasestar.replica.layout import ReplicaError

_IDENTITY_LABEL: Final = b"leasestar primary\0"


class FollowerGone(Exception):
    """The follower stopped: the file it wrote may hold half a transaction."""


class OtherPrimary(ReplicaError):
    """The store holds another primary's database (or none of leasestar's)."""


class StoreBehind(Exception):
    """The followed file is older than the database served: the store went back."""


class SchemaDiffers(Exception):
    """The primary's schema is not the served database's: copy it whole."""


@dataclass(frozen=True, slots=True)
class Applied:
    change_seq: int  # the served database's change sequence now
    rows: int  # applicant rows written
    tokens: bool  # whether the tokens or their permissions were rewritten


def primary_identity(cursor_key: bytes) -> str:
    """Names a primary database: from its random cursor key, which never changes and is
    copied to its replicas, hashed so that the key itself is never written anywhere else."""
    return hashlib.sha256(_IDENTITY_LABEL + cursor_key).hexdigest()[:32]


def identity_of(connection: sqlite3.Connection, schema: str = "main") -> str:
    """The primary identity of an open leasestar database (`schema` is ours, not input)."""
    try:
        row = connection.execute(f"SELECT cursor_key FROM {schema}.sync_state").fetchone()
    except sqlite3.DatabaseError:
        raise OtherPrimary("the store does not hold a leasestar database") from None
    if row is None:
        raise OtherPrimary("the store does not hold a leasestar database")
    return primary_identity(bytes(row[0]))


def make_readable(followed: Path) -> None:
    """Put the followed file's header in rollback-journal mode, once after its restore.

    A restore keeps the primary's WAL-mode header; read that way, a connection holds its
    SHARED lock for as long as it is open and stalls the follower (and never sees its
    pages change). In rollback mode a reader holds the lock only while it reads, and
    litestream writes the same header bytes whenever it applies page 1.
    """
    connection = sqlite3.connect(followed, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        connection.execute("PRAGMA journal_mode = DELETE").fetchone()
    finally:
        connection.close()


def copy_whole(followed: Path, served: Path, alive: Callable[[], bool]) -> str:
    """Create `served` as a copy of the followed file (SQLite's backup API, one read
    transaction); returns the primary's identity. The copy is built beside and renamed."""
    partial = served.with_name(served.name + ".partial")
    partial.unlink(missing_ok=True)
    source = sqlite3.connect(read_uri(followed), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        _check_version(source)
        identity = identity_of(source)
        target = sqlite3.connect(partial, isolation_level=None)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode = WAL").fetchone()
        finally:
            target.close()
    finally:
        source.close()
    # Still running, so it wrote nothing while the copy held the file's SHARED lock, and
    # had finished every transaction it started before.
    if not alive():
        partial.unlink(missing_ok=True)
        raise FollowerGone
    partial.replace(served)
    return identity


def open_served(served: Path) -> sqlite3.Connection:
    """The replica's one write connection to the database it serves."""
    connection = sqlite3.connect(
        served, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    connection.execute("PRAGMA synchronous = NORMAL")
    # Checkpoints are run by `checkpoint`, after a change is served: in the commit they
    # copied every page of a change a second time and synced twice before the replica
    # could serve it (about half of a small import's apply time on the bench machine).
    connection.execute("PRAGMA wal_autocheckpoint = 0")
    return connection


def checkpoint(served: sqlite3.Connection, rows: int) -> None:
    """Copy the WAL into the database file: truncating it after a large change, as the
    primary's writer does, so that it does not stay as large as that change."""
    mode = "TRUNCATE" if rows >= LARGE_CHANGE_ROWS else "PASSIVE"
    served.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()


def pending_writes(served: sqlite3.Connection, followed: Path) -> int:
    """How many row writes the followed file holds beyond the served database: the lead of
    its change sequence (every row written takes the next one). A glance, outside any
    transaction, to choose where to apply the change; `apply_changes` checks again."""
    source = sqlite3.connect(read_uri(followed), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        row = source.execute("SELECT change_seq FROM sync_state").fetchone()
    except sqlite3.DatabaseError:
        return 0  # not a leasestar database: apply_changes refuses it
    finally:
        source.close()
    (served_seq,) = served.execute("SELECT change_seq FROM main.sync_state").fetchone()
    return 0 if row is None else max(int(row[0]) - int(served_seq), 0)


def apply_changes(
    served: sqlite3.Connection, followed: Path, identity: str, alive: Callable[[], bool]
) -> Applied:
    """Write what the followed file holds beyond the served database, in one transaction."""
    served.execute("ATTACH DATABASE ? AS followed", (read_uri(followed),))
    # The primary's write cache for the length of the change (2 MiB by default: a large
    # change re-read its index pages from the OS over and over); between changes, a read
    # connection's, so that the index pages a small change touches stay cached.
    served.execute(f"PRAGMA main.cache_size = -{WRITE_CACHE_KIB}")
    try:
        served.execute("BEGIN IMMEDIATE")
        try:
            applied = _apply(served, identity, alive)
        except BaseException:
            served.execute("ROLLBACK")
            raise
        served.execute("COMMIT")
        return applied
    finally:
        served.execute("DETACH DATABASE followed")
        served.execute(f"PRAGMA main.cache_size = -{READ_CACHE_KIB}")


def _apply(served: sqlite3.Connection, identity: str, alive: Callable[[], bool]) -> Applied:
    # The first read of the followed file takes its SHARED lock, kept to the end of the
    # transaction: from here the follower cannot write it.
    if identity_of(served, "followed") != identity:
        raise OtherPrimary("the store holds another primary's database")
    if not alive():
        raise FollowerGone
    (followed_seq,) = served.execute("SELECT change_seq FROM followed.sync_state").fetchone()
    (served_seq,) = served.execute("SELECT change_seq FROM main.sync_state").fetchone()
    if followed_seq < served_seq:
        raise StoreBehind
    _check_version(served, "followed")
    if _schema(served, "followed") != _schema(served, "main"):
        raise SchemaDiffers
    rows = 0
    if followed_seq > served_seq:
        # Named from the served table (the schemas are equal), so that the statement
        # follows the schema: SQLite identifiers, never input.
        columns = ", ".join(
            f'"{name}"' for _, name, *_ in served.execute("PRAGMA main.table_info(applicants)")
        )
        cursor = served.execute(
            f"INSERT OR REPLACE INTO main.applicants (rowid, {columns}) "
            f"SELECT rowid, {columns} FROM followed.applicants WHERE change_seq > ?",
            (served_seq,),
        )
        rows = cursor.rowcount
        # The dictionaries the rows' bodies are compressed with (applicants/bodies.py):
        # only ever added, so the new ones are those the served database lacks.
        served.execute(
            "INSERT OR IGNORE INTO main.body_dictionaries SELECT * FROM followed.body_dictionaries"
        )
        served.execute(
            "INSERT OR REPLACE INTO main.integration_versions "
            "SELECT * FROM followed.integration_versions WHERE change_seq > ?",
            (served_seq,),
        )
        served.execute("UPDATE main.sync_state SET change_seq = ?", (followed_seq,))
    rewritten = {table: _mirror(served, table) for table in _MIRRORED}
    tokens = rewritten["tokens"] or rewritten["token_permissions"]
    return Applied(int(followed_seq), rows, tokens)


# Small tables the replica holds as the primary has them, whole: who may read (tokens
# and their permissions), and the webhook subscriptions, which a replica lists but never
# sends to (its webhook events and attempts are the primary's business, not copied).
_MIRRORED: Final = ("tokens", "token_permissions", "webhook_subscriptions")


def _mirror(served: sqlite3.Connection, table: str) -> bool:
    """Make the served `table` (one of _MIRRORED) the followed one's; whether it differed."""
    (differ,) = served.execute(
        f"SELECT EXISTS (SELECT * FROM main.{table} EXCEPT SELECT * FROM followed.{table}) "
        f"OR EXISTS (SELECT * FROM followed.{table} EXCEPT SELECT * FROM main.{table})"
    ).fetchone()
    if differ:
        served.execute(f"DELETE FROM main.{table}")
        served.execute(f"INSERT INTO main.{table} SELECT * FROM followed.{table}")
    return bool(differ)


def _schema(connection: sqlite3.Connection, schema: str) -> list[tuple[str, str, str]]:
    return connection.execute(
        f"SELECT type, name, sql FROM {schema}.sqlite_schema ORDER BY type, name"
    ).fetchall()


def _check_version(connection: sqlite3.Connection, schema: str = "main") -> None:
    (version,) = connection.execute(f"PRAGMA {schema}.user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise ReplicaError(
            f"the primary's database has schema version {version}; this leasestar "
            f"understands up to {SCHEMA_VERSION}: upgrade leasestar on the replica"
        )
