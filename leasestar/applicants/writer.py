"""The upsert shared by `import` and `seed`: one write transaction, record by record.

The rules (CONTRACT.md, "Data in and out") and why a large write drops and rebuilds
the secondary indexes: docs/write-path.md.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from leasestar.applicants.bodies import BodyEncoder
from leasestar.applicants.prepared import Prepared, prepare
from leasestar.applicants.records import Applicant, applicant_encoder
from leasestar.instants import format_instant, now_micros
from leasestar.webhooks.outbox import Outbox, subscribed

# A write switches to bulk mode (secondary indexes rebuilt at the end) after this many
# rows, and only once it has written at least a quarter as many rows as were stored.
# Rebuilding costs one sorted pass per index over the whole table; keeping twenty
# indexes row by row costs ~50 us a row even while they fit in the cache, and far more
# once they do not. Once a write is a good share of what is stored, rebuilding wins.
BULK_MIN_ROWS: Final = 5_000
BULK_FRACTION: Final = 4
# Page cache of a write, in KiB: room for the primary key and source key of a million
# applicants, and for the sorter's runs while indexes are built. Bounded, so memory
# stays flat whatever the file size.
WRITE_CACHE_KIB: Final = 160_000
# While the dropped indexes are built again: SQLite's sorter gets helper threads, and the
# cache (which also sizes the sorter's in-memory runs) shrinks to 4 MB (SQLite's floor
# for a run is 250 pages). Each CREATE INDEX then scans the table on this
# thread while helpers sort 4 MB runs on the other cores, then merges them: ~1 s an index
# at a million rows on two cores, against ~2 s for one 160 MB run sorted in one thread.
# The runs go to SQLite's temporary files (tens of MB an index, deleted as it finishes).
SORTER_THREADS: Final = min(4, os.cpu_count() or 1)
SORT_CACHE_KIB: Final = 4_000
# Never dropped: the source key, which the upsert reads while it writes, and the change
# sequence, which every write appends to in order (so keeping it costs nothing).
KEPT_INDEXES: Final = frozenset({"applicants_source_key", "applicants_change_seq"})
# When the table is empty as a write begins, a record can only be found if this write
# stored its key. One byte per slot of the keys' hashes says which may have been stored,
# so most rows skip the lookup; a false positive only costs the lookup (~6% of rows at a
# million keys). 8 MB, whatever the file size.
WRITTEN_SLOTS: Final = 1 << 23

_COLUMNS: Final = (
    "id, change_seq, integration_id, integration_vendor, x_id, x_property_id, property_id, "
    "created_at, updated_at, last_seen, first_name, middle_name, last_name, email_1, "
    "phone_1_digits, date_of_birth, city, state, zip, content_hash, body"
)
_MOVE_INTEGRATION_VERSIONS: Final = (
    "INSERT INTO integration_versions (integration_id, change_seq) "
    "SELECT integration_id, max(change_seq) FROM applicants WHERE change_seq > ? "
    "GROUP BY integration_id "
    "ON CONFLICT (integration_id) DO UPDATE SET change_seq = excluded.change_seq"
)
_INSERT: Final = f"INSERT INTO applicants ({_COLUMNS}) VALUES ({', '.join('?' * 21)})"
_UPDATE: Final = (
    "UPDATE applicants SET "
    + ", ".join(f"{column.strip()} = ?" for column in _COLUMNS.split(","))
    + " WHERE id = ?"
)
_FIND: Final = (
    "SELECT id, created_at, updated_at, last_seen, content_hash FROM applicants "
    "WHERE integration_id = ? AND x_property_id = ? AND x_id = ?"
)
# The same, with the stored body a DATA_UPDATE event is the difference from.
_FIND_WITH_BODY: Final = _FIND.replace("content_hash FROM", "content_hash, body FROM")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


class RecordError(ValueError):
    """A record cannot be stored; the message is `field: reason`."""


class ProgressReporter(Protocol):
    """Where long work reports how far it is (the CLI draws it on a terminal)."""

    def advance(self, done: int, position: int = 0) -> None:
        """`done` records (lines) so far; `position` bytes read, when reading a file."""

    def phase(self, label: str) -> None:
        """A new stage of the work has started (building indexes, committing)."""


@dataclass(slots=True)
class WriteCounts:
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0

    @property
    def seen(self) -> int:
        return self.inserted + self.updated + self.unchanged


def new_applicant_id() -> str:
    return "app_" + secrets.token_hex(12)


def _micros(served: str) -> int:
    """UTC microseconds of an instant already in the served form (Structs normalise)."""
    return (datetime.fromisoformat(served) - _EPOCH) // _MICROSECOND


class ApplicantWriter:
    """Upserts records inside one write transaction on a plain sqlite3 connection."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        seen_at: int | None = None,
        *,
        progress: ProgressReporter | None = None,
        bulk_min_rows: int | None = None,
    ) -> None:
        self._db = connection
        self._cursor = connection.cursor()
        # The API represents milliseconds: the stored instant is what is served.
        self._seen_at = seen_at - seen_at % 1000 if seen_at is not None else now_micros()
        self._seen_text = format_instant(self._seen_at)
        self._change_seq = 0
        self._first_seq = 0  # the sequence before this transaction's first write
        self._progress = progress
        self._bulk_min_rows = BULK_MIN_ROWS if bulk_min_rows is None else bulk_min_rows
        self._bulk_at = self._bulk_min_rows
        self._dropped: list[tuple[str, str]] = []
        self._pragmas: dict[str, int] = {}  # their values before this write
        self._written: bytearray | None = None
        self._bodies: BodyEncoder | None = None  # from the transaction's start
        self._outbox: Outbox | None = None  # while a webhook subscription is active
        self._find = _FIND
        self._left_wal = False
        self.counts = WriteCounts()

    @property
    def bulk(self) -> bool:
        """True once the secondary indexes are dropped, to be built again at commit."""
        return bool(self._dropped)

    def __enter__(self) -> ApplicantWriter:
        # IMMEDIATE: take the write lock now, so a concurrent writer fails fast here
        # rather than half-way through a file. Readers carry on (WAL).
        # A larger page cache for the length of the write: the default 2 MB spills
        # dirty pages to the WAL after a few thousand rows. Pages are allocated as used.
        self._set_pragma("cache_size", -WRITE_CACHE_KIB)
        self._leave_wal_if_empty_and_alone()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._restore_journal()
            raise
        try:
            (self._change_seq,) = self._db.execute("SELECT change_seq FROM sync_state").fetchone()
            self._first_seq = self._change_seq
            # Stored rows, estimated by the largest rowid (no scan of a large table).
            (stored,) = self._db.execute(
                "SELECT coalesce(max(rowid), 0) FROM applicants"
            ).fetchone()
            self._bodies = BodyEncoder(self._db)
            if subscribed(self._db):
                self._outbox = Outbox(self._db)
                self._find = _FIND_WITH_BODY
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled back already (a full disk)
                self._db.execute("ROLLBACK")
            self._restore_journal()
            self._restore_pragmas()
            raise
        self._bulk_at = max(self._bulk_min_rows, stored // BULK_FRACTION)
        self._written = bytearray(WRITTEN_SLOTS) if stored == 0 else None
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is not None:
                # A full disk or an I/O error rolls the transaction back inside SQLite; a
                # ROLLBACK then would replace that cause with "no transaction is active".
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                return
            try:
                self._rebuild_indexes()
                self._db.execute("UPDATE sync_state SET change_seq = ?", (self._change_seq,))
                if self._change_seq > self._first_seq:
                    # Each written integration's version: the rows of this transaction,
                    # found by the change_seq index (kept in bulk mode too).
                    self._db.execute(_MOVE_INTEGRATION_VERSIONS, (self._first_seq,))
                if self._progress is not None:
                    self._progress.phase("committing")
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            if self._dropped:
                # A bulk write leaves a WAL as large as what it wrote: copy it into the
                # database now and truncate it, rather than leave it to whoever writes
                # next. Best effort: a reader still on an older snapshot may hold it.
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            self._restore_journal()
            self._restore_pragmas()

    def _leave_wal_if_empty_and_alone(self) -> None:
        """Write through a rollback journal when nothing is stored and nobody else reads.

        In WAL mode every page a transaction spills from the cache goes to the WAL, and
        SQLite finds a page there by probing one hash table per 4,096 frames, newest
        first: at ten million applicants (17 GB, four million frames) a read of a page
        not in the cache costs about a thousand probes, and building the indexes reads
        every page again and again (that seed had not finished after two hours). A
        rollback journal keeps only the pages that existed before the write (a handful,
        here); pages added at the file's end are written in place and read from the
        file. A failure or a kill still leaves the database as it was.
        """
        if self._db.execute("SELECT 1 FROM applicants LIMIT 1").fetchone() is not None:
            return
        try:
            # SQLite refuses to leave WAL while another connection has the file open (a
            # server, a replica's Litestream): the write then stays in the WAL, for them.
            (mode,) = self._db.execute("PRAGMA journal_mode = DELETE").fetchone()
        except sqlite3.OperationalError:
            return
        self._left_wal = mode == "delete"

    def _restore_journal(self) -> None:
        if self._left_wal:
            self._left_wal = False
            # Entering WAL needs no other connection's consent. Should it fail anyway,
            # every later open for writing (a server's start included) sets WAL again.
            with contextlib.suppress(sqlite3.OperationalError):
                self._db.execute("PRAGMA journal_mode = WAL").fetchone()

    def _set_pragma(self, name: str, value: int) -> None:
        """Set a connection setting for the length of this write (`name` is ours)."""
        (before,) = self._db.execute(f"PRAGMA {name}").fetchone()
        self._pragmas.setdefault(name, int(before))
        self._db.execute(f"PRAGMA {name} = {int(value)}")

    def _restore_pragmas(self) -> None:
        for name, value in self._pragmas.items():
            self._db.execute(f"PRAGMA {name} = {value}")
        self._pragmas.clear()

    def _enter_bulk(self) -> None:
        """Drop the secondary indexes for the rest of the transaction (built again at exit)."""
        indexes = self._db.execute(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'index' "
            "AND tbl_name = 'applicants' AND sql IS NOT NULL ORDER BY name"
        ).fetchall()
        for name, sql in indexes:
            if name not in KEPT_INDEXES:
                self._db.execute(f'DROP INDEX "{name}"')
                self._dropped.append((name, sql))

    def _rebuild_indexes(self) -> None:
        if not self._dropped:
            return
        # Restored with the other settings when the write ends (SORTER_THREADS says why).
        self._set_pragma("threads", SORTER_THREADS)
        self._set_pragma("cache_size", -SORT_CACHE_KIB)
        for number, (_name, sql) in enumerate(self._dropped, 1):
            if self._progress is not None:
                self._progress.phase(f"building indexes {number}/{len(self._dropped)}")
            self._db.execute(sql)

    def upsert(self, record: Applicant, encoded: bytes | None = None) -> None:
        """Insert or update one record by its source key (raises RecordError).

        `encoded` is the record's encoding when the caller already has it.
        """
        self.write(prepare(record, encoded))

    def write(self, record: Prepared) -> None:
        """Insert or update one prepared record by its source key (raises RecordError)."""
        slot = hash(record.key) & (len(self._written) - 1) if self._written is not None else 0
        if self._written is None or self._written[slot]:
            existing = self._cursor.execute(self._find, record.key).fetchone()
        else:
            existing = None
        stamps = self._service_fields(record, existing)
        if stamps is None:
            self.counts.unchanged += 1
            return
        self._change_seq += 1
        stored_id, created, updated, last_seen = stamps
        integration_id, x_property_id, x_id = record.key
        vendor, property_id, *person = record.columns
        body = self._body(record, stamps)
        stored_body = self._encoder.encode(body)
        row = (
            stored_id,
            self._change_seq,
            integration_id,
            vendor,
            x_id,
            x_property_id,
            property_id,
            created,
            updated,
            last_seen,
            *person,
            record.digest,
            stored_body,
        )
        try:
            if existing is None:
                self._cursor.execute(_INSERT, row)
                self.counts.inserted += 1
                if self._written is not None:
                    self._written[slot] = 1
            else:
                self._cursor.execute(_UPDATE, (*row, existing[0]))
                self.counts.updated += 1
        except sqlite3.IntegrityError:
            raise RecordError(f"id: {stored_id!r} already belongs to another applicant") from None
        if self._outbox is not None:
            where = (integration_id, str(property_id))
            if existing is None:
                self._outbox.new(self._change_seq, stored_id, where, stored_body)
            elif existing[4] != record.digest or (created, updated) != existing[1:3]:
                # (Only last_seen moved otherwise: no event, outbox.py says why.)
                self._outbox.update(self._change_seq, stored_id, where, existing[5], body)
        if not self._dropped and self.counts.inserted + self.counts.updated >= self._bulk_at:
            self._enter_bulk()

    @property
    def _encoder(self) -> BodyEncoder:
        if self._bodies is None:
            raise RuntimeError("ApplicantWriter.write outside its `with` block")
        return self._bodies

    def _service_fields(
        self, record: Prepared, existing: tuple[Any, ...] | None
    ) -> tuple[str, int, int, int] | None:
        """(id, created_at, updated_at, last_seen) to store; None when nothing would change."""
        given_id, given_created, given_updated, given_last_seen = record.given
        last_seen = _micros(given_last_seen) if given_last_seen is not None else self._seen_at
        if existing is None:
            stored_id = given_id or new_applicant_id()
            created = _micros(given_created) if given_created is not None else self._seen_at
            updated = _micros(given_updated) if given_updated is not None else self._seen_at
            return stored_id, created, updated, last_seen
        old_id, old_created, old_updated, old_last_seen, old_digest = existing[:5]
        if given_id is not None and given_id != old_id:
            # An applicant's id is how clients, cursors and the sync feed know it: a
            # changed id would leave them holding one that answers 404.
            raise RecordError(
                f"id: this record (integration_id, x_property_id, x_id) is stored as "
                f"{old_id!r}, and an applicant's id never changes"
            )
        changed = old_digest != record.digest
        created = _micros(given_created) if given_created is not None else old_created
        if given_updated is not None:
            updated = _micros(given_updated)
        else:
            updated = self._seen_at if changed else old_updated
        stamps = (old_id, created, updated, last_seen)
        if not changed and stamps == (old_id, old_created, old_updated, old_last_seen):
            return None
        return stamps

    def _body(self, record: Prepared, stamps: tuple[str, int, int, int]) -> bytes:
        """The JSON to store: the record's encoding, behind the stored service fields."""
        if None not in record.given:
            return record.encoded  # every service field given: the encoding holds them
        stored_id, created, updated, last_seen = stamps
        return b"".join(
            (
                b'{"id":',
                applicant_encoder.encode(stored_id),
                b',"created_at":"',
                format_instant(created).encode(),
                b'","updated_at":"',
                format_instant(updated).encode(),
                b'","last_seen":"',
                (
                    self._seen_text if record.given[3] is None else format_instant(last_seen)
                ).encode(),
                b'"',
                memoryview(record.encoded)[record.tail :],
            )
        )
