"""NDJSON in and out: one line to a validated applicant (or a precise error), and export.

What is accepted is exactly what the stdlib parser with a duplicate-key check, then
msgspec's Structs, both accept; the fast path (msgspec alone) is taken whenever
re-encoding the record gives back the line itself, as for every line of an export.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from typing import IO, Any, Final, NoReturn

import msgspec

from leasestar.applicants.bodies import BodyDecoder
from leasestar.applicants.prepared import Prepared, prepare
from leasestar.applicants.records import Applicant, applicant_encoder, applicant_line_decoder
from leasestar.applicants.writer import ProgressReporter, RecordError
from leasestar.instants import INSTANT_RULE

# A real record is a few kilobytes; a line beyond this is refused without being read
# into memory whole.
MAX_LINE_BYTES: Final = 1 << 20
EXPORT_BATCH: Final = 512


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


def read_lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes | None, int]]:
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


Outcome = tuple[int, Prepared | str]  # (line number, the record or what is wrong)


def parse_batch(batch: list[tuple[int, bytes | None]]) -> list[Outcome]:
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


def export_ndjson(
    connection: sqlite3.Connection,
    out: IO[bytes],
    progress: ProgressReporter | None = None,
) -> int:
    """Write every applicant, exactly as served, one per line in id order."""
    count = 0
    # One read transaction: the export is one consistent snapshot, whose dictionaries
    # every body names.
    connection.execute("BEGIN")
    try:
        decode = BodyDecoder.of(connection).decode
        cursor = connection.execute("SELECT CAST(body AS BLOB) FROM applicants ORDER BY id")
        while rows := cursor.fetchmany(EXPORT_BATCH):
            out.write(b"\n".join([decode(stored) for (stored,) in rows]))
            out.write(b"\n")
            count += len(rows)
            if progress is not None:
                progress.advance(count)
    finally:
        connection.execute("COMMIT")
    return count
