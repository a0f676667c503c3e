"""Writing applicants: the upsert shared by `import` and `seed`, and NDJSON in and out.

Rules (CONTRACT.md, "Data in and out"):
  * The upsert key is (integration_id, x_property_id, x_id).
  * A record seen again keeps its id and created_at; updated_at moves only when a
    non-service field changed; last_seen moves to the time it was seen.
  * Service fields given in the input (`id`, `created_at`, `updated_at`, `last_seen`)
    are kept as given, each on its own, so an export restores exactly.
  * A line without service fields is a record as a source system reports it. Each
    missing one is filled: a new record gets a fresh random id (`app_` + 24 hex
    digits) and the import's start time as created_at, updated_at and last_seen; a
    record seen again keeps its stored id and created_at, keeps its updated_at unless
    a field changed (then the import's start time), and gets the import's start time
    as last_seen. Every record of one import is seen at the same instant.
  * Every row written gets the next change sequence number (`change_seq`), which is
    also the data version readers key caches on. A record seen again with nothing
    different, service fields included (re-importing an export), is not written at
    all: no row, no change sequence, no data version moves. A record seen again
    without service fields is written, because its last_seen moves and so does the
    JSON the API serves for it.

An import is one transaction (BEGIN IMMEDIATE ... COMMIT): every line is validated
before the transaction commits, and any bad line rolls everything back, so the
database is exactly as before, as it is when the process is killed at any moment
(SQLite's WAL ignores frames of a transaction that never committed). Readers are never
blocked: they keep reading the last committed snapshot until COMMIT.

Speed, without changing a byte of what is stored:
  * A line is decoded straight into the Structs by msgspec. When re-encoding the
    record gives back the line itself (every line of an export), the line holds no
    duplicate key, so the slower duplicate-key scan with the stdlib parser runs only
    for lines written some other way.
  * Each record is encoded once. The content hash (every non-service field) is taken
    over the tail of that encoding behind the four service fields, and the stored
    body is that encoding, or the same tail behind new service fields.
  * A large write (bulk: from `BULK_MIN_ROWS` rows, and at least a quarter of the
    rows already stored) drops the secondary indexes inside the transaction and
    builds them again, sorted, before COMMIT: maintaining twenty random-order indexes
    row by row costs far more once they outgrow the page cache. The indexes the upsert
    itself needs (the primary key and the source key) stay. A crash before COMMIT
    leaves the indexes as they were, like everything else. The builds sort on
    helper threads (`SORTER_THREADS`).
  * A large input is parsed (import, past `WORKER_AFTER_LINES` lines) or generated
    (seed) in a second process while this one writes, so the two share two cores.
    Seed's generator hands over records already encoded (`Generated`), so nothing
    builds or validates a Struct per generated record.
    The worker is spawned, not forked; like any multiprocessing spawn, a script that
    calls these functions must guard its entry point with `if __name__ == "__main__"`.
    It never outlives the process that started it, even one killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import re
import secrets
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from typing import IO, Any, Final, NamedTuple, NoReturn, Protocol

import msgspec

from leasestar.applicants.records import (
    APPLICANT_FIELDS,
    SERVICE_FIELDS,
    Applicant,
    applicant_encoder,
    applicant_line_decoder,
)
from leasestar.instants import INSTANT_RULE, format_instant, now_micros

# A real record is a few kilobytes; a line beyond this is refused without being read
# into memory whole.
MAX_LINE_BYTES: Final = 1 << 20
MAX_REPORTED_ERRORS: Final = 5
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
# cache (which also sizes the sorter's in-memory runs) shrinks to the sorter's smallest
# run (250 pages, 4 MB at 16 KB pages). Each CREATE INDEX then scans the table on this
# thread while helpers sort 4 MB runs on the other cores, then merges them: ~1 s an index
# at a million rows on two cores, against ~2 s for one 160 MB run sorted in one thread.
# The runs go to SQLite's temporary files (tens of MB an index, deleted as it finishes).
SORTER_THREADS: Final = min(4, os.cpu_count() or 1)
SORT_CACHE_KIB: Final = 4_000
# Never dropped: the source key, which the upsert reads while it writes, and the change
# sequence, which every write appends to in order (so keeping it costs nothing).
KEPT_INDEXES: Final = frozenset({"applicants_source_key", "applicants_change_seq"})
PROGRESS_EVERY: Final = 4096
# When the table is empty as a write begins, a record can only be found if this write
# stored its key. One byte per slot of the keys' hashes says which may have been stored,
# so most rows skip the lookup; a false positive only costs the lookup (~6% of rows at a
# million keys). 8 MB, whatever the file size.
WRITTEN_SLOTS: Final = 1 << 23

# The encoding of an Applicant starts with the four service fields, then x_id. The
# content hash covers everything from `,"x_id":` on, behind null service fields, which
# is byte for byte the encoding of the record with its service fields set to None.
assert APPLICANT_FIELDS[:5] == (*SERVICE_FIELDS, "x_id")
_TAIL_MARK: Final = b',"x_id":'
_NULL_SERVICE_HEAD: Final = b'{"id":null,"created_at":null,"updated_at":null,"last_seen":null'

_COLUMNS: Final = (
    "id, change_seq, integration_id, integration_vendor, x_id, x_property_id, property_id, "
    "created_at, updated_at, last_seen, first_name, middle_name, last_name, email_1, "
    "phone_1_digits, date_of_birth, city, state, zip, content_hash, body"
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


def _content_tail(encoded: bytes) -> int:
    """Where the non-service fields start in an applicant's encoding."""
    # Inside a JSON string every `"` is escaped, so the first `,"x_id":` is the key.
    return encoded.index(_TAIL_MARK)


