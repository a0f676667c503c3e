"""Writing applicants: the upsert shared by `import` and `seed`, and NDJSON in and out.

Rules (CONTRACT.md, "Data in and out"):
  * The upsert key is (integration_id, x_property_id, x_id).
  * A record seen again keeps its id and created_at; updated_at moves only when a
    non-service field changed; last_seen moves to the time it was seen.
  * Service fields given in the input are kept as given, so an export restores.
  * A new record without service fields gets a fresh random id (`app_` + 24 hex
    digits) and the import's start time as created_at, updated_at and last_seen.
  * Every row written gets the next change sequence number; a record seen again
    with nothing different (same fields and service fields) is not written at all.

An import is one transaction: every line is validated before the transaction
commits, and any bad line rolls everything back, so the database is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, NoReturn

import msgspec

from app.applicants.query import phone_digits
from app.applicants.records import Applicant, applicant_encoder
from app.instants import format_instant, now_micros, parse_instant

# A real record is a few kilobytes; a line beyond this is refused without being read
# into memory whole.
MAX_LINE_BYTES: Final = 1 << 20
MAX_REPORTED_ERRORS: Final = 5
_NO_SERVICE_FIELDS: Final = {"id": None, "created_at": None, "updated_at": None, "last_seen": None}

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


class RecordError(ValueError):
    """A record cannot be stored; the message is `field: reason`."""


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


def content_hash(record: Applicant) -> bytes:
    """Hash of every non-service field: equal hashes mean nothing changed."""
    content = msgspec.structs.replace(record, **_NO_SERVICE_FIELDS)
    return hashlib.blake2b(applicant_encoder.encode(content), digest_size=16).digest()


class ApplicantWriter:
    """Upserts records inside one write transaction on a plain sqlite3 connection."""

    def __init__(self, connection: sqlite3.Connection, seen_at: int | None = None) -> None:
        self._db = connection
        self._seen_at = seen_at if seen_at is not None else now_micros()
        self._change_seq = 0
        self.counts = WriteCounts()

    def __enter__(self) -> ApplicantWriter:
        # IMMEDIATE: take the write lock now, so a concurrent writer fails fast here
        # rather than half-way through a file. Readers carry on (WAL).
        self._db.execute("BEGIN IMMEDIATE")
        (self._change_seq,) = self._db.execute("SELECT change_seq FROM sync_state").fetchone()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._db.execute("UPDATE sync_state SET change_seq = ?", (self._change_seq,))
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")

    def upsert(self, record: Applicant) -> None:
        """Insert or update one record by its source key (raises RecordError)."""
        digest = content_hash(record)
        existing = self._db.execute(
            "SELECT id, created_at, updated_at, last_seen, content_hash FROM applicants "
            "WHERE integration_id = ? AND x_property_id = ? AND x_id = ?",
            (record.integration_id, record.x_property_id, record.x_id),
        ).fetchone()
        seen = self._seen_at
        if existing is None:
            stored_id = record.id or new_applicant_id()
            created = _given(record.created_at, seen)
            updated = _given(record.updated_at, seen)
            last_seen = _given(record.last_seen, seen)
        else:
            old_id, old_created, old_updated, old_last_seen, old_digest = existing
            changed = old_digest != digest
            stored_id = record.id or old_id
            created = _given(record.created_at, old_created)
            updated = _given(record.updated_at, seen if changed else old_updated)
            last_seen = _given(record.last_seen, seen)
            if (stored_id, created, updated, last_seen) == (
                old_id,
                old_created,
                old_updated,
                old_last_seen,
            ) and not changed:
                self.counts.unchanged += 1
                return
        stored = msgspec.structs.replace(
            record,
            id=stored_id,
            created_at=format_instant(created),
            updated_at=format_instant(updated),
            last_seen=format_instant(last_seen),
        )
        self._change_seq += 1
        row = (
            stored_id,
            self._change_seq,
            record.integration_id,
            record.integration_vendor,
            record.x_id,
            record.x_property_id,
            record.property_id,
            created,
            updated,
            last_seen,
            record.first_name,
            record.middle_name,
            record.last_name,
            record.email_1,
            phone_digits(record.phone_1),
            record.date_of_birth,
            record.city,
            record.state,
            record.zip,
            digest,
            applicant_encoder.encode(stored).decode(),
        )
        try:
            if existing is None:
                self._db.execute(_INSERT, row)
                self.counts.inserted += 1
            else:
                self._db.execute(_UPDATE, (*row, existing[0]))
                self.counts.updated += 1
        except sqlite3.IntegrityError:
            raise RecordError(f"id: {stored_id!r} already belongs to another applicant") from None


def _given(served: str | None, default: int) -> int:
    """A service instant given in the input (already canonical), else the default."""
    return parse_instant(served) if served is not None else default


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
    raise RecordError(f"{name} is not valid JSON")


_LOCATION = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")
_FIELD_MESSAGE = re.compile(r"(?P<field>[A-Za-z0-9_\[\]]+): (?P<reason>.*)", re.DOTALL)


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
    elif named := _FIELD_MESSAGE.fullmatch(message):
        field_name, reason = named["field"], named["reason"]
    else:
        reason = message[:1].lower() + message[1:]
    location = ".".join(part for part in (path, field_name) if part).replace(".[", "[")
    return f"{location or '(record)'}: {reason}"


def parse_line(raw: bytes) -> Applicant:
    """Validate one NDJSON line into an Applicant (raises RecordError)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecordError(f"(line): invalid UTF-8 at byte {error.start}") from None
    try:
        # The stdlib parser first, for what msgspec accepts silently: duplicate keys
        # (msgspec keeps the last) and NaN/Infinity. Its recursion limit bounds depth.
        document = json.loads(
            text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant
        )
    except RecordError:
        raise
    except RecursionError:
        raise RecordError("(line): JSON is nested too deeply") from None
    except json.JSONDecodeError as error:
        raise RecordError(f"(line): not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(document, dict):
        raise RecordError("(line): each line must be one JSON object (an applicant)")
    try:
        return msgspec.convert(document, Applicant)
    except msgspec.ValidationError as error:
        raise RecordError(describe_validation_error(error)) from None


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """Yield (line number, line) with lines over the size limit as None, never read whole."""
    number = 0
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_LINE_BYTES)
            yield number, None
            continue
        yield number, line


