"""Keyset cursors: opaque, URL-safe, signed, and bound to the query that made them.

A cursor carries the whole validated query (ordering, filters, limit), the position
reached, and the values of the ordering's keys (plus `id`) of the last record served.
The next page is then "the records after those values" — an index seek whose cost does
not depend on how deep the walk is, and which never skips or repeats a record that
exists throughout the walk (and keeps its sort-key values), whatever is written
meanwhile.

The payload is signed with HMAC-SHA256 under a key kept in the database
(`sync_state.cursor_key`): a tampered, truncated or foreign cursor is refused with a 400
before anything of it is used. Each token scope signs with a key of its own, derived
from that one (`CursorCodec.for_scope`), so a cursor works only for tokens of the scope
that received it: replayed under another scope, it would start that scope's walk at a
position counted in another set of records.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Final

import msgspec

from leasestar.applicants.records import SortKey
from leasestar.errors import InvalidParameter
from leasestar.instants import parse_instant
from leasestar.tokens import scope_label

CURSOR_VERSION: Final = 1
_SIGNATURE_BYTES: Final = 16
KeyValue = str | int | None


class CursorState(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """What a cursor remembers. Internal: array_like keeps cursors short."""

    version: int
    limit: int
    order_by: tuple[SortKey, ...]
    # (parameter name, value) of every filter of the query that made the cursor
    filters: tuple[tuple[str, str | int], ...]
    changed_since: int | None
    position: int
    after: tuple[KeyValue, ...]
    # `fields=` of the query (None: whole records). Last, with a default: a cursor made
    # before it was added still reads.
    fields: tuple[str, ...] | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(CursorState)
_INVALID = (
    "cursor is not valid: use meta.next exactly as it was returned, with a token of the "
    "same integration scope"
)


class CursorCodec:
    """Signs and verifies cursors with one database's key (and one token scope's)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._scoped: dict[frozenset[str] | None, CursorCodec] = {}

    def for_scope(self, scope: frozenset[str] | None) -> CursorCodec:
        """The codec of one token scope (None: every integration), made once per scope
        and then reused, so a parsed query's cache entry keys on it cheaply."""
        codec = self._scoped.get(scope)
        if codec is None:
            label = b"cursor scope\0" + scope_label(scope)
            codec = CursorCodec(hmac.digest(self._key, label, "sha256"))
            self._scoped[scope] = codec
        return codec

    def _sign(self, payload: bytes) -> bytes:
        # hmac.digest with the digest's name: the one-call form, computed by OpenSSL.
        return hmac.digest(self._key, payload, "sha256")[:_SIGNATURE_BYTES]

    def encode(self, state: CursorState) -> str:
        payload = _encoder.encode(state)
        token = self._sign(payload) + payload
        return base64.urlsafe_b64encode(token).rstrip(b"=").decode("ascii")

    def decode(self, text: str) -> CursorState:
        """Verify and read a cursor; any fault is a 400 naming `cursor`."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise InvalidParameter("cursor", text, _INVALID) from None
        signature, payload = raw[:_SIGNATURE_BYTES], raw[_SIGNATURE_BYTES:]
        # Only the one text encode() writes: the decoder skips stray characters, padding
        # and the unused low bits of the last character, which would let a changed
        # cursor through.
        canonical = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
        if (
            canonical != text
            or len(signature) != _SIGNATURE_BYTES
            or not hmac.compare_digest(signature, self._sign(payload))
        ):
            raise InvalidParameter("cursor", text, _INVALID)
        try:
            state = _decoder.decode(payload)
        except msgspec.DecodeError:
            raise InvalidParameter("cursor", text, _INVALID) from None
        if state.version != CURSOR_VERSION:
            raise InvalidParameter("cursor", text, "cursor is from another version of the API")
        return state


class SortValues(msgspec.Struct, gc=False):
    """The sortable fields of a served record; decoding skips everything else."""

    id: str
    created_at: str
    updated_at: str
    last_seen: str
    x_id: str
    x_property_id: str
    property_id: str
    integration_id: str
    integration_vendor: str
    first_name: str | None
    middle_name: str | None
    last_name: str | None
    email_1: str | None
    date_of_birth: str | None
    city: str | None
    state: str | None
    zip: str | None


_sort_values_decoder = msgspec.json.Decoder(SortValues)
_INSTANT_FIELDS: Final = frozenset({"created_at", "updated_at", "last_seen"})
# Every served record is an object whose first member is its id.
_RECORD_START: Final = b'{"id":"'


def last_record(joined: bytes) -> tuple[int, SortValues | None]:
    """Where the last record of comma-joined served records begins, and its sort values
    (None when `joined` is empty): docs/list-planning.md, "The next cursor"."""
    position = joined.rfind(_RECORD_START)
    while position > 0:
        if joined[position - 1] == 0x2C:  # ","
            try:
                return position, _sort_values_decoder.decode(joined[position:])
            except msgspec.DecodeError:
                pass
        position = joined.rfind(_RECORD_START, 0, position)
    return 0, (_sort_values_decoder.decode(joined) if joined else None)


def last_record_start(joined: bytes) -> int:
    """Where the last record of comma-joined served records begins."""
    return last_record(joined)[0]


def sort_key_values(
    keys: tuple[SortKey, ...], record: SortValues, change_seq: int | None
) -> tuple[KeyValue, ...]:
    """The values of the total-order `keys` of a record's decoded sort values."""
    values: list[KeyValue] = []
    for key in keys:
        if key.field == "change_seq":
            values.append(change_seq)
            continue
        value: str | None = getattr(record, key.field)
        values.append(
            parse_instant(value) if key.field in _INSTANT_FIELDS and value is not None else value
        )
    return tuple(values)