def _content_digest(encoded: bytes, tail: int) -> bytes:
    digest = hashlib.blake2b(_NULL_SERVICE_HEAD, digest_size=16)
    digest.update(memoryview(encoded)[tail:])
    return digest.digest()


def content_hash(record: Applicant) -> bytes:
    """Hash of every non-service field: equal hashes mean nothing changed."""
    encoded = applicant_encoder.encode(record)
    return _content_digest(encoded, _content_tail(encoded))


_NOT_A_DIGIT: Final = re.compile(r"[^0-9]")


def _phone_digits(phone: str | None) -> str | None:
    """`query.phone_digits` (what the phone filter matches), in C: ASCII digits only."""
    if phone is None:
        return None
    return _NOT_A_DIGIT.sub("", phone) or None


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
        self._progress = progress
        self._bulk_min_rows = BULK_MIN_ROWS if bulk_min_rows is None else bulk_min_rows
        self._bulk_at = self._bulk_min_rows
        self._dropped: list[tuple[str, str]] = []
        self._pragmas: dict[str, int] = {}  # their values before this write
        self._written: bytearray | None = None
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
        self._db.execute("BEGIN IMMEDIATE")
        try:
            (self._change_seq,) = self._db.execute("SELECT change_seq FROM sync_state").fetchone()
            # Stored rows, estimated by the largest rowid (no scan of a large table).
            (stored,) = self._db.execute(
                "SELECT coalesce(max(rowid), 0) FROM applicants"
            ).fetchone()
        except BaseException:
            self._db.execute("ROLLBACK")
            self._restore_pragmas()
            raise
        self._bulk_at = max(self._bulk_min_rows, stored // BULK_FRACTION)
        self._written = bytearray(WRITTEN_SLOTS) if stored == 0 else None
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is not None:
                self._db.execute("ROLLBACK")
                return
            try:
                self._rebuild_indexes()
                self._db.execute("UPDATE sync_state SET change_seq = ?", (self._change_seq,))
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
            self._restore_pragmas()

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
        key, encoded, tail, digest = record.key, record.encoded, record.tail, record.digest
        slot = hash(key) & (len(self._written) - 1) if self._written is not None else 0
        if self._written is None or self._written[slot]:
            existing = self._cursor.execute(_FIND, key).fetchone()
        else:
            existing = None
        given_id, given_created, given_updated, given_last_seen = record.given
        last_seen = _micros(given_last_seen) if given_last_seen is not None else self._seen_at
        if existing is None:
            stored_id = given_id or new_applicant_id()
            created = _micros(given_created) if given_created is not None else self._seen_at
            updated = _micros(given_updated) if given_updated is not None else self._seen_at
        else:
            old_id, old_created, old_updated, old_last_seen, old_digest = existing
            if given_id is not None and given_id != old_id:
                # An applicant's id is how clients, cursors and the sync feed know it: a
                # changed id would leave them holding one that answers 404.
                raise RecordError(
                    f"id: this record (integration_id, x_property_id, x_id) is stored as "
                    f"{old_id!r}, and an applicant's id never changes"
                )
            changed = old_digest != digest
            stored_id = old_id
            created = _micros(given_created) if given_created is not None else old_created
            if given_updated is not None:
                updated = _micros(given_updated)
            else:
                updated = self._seen_at if changed else old_updated
            if not changed and (stored_id, created, updated, last_seen) == (
                old_id,
                old_created,
                old_updated,
                old_last_seen,
            ):
                self.counts.unchanged += 1
                return
        if (
            given_id is None
            or given_created is None
            or given_updated is None
            or given_last_seen is None
        ):
            encoded = b"".join(
                (
                    b'{"id":',
                    applicant_encoder.encode(stored_id),
                    b',"created_at":"',
                    format_instant(created).encode(),
                    b'","updated_at":"',
                    format_instant(updated).encode(),
                    b'","last_seen":"',
                    (
                        self._seen_text if given_last_seen is None else format_instant(last_seen)
                    ).encode(),
                    b'"',
                    memoryview(encoded)[tail:],
                )
            )
        self._change_seq += 1
        integration_id, x_property_id, x_id = key
        vendor, property_id, *person = record.columns
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
            digest,
            encoded.decode(),
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
        if not self._dropped and self.counts.inserted + self.counts.updated >= self._bulk_at:
            self._enter_bulk()


class Prepared(NamedTuple):
    """A valid record reduced to what writing it needs.

    Made where the record is parsed or generated (for a large input, in a worker
    process, so that work shares two cores with the SQLite writes), written by
    `ApplicantWriter.write`.
    """

    key: tuple[str, str, str]  # integration_id, x_property_id, x_id
    given: tuple[str | None, str | None, str | None, str | None]  # the service fields
    # integration_vendor, property_id, first_name, middle_name, last_name, email_1,
    # phone_1 digits, date_of_birth, city, state, zip: the typed columns after the key
    columns: tuple[str | None, ...]
    digest: bytes  # content hash: every non-service field
    encoded: bytes  # the record's canonical encoding
    tail: int  # where the non-service fields start in `encoded`


def prepare(record: Applicant, encoded: bytes | None = None) -> Prepared:
    """Reduce a valid record (and its encoding, if known) to what writing it needs."""
    if encoded is None:
        encoded = applicant_encoder.encode(record)
    return _prepared(encoded, _fields(record))


RecordFields = tuple[Any, ...]


def _fields(record: Applicant) -> RecordFields:
    """The fields writing needs, in the order `_prepared` takes them."""
    return (
        record.integration_id,
        record.x_property_id,
        record.x_id,
        record.id,
        record.created_at,
        record.updated_at,
        record.last_seen,
        record.integration_vendor,
        record.property_id,
        record.first_name,
        record.middle_name,
        record.last_name,
        record.email_1,
        record.phone_1,
        record.date_of_birth,
        record.city,
        record.state,
        record.zip,
    )


def _prepared(encoded: bytes, fields: RecordFields) -> Prepared:
    tail = _content_tail(encoded)
    (
        integration_id,
        x_property_id,
        x_id,
        record_id,
        created_at,
        updated_at,
        last_seen,
        vendor,
        property_id,
        first_name,
        middle_name,
        last_name,
        email_1,
        phone_1,
        date_of_birth,
        city,
        state,
        zip_code,
    ) = fields
    return Prepared(
        (integration_id, x_property_id, x_id),
        (record_id, created_at, updated_at, last_seen),
        (
            vendor,
            property_id,
            first_name,
            middle_name,
            last_name,
            email_1,
            _phone_digits(phone_1),
            date_of_birth,
            city,
            state,
            zip_code,
        ),
        _content_digest(encoded, tail),
        encoded,
        tail,
    )


# --- NDJSON in ---------------------------------------------------------------------


@dataclass(slots=True)
class ImportReport:
    """What an import did, or why it refused the file."""

    counts: WriteCounts = field(default_factory=WriteCounts)
    lines: int = 0
    errors: list[str] = field(default_factory=list)
    bad_lines: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


class ImportRefused(Exception):
    """The file was refused whole; nothing was written. The report says why."""

    def __init__(self, report: ImportReport) -> None:
        super().__init__("; ".join(report.errors))
        self.report = report


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RecordError(f"{key}: key appears more than once in one object")
            seen.add(key)
    return result


def _reject_constant(name: str) -> NoReturn:
    raise RecordError(f"(line): {name} is not valid JSON")


def _json_int(text: str) -> int:
    """A JSON integer for the stdlib parser, which `int()` would refuse past 4,300 digits
    with an error of its own. Anything over 20 characters is beyond 64 bits whatever its
    digits, so it stands in as 2**64 (sign kept): validation then names its field."""
    if len(text) > 20:
        return -(2**64) if text.startswith("-") else 2**64
    return int(text)


_LOCATION = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")
_FIELD_MESSAGE = re.compile(r"(?P<field>[A-Za-z0-9_.\[\]]+): (?P<reason>.*)", re.DOTALL)
# Struct checks that name their field first, without a colon ("custom_data holds ...").
_FIELD_FIRST = re.compile(r"(?P<field>custom_data) (?P<reason>.*)", re.DOTALL)


def describe_validation_error(error: msgspec.ValidationError) -> str:
    """msgspec's message as `field.path: reason` (the form the CLI reports)."""
    match = _LOCATION.match(str(error))
    assert match is not None  # the pattern matches any text
    message, path = match["message"], (match["path"] or "").lstrip(".")
    field_name, reason = "", message
    if missing := _MISSING.fullmatch(message):
        field_name, reason = missing["field"], "required field is missing"
    elif unknown := _UNKNOWN.fullmatch(message):
        field_name, reason = unknown["field"], "unknown field"
    elif named := _FIELD_MESSAGE.fullmatch(message) or _FIELD_FIRST.fullmatch(message):
        field_name, reason = named["field"], named["reason"]
    else:
        reason = message[:1].lower() + message[1:]
    if reason == INSTANT_RULE:
        reason = f"must be {reason}"
    location = ".".join(part for part in (path, field_name) if part).replace(".[", "[")
    return f"{location or '(record)'}: {reason}"


def _describe_decode_error(error: Exception) -> str:
    """A message for what msgspec refused that the stdlib parser accepted."""
    if isinstance(error, msgspec.ValidationError):
        return describe_validation_error(error)
    match = _LOCATION.match(str(error))
    assert match is not None
    message, path = match["message"], (match["path"] or "").lstrip(".")
    message = message[:1].lower() + message[1:]
    if path:
        return f"{path.replace('.[', '[')}: {message}"
    return f"(line): not valid JSON ({message})"


def _diagnose(raw: bytes, fast_error: Exception) -> RecordError:
    """Why a line msgspec refused is bad, said as precisely as possible."""
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        return RecordError(f"(line): invalid UTF-8 at byte {error.start}")
    try:
        document = json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_int=_json_int,
        )
    except RecordError as error:
        return error
    except RecursionError:
        return RecordError("(line): JSON is nested too deeply")
    except json.JSONDecodeError as error:
        # The column counts characters from the start of the line, 1 first.
        return RecordError(f"(line): not valid JSON ({error.msg} at column {error.pos + 1})")
    if not isinstance(document, dict):
        return RecordError("(line): each line must be one JSON object (an applicant)")
    try:
        msgspec.convert(document, Applicant)
    except msgspec.ValidationError as error:
        return RecordError(describe_validation_error(error))
    except RecursionError:
        return RecordError("(line): JSON is nested too deeply")
    # The stdlib parser read it but msgspec refused it.
    try:
        applicant_encoder.encode(document)
    except UnicodeEncodeError:
        return RecordError("(line): a \\u escape is a lone UTF-16 surrogate, not a character")
    return RecordError(_describe_decode_error(fast_error))


