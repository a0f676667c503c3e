"""Field selection (`fields=`): records narrowed to the top-level fields a client names.

A narrowed record is byte for byte the full record with the other keys dropped: the
same value encodings, in the record's order. A page of four fields is ~20x fewer bytes
than full records, and must not pay for decoding them:

- where every selected field is a column of `applicants` (the sortable fields, each
  stored in a column of its name, schema.sql), SQLite writes each record from its
  columns (`json_object`, `column_object`) and no body is decompressed. Its strings are
  escaped as msgspec escapes them, and instants (integer microseconds) are written
  `strftime` as the served form; tests/applicants/test_fields.py holds every such
  field equal to the body's on awkward values;
- otherwise the stored body is decoded and projected: msgspec decodes it into a Struct
  of the selected fields typed `msgspec.Raw` (each value's bytes as stored, the other
  fields skipped unparsed) and encodes that (`project`).

The field names are those of the served record Struct (`leasestar.client.records`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any, Final

import msgspec

from leasestar.applicants.resource import APPLICANTS
from leasestar.client.records import Applicant
from leasestar.errors import InvalidParameter

Fields = tuple[str, ...]

FIELDS: Final[Fields] = Applicant.__struct_fields__
_POSITION: Final = {name: position for position, name in enumerate(FIELDS)}
# A sortable field is a column of the same name (resource.py, schema.sql).
COLUMN_FIELDS: Final = frozenset(APPLICANTS.sortable)
# Held as integer microseconds (UTC) by their columns; typed datetime in the Struct.
_INSTANT_COLUMNS: Final = frozenset(
    field.name
    for field in msgspec.structs.fields(Applicant)
    if field.type is datetime and field.name in COLUMN_FIELDS
)
# Projections are made per set of fields, and a client can name any of 2^44: a bounded
# cache of the recent ones.
PROJECTION_CACHE_SIZE: Final = 256

_FIELD_LIST: Final = ", ".join(FIELDS)
_RULE: Final = f"fields takes comma-separated top-level fields of the record: {_FIELD_LIST}"


def parse_fields(text: str) -> Fields:
    """The fields of `fields=`, in the record's order; an unknown or repeated name is
    refused, named."""
    names = text.split(",")
    seen: set[str] = set()
    for name in names:
        if name not in _POSITION:
            raise InvalidParameter(
                "fields", text, f"fields names an unknown field '{name}'; {_RULE}"
            )
        if name in seen:
            raise InvalidParameter("fields", text, f"fields names '{name}' more than once")
        seen.add(name)
    return tuple(sorted(names, key=_POSITION.__getitem__))


def is_selection(names: Fields) -> bool:
    """Whether `names` is what `parse_fields` gives: known fields, once each, in order."""
    positions = [_POSITION.get(name, -1) for name in names]
    return bool(names) and -1 not in positions and positions == sorted(set(positions))


def from_columns(fields: Fields | None) -> bool:
    """Whether a selection is written from the table's columns (no body decoded)."""
    return fields is not None and COLUMN_FIELDS.issuperset(fields)


def _column_value(name: str) -> str:
    if name in _INSTANT_COLUMNS:
        # The served form, `2025-03-01T12:34:56.789Z`: the stored microseconds are whole
        # milliseconds (instants are truncated to them on the way in), which `%f` writes.
        return f"strftime('%Y-%m-%dT%H:%M:%fZ', {name} / 1000000.0, 'unixepoch')"
    return name


@lru_cache(maxsize=PROJECTION_CACHE_SIZE)
def column_object(fields: Fields) -> str:
    """SQL writing a record of column-held `fields` as its served JSON (whitelisted
    names only: every one is a key of `_POSITION` and a member of COLUMN_FIELDS)."""
    if not from_columns(fields) or not is_selection(fields):
        raise ValueError(f"not a selection of columns: {fields}")
    pairs = ", ".join(f"'{name}', {_column_value(name)}" for name in fields)
    return f"json_object({pairs})"


Projection = Callable[[bytes], bytes]


@lru_cache(maxsize=PROJECTION_CACHE_SIZE)
def _projection(fields: Fields) -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]:
    """Decoders of one record and of a list of them into a Struct of `fields` (Raw)."""
    narrowed = msgspec.defstruct(
        "Narrowed", [(name, msgspec.Raw) for name in fields], kw_only=True, gc=False
    )
    return msgspec.json.Decoder(narrowed), msgspec.json.Decoder(list[narrowed])  # type: ignore[valid-type]


_encoder = msgspec.json.Encoder()


def project(joined: bytes, fields: Fields) -> bytes:
    """Comma-joined served records (a page's results), narrowed to `fields`."""
    if not joined:
        return joined
    _, page = _projection(fields)
    return _encoder.encode(page.decode(b"[" + joined + b"]"))[1:-1]


def project_record(record: bytes, fields: Fields) -> bytes:
    """One served record narrowed to `fields`."""
    one, _ = _projection(fields)
    return _encoder.encode(one.decode(record))