def import_ndjson(
    connection: sqlite3.Connection,
    stream: IO[bytes],
    progress: Any = None,
) -> ImportReport:
    """Upsert every line of an NDJSON stream in one transaction, or refuse the file whole.

    Raises ImportRefused (with the first few line errors) and writes nothing when any
    line is bad or the file holds no records.
    """
    report = ImportReport()
    writer = ApplicantWriter(connection)
    try:
        with writer:
            for number, line in _lines(stream):
                report.lines = number
                if progress is not None:
                    progress(number)
                if line is None:
                    _record_error(report, number, f"(line): longer than {MAX_LINE_BYTES} bytes")
                    continue
                if not line.strip():
                    continue  # blank lines separate nothing; tolerated
                try:
                    record = parse_line(line)
                    if report.ok:
                        writer.upsert(record)
                except RecordError as error:
                    _record_error(report, number, str(error))
            if report.ok and writer.counts.seen == 0:
                report.errors.append("the file holds no records")
            if not report.ok:
                raise ImportRefused(report)
    finally:
        report.counts = writer.counts
    return report


def _record_error(report: ImportReport, number: int, message: str) -> None:
    report.bad_lines += 1
    if len(report.errors) < MAX_REPORTED_ERRORS:
        report.errors.append(f"line {number}: {message}")


def write_records(connection: sqlite3.Connection, records: Iterable[Applicant]) -> WriteCounts:
    """Upsert records (already valid Structs) in one transaction; used by `seed`."""
    writer = ApplicantWriter(connection)
    with writer:
        for record in records:
            writer.upsert(record)
    return writer.counts


# --- NDJSON out --------------------------------------------------------------------


def export_ndjson(connection: sqlite3.Connection, out: IO[bytes]) -> int:
    """Write every applicant, exactly as served, one per line in id order."""
    count = 0
    # One read transaction: the export is one consistent snapshot.
    connection.execute("BEGIN")
    try:
        for (body,) in connection.execute("SELECT body FROM applicants ORDER BY id"):
            out.write(body.encode())
            out.write(b"\n")
            count += 1
    finally:
        connection.execute("COMMIT")
    return count