def _check_duplicate_keys(raw: bytes) -> None:
    """Refuse a line where an object repeats a key (msgspec would keep the last)."""
    try:
        json.loads(
            raw,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_int=_json_int,
        )
    except RecordError:
        raise
    except (ValueError, RecursionError):
        # msgspec read the line, so this cannot happen for well-formed JSON; say so.
        raise RecordError("(line): not valid JSON") from None


def parse_applicant(raw: bytes) -> tuple[Applicant, bytes]:
    """Validate one NDJSON line into an Applicant, with its canonical encoding.

    Raises RecordError (`field: reason`). What is accepted is exactly what the stdlib
    parser with a duplicate-key check, then msgspec's Structs, both accept.
    """
    try:
        record = applicant_line_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeError) as error:
        raise _diagnose(raw, error) from None
    encoded = applicant_encoder.encode(record)
    if encoded != raw.rstrip(b"\r\n"):
        # Not written the way we write: it might hide a repeated key.
        _check_duplicate_keys(raw)
    return record, encoded


def parse_line(raw: bytes) -> Applicant:
    """Validate one NDJSON line into an Applicant (raises RecordError)."""
    return parse_applicant(raw)[0]


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes | None, int]]:
    """Yield (line number, line, bytes read so far); a line over the size limit is None.

    An over-long line is skipped in pieces, never read whole.
    """
    number = 0
    position = 0
    readline = stream.readline
    while True:
        line = readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        position += len(line)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = readline(MAX_LINE_BYTES)
                position += len(line)
            yield number, None, position
            continue
        if number == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]  # a UTF-8 byte order mark, as some editors write
        yield number, line, position


