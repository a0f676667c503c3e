"""The outbox: the events of a write, recorded in the write's own transaction.

Recorded only while at least one subscription is active, read inside the write's
transaction (which holds the write lock, so a subscription created concurrently is
either seen by the whole write or created after it): a subscription is sent the changes
committed after its creation, never history (`changed_since` serves history). Recording
with nobody to send to would cost every import for nothing: a DATA_UPDATE needs the
previous body read, decompressed and compared field by field, and the rows would have
to be pruned unread.

A DATA_NEW's data is the body the writer stores (already compressed: recording it costs
one more row, not another encoding). A DATA_UPDATE is written only when a field other
than `last_seen` changed: a re-import from the source system moves `last_seen` on every
record it sees, and sending each as a change would flood receivers with nothing to do.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable
from typing import Any, Final

import msgspec

from leasestar.applicants.bodies import DICTIONARIES, BodyDecoder, UnknownDictionary
from leasestar.instants import now_micros

DATA_NEW: Final = "DATA_NEW"
DATA_UPDATE: Final = "DATA_UPDATE"
EVENT_TYPES: Final = (DATA_NEW, DATA_UPDATE)
# Moved by every sighting: not a change of the applicant (see the module's docstring).
UNREPORTED_FIELDS: Final = frozenset({"last_seen"})

ACTIVE_SUBSCRIPTION: Final = (
    "SELECT EXISTS (SELECT 1 FROM webhook_subscriptions "
    "WHERE revoked_at IS NULL AND disabled_at IS NULL)"
)
_INSERT: Final = (
    "INSERT INTO webhook_events (change_seq, event_id, event_type, record_id, "
    "integration_id, property_id, created_at, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# A body's fields as their encoded bytes: comparing those is ~20 us a record cheaper
# than decoding both bodies whole, about a twentieth of what a changed record costs an
# import. Fields whose bytes differ are decoded and compared as values (`_values_differ`).
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_value = msgspec.json.Decoder().decode
_encode_json = msgspec.json.Encoder().encode


def new_event_id() -> str:
    return "evt_" + secrets.token_hex(12)


def subscribed(connection: sqlite3.Connection) -> bool:
    """Whether writes are to record events now (call inside the write's transaction)."""
    return bool(connection.execute(ACTIVE_SUBSCRIPTION).fetchone()[0])


def _value(encoded: msgspec.Raw | None) -> Any:
    return None if encoded is None else _decode_value(encoded)


def _values_differ(previous: msgspec.Raw | None, new: msgspec.Raw | None) -> bool:
    """Whether two encoded values (None: the field is absent) differ as values: the same
    object with its keys in another order does not, and an absent field is null."""
    return bool(_value(previous) != _value(new))


def _differ(previous: object, new: object) -> bool:
    return previous != new


def diff(
    previous: dict[str, Any],
    new: dict[str, Any],
    differ: Callable[[Any, Any], bool] = _differ,
) -> dict[str, dict[str, Any]] | None:
    """{previous, new} of the fields whose value differs; None when only unreported
    fields (or none) changed. Fields equal by `==` are equal; those that are not are
    then compared by `differ`."""
    # The common case first: both encoded by the same encoder, so the same keys in the
    # same order, compared pairwise without building a set of keys (~3x faster).
    if previous.keys() == new.keys():
        changed = [field for field, value in new.items() if previous[field] != value]
    else:
        changed = [f for f in previous.keys() | new.keys() if previous.get(f) != new.get(f)]
    changed = sorted(
        field
        for field in changed
        if field not in UNREPORTED_FIELDS and differ(previous.get(field), new.get(field))
    )
    if not changed:
        return None
    return {
        "previous": {field: previous.get(field) for field in changed},
        "new": {field: new.get(field) for field in changed},
    }


class Outbox:
    """Records a write's events on its connection, inside its transaction."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._cursor = connection.cursor()  # reused: one per statement costs per row
        self._decoder = BodyDecoder.of(connection)
        self.recorded = 0

    def _previous_json(self, stored: bytes) -> bytes:
        try:
            return self._decoder.decode(stored)
        except UnknownDictionary:
            # Trained by this very transaction (bodies.py): its rows are visible here.
            self._decoder.add(self._db.execute(DICTIONARIES))
            return self._decoder.decode(stored)

    def new(
        self, change_seq: int, record_id: str, key: tuple[str, str], stored_body: bytes
    ) -> None:
        """A DATA_NEW: `key` is (integration_id, property_id); `stored_body` the row's body."""
        self._insert(change_seq, DATA_NEW, record_id, key, stored_body)

    def update(
        self,
        change_seq: int,
        record_id: str,
        key: tuple[str, str],
        previous_stored: bytes,
        new_json: bytes,
    ) -> None:
        """A DATA_UPDATE of the changed fields, if any field it reports changed."""
        previous = _decode_fields(self._previous_json(previous_stored))
        new = _decode_fields(new_json)
        changes = diff(previous, new, _values_differ)
        if changes is not None:
            self._insert(change_seq, DATA_UPDATE, record_id, key, _encode_json(changes))

    def _insert(
        self, change_seq: int, kind: str, record_id: str, key: tuple[str, str], data: bytes
    ) -> None:
        integration_id, property_id = key
        self._cursor.execute(
            _INSERT,
            (
                change_seq,
                new_event_id(),
                kind,
                record_id,
                integration_id,
                property_id,
                now_micros(),
                data,
            ),
        )
        self.recorded += 1