def import_ndjson(
    connection: sqlite3.Connection,
    stream: IO[bytes],
    progress: ProgressReporter | None = None,
    *,
    seen_at: int | None = None,
    bulk_min_rows: int | None = None,
    worker_after_lines: int | None = None,
) -> ImportReport:
    """Upsert every line of an NDJSON stream in one transaction, or refuse the file whole.

    Raises ImportRefused (with the first few line errors) and writes nothing when any
    line is bad or the file holds no records. `seen_at` (UTC microseconds) is the
    instant the records are seen, by default now. Past `worker_after_lines` lines
    (default WORKER_AFTER_LINES; 0 = never) the lines are parsed in a worker process.
    """
    report = ImportReport()
    writer = ApplicantWriter(connection, seen_at, progress=progress, bulk_min_rows=bulk_min_rows)
    after = WORKER_AFTER_LINES if worker_after_lines is None else worker_after_lines
    try:
        with writer:
            outcomes = _parsed_lines(stream, report, progress, after)
            try:
                for number, outcome in outcomes:
                    if isinstance(outcome, str):
                        _record_error(report, number, outcome)
                    elif report.ok:
                        try:
                            writer.write(outcome)
                        except RecordError as error:
                            _record_error(report, number, str(error))
            finally:
                outcomes.close()  # stops the worker, if any, whatever happened
            if report.ok and writer.counts.seen == 0:
                report.errors.append(
                    f"line {max(report.lines, 1)}: (file): no applicant records "
                    "(the file is empty or blank)"
                )
            if not report.ok:
                raise ImportRefused(report)
    finally:
        report.counts = writer.counts
    return report


Outcome = tuple[int, "Prepared | str"]  # (line number, the record or what is wrong)


def _parse_batch(batch: list[tuple[int, bytes | None]]) -> list[Outcome]:
    """Parse lines (None: one over the size limit) into prepared records or errors."""
    outcomes: list[Outcome] = []
    for number, raw in batch:
        if raw is None:
            outcomes.append((number, f"(line): longer than {MAX_LINE_BYTES} bytes"))
            continue
        try:
            record, encoded = parse_applicant(raw)
        except RecordError as error:
            outcomes.append((number, str(error)))
        else:
            outcomes.append((number, prepare(record, encoded)))
    return outcomes


def _parsed_lines(
    stream: IO[bytes],
    report: ImportReport,
    progress: ProgressReporter | None,
    worker_after_lines: int,
) -> Generator[Outcome, None, None]:
    """Every non-blank line, parsed, in order: inline at first, then in a worker process.

    A small file never pays for a process; a large one is parsed on one core while the
    writes run on the other. At most WORKER_IN_FLIGHT batches are in the worker's hands,
    so memory stays flat.
    """
    worker: _Worker | None = None
    batch: list[tuple[int, bytes | None]] = []
    in_flight = 0
    try:
        for number, line, position in _lines(stream):
            report.lines = number
            if progress is not None and number % PROGRESS_EVERY == 0:
                progress.advance(number, position)
            if line is not None and line.isspace():
                continue  # a blank line separates nothing; tolerated
            if worker is None:
                if not worker_after_lines or number <= worker_after_lines:
                    yield from _parse_batch([(number, line)])
                    continue
                worker = _Worker(_parse_worker, decoder=_OUTCOMES, inbox=True)
            batch.append((number, line))
            if len(batch) == WORKER_BATCH:
                worker.send(_MESSAGES.encode(batch))
                batch, in_flight = [], in_flight + 1
                if in_flight == WORKER_IN_FLIGHT:
                    yield from worker.receive()
                    in_flight -= 1
        if worker is not None:
            if batch:
                worker.send(_MESSAGES.encode(batch))
                in_flight += 1
            for _ in range(in_flight):
                yield from worker.receive()
    finally:
        if worker is not None:
            worker.close()


def _record_error(report: ImportReport, number: int, message: str) -> None:
    report.bad_lines += 1
    if len(report.errors) < MAX_REPORTED_ERRORS:
        report.errors.append(f"line {number}: {_one_line(message)}")


# Control characters (a key may hold a newline or an escape sequence) and the Unicode
# line separators: written escaped, so one error is one line and cannot drive a terminal.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MAX_MESSAGE_CHARS: Final = 300


def _one_line(message: str) -> str:
    """The message on one line, escaped and cut to a readable length."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    return _UNPRINTABLE.sub(lambda match: repr(match[0])[1:-1], message)


# What a generator yields: a record, or (from a trusted generator, seed's) a record
# already in stored form: its canonical encoding, byte for byte what
# `applicant_encoder` writes for it, and the fields `_fields` would take from it. The
# second is written as it is, without building and validating Structs that would
# only be encoded again; the generator's tests hold it to that encoding.
Generated = Applicant | tuple[bytes, RecordFields]


def _prepare_generated(item: Generated) -> Prepared:
    if isinstance(item, Applicant):
        return prepare(item)
    encoded, fields = item
    return _prepared(encoded, fields)


def write_records(
    connection: sqlite3.Connection,
    records: Iterable[Generated],
    progress: ProgressReporter | None = None,
) -> WriteCounts:
    """Upsert records (valid Structs, or trusted encodings: `Generated`) in one transaction."""
    writer = ApplicantWriter(connection, progress=progress)
    with writer:
        for done, record in enumerate(records, 1):
            writer.write(_prepare_generated(record))
            if progress is not None and done % PROGRESS_EVERY == 0:
                progress.advance(done)
    return writer.counts


def write_generated(
    connection: sqlite3.Connection,
    produce: Callable[..., Iterable[Generated]],
    *args: Any,
    progress: ProgressReporter | None = None,
    in_worker: bool = True,
) -> WriteCounts:
    """Upsert the records `produce(*args)` yields, in one transaction; used by `seed`.

    With `in_worker`, a worker process runs `produce` (a module-level function) and
    prepares the records (encoding, content hash) while this process writes them:
    generating and writing share two cores.
    """
    if not in_worker:
        return write_records(connection, produce(*args), progress)
    writer = ApplicantWriter(connection, progress=progress)
    worker = _Worker(_produce_worker, produce, args, decoder=_PREPARED)
    try:
        with writer:
            done = 0
            while (batch := worker.receive()) is not None:
                for record in batch:
                    writer.write(record)
                done += len(batch)
                if progress is not None:
                    progress.advance(done)
    finally:
        worker.close()
    return writer.counts


# --- the worker process ----------------------------------------------------------------

# Lines an import parses itself before a worker process takes over (a small file never
# pays for starting one: ~0.2 s).
WORKER_AFTER_LINES: Final = 8192
# Records a seed generates itself rather than in a worker.
WORKER_MIN_RECORDS: Final = 20_000
WORKER_BATCH: Final = 512
WORKER_IN_FLIGHT: Final = 4
WORKER_POLL_SECONDS: Final = 0.5
WORKER_PIPE_BYTES: Final = 1 << 20  # Linux's default limit for an unprivileged pipe


class WorkerFailed(Exception):
    """The worker process failed or stopped; the message is one line."""


@dataclass(frozen=True, slots=True)
class _Failure:
    """What a worker sends instead of a result when it fails (its last words)."""

    message: str


# Between the processes, batches travel as msgpack (msgspec), not pickle: several
# times cheaper for lists of tuples of strings and bytes, and typed on arrival. Each
# message is one tag byte and its payload.
_MESSAGES = msgspec.msgpack.Encoder()
_LINES = msgspec.msgpack.Decoder(list[tuple[int, bytes | None]])
_OUTCOMES = msgspec.msgpack.Decoder(list[tuple[int, Prepared | str]])
_PREPARED = msgspec.msgpack.Decoder(list[Prepared])
_BATCH, _END, _FAILED = b"B", b"E", b"F"


class _Worker:
    """A spawned process running `target(parent_pid, inbox, results, *args)`.

    The parent feeds `inbox` (a queue: its feeder thread writes, so feeding never
    blocks on a busy worker) and reads `results`, a pipe the worker writes itself: a
    full pipe holds the worker back, which bounds memory, and costs it no extra thread.
    """

    def __init__(
        self,
        target: Callable[..., None],
        *args: Any,
        decoder: msgspec.msgpack.Decoder[Any],
        inbox: bool = False,
    ) -> None:
        # spawn, not fork: the parent may hold SQLite connections and other threads.
        context = multiprocessing.get_context("spawn")
        self._decoder = decoder
        self._inbox: multiprocessing.Queue[bytes | None] | None = context.Queue() if inbox else None
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=target, args=(os.getpid(), self._inbox, sender, *args), daemon=True
        )
        self._process.start()
        sender.close()  # the worker holds the only writing end: its exit is our EOF
        _widen(self._results.fileno())
        if self._inbox is not None:
            _widen(self._inbox._writer.fileno())  # type: ignore[attr-defined]

    def send(self, message: bytes) -> None:
        assert self._inbox is not None
        self._inbox.put(message)

    def receive(self) -> Any:
        """The next batch, decoded; None once the worker has sent everything."""
        try:
            while not self._results.poll(WORKER_POLL_SECONDS):
                if not self._process.is_alive():
                    raise EOFError
            message = self._results.recv_bytes()
        except EOFError:
            self._process.join(WORKER_POLL_SECONDS)
            raise WorkerFailed(
                f"the worker process stopped (exit code {self._process.exitcode})"
            ) from None
        tag, payload = message[:1], memoryview(message)[1:]
        if tag == _FAILED:
            raise WorkerFailed(f"the worker process failed: {bytes(payload).decode()}")
        if tag == _END:
            return None
        return self._decoder.decode(payload)

    def close(self) -> None:
        """Stop the process now (its work is either all received or no longer wanted)."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._process.close()
        self._results.close()
        if self._inbox is not None:
            self._inbox.cancel_join_thread()  # never wait to feed a process that is gone
            self._inbox.close()


def _widen(pipe: int) -> None:
    """Let a pipe hold a whole batch (Linux): one write and one read, not sixteen each."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, WORKER_PIPE_BYTES)


def _run_worker(parent: int, results: Connection, work: Callable[[], None]) -> None:
    """Common to workers: the parent handles ^C; any failure goes back as one line.

    A watchdog thread ends the process as soon as the parent is gone (killed, say),
    whatever the work is blocked on, so a worker never outlives its import.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:  # `parent` is the pid it had before starting us: no race
        while os.getppid() == parent:
            time.sleep(WORKER_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    try:
        work()
    except BaseException as error:  # reported to the parent, never printed here
        with contextlib.suppress(OSError):
            results.send_bytes(_FAILED + f"{type(error).__name__}: {error}".encode())


def _send_batch(results: Connection, batch: Any) -> None:
    results.send_bytes(_BATCH + _MESSAGES.encode(batch))


def _parse_worker(
    parent: int, inbox: multiprocessing.Queue[bytes | None], results: Connection
) -> None:
    def work() -> None:
        while (message := inbox.get()) is not None:
            _send_batch(results, _parse_batch(_LINES.decode(message)))

    _run_worker(parent, results, work)


def _produce_worker(
    parent: int,
    inbox: None,
    results: Connection,
    produce: Callable[..., Iterable[Generated]],
    args: tuple[Any, ...],
) -> None:
    def work() -> None:
        # The whole of `prepare` (the content hash too) runs here, as in an import's
        # worker: the writer's share of a row is then little more than its INSERT.
        batch = []
        for record in produce(*args):
            batch.append(_prepare_generated(record))
            if len(batch) == WORKER_BATCH:
                _send_batch(results, batch)
                batch = []
        if batch:
            _send_batch(results, batch)
        results.send_bytes(_END)

    _run_worker(parent, results, work)


# --- NDJSON out --------------------------------------------------------------------

EXPORT_BATCH: Final = 512


def export_ndjson(
    connection: sqlite3.Connection,
    out: IO[bytes],
    progress: ProgressReporter | None = None,
) -> int:
    """Write every applicant, exactly as served, one per line in id order."""
    count = 0
    # The bodies are written as SQLite holds them: no decode to str and encode back.
    text_factory = connection.text_factory
    connection.text_factory = bytes
    # One read transaction: the export is one consistent snapshot.
    connection.execute("BEGIN")
    try:
        cursor = connection.execute("SELECT body FROM applicants ORDER BY id")
        while rows := cursor.fetchmany(EXPORT_BATCH):
            out.write(b"\n".join([body for (body,) in rows]))
            out.write(b"\n")
            count += len(rows)
            if progress is not None:
                progress.advance(count)
    finally:
        connection.execute("COMMIT")
        connection.text_factory = text_factory
    return count
