"""The body a receiver is sent for an outbox event, in Propexo's shape.

    {"event_id": "evt_…", "event": "DATA_NEW" | "DATA_UPDATE", "change_seq": 17…,
     "created_at": "…Z", "meta": {"object": "applicants", "integration_id": "…"},
     "record_id": "app_…", "context": {"property_id": "…"},
     "data": {the record as the API serves it}                    (DATA_NEW)
     "diff": {"previous": {field: old}, "new": {field: new}}}     (DATA_UPDATE)

Built from the event's row the same way on every attempt, so a retried event is sent
byte for byte as before (and its signature over the body means the same).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

import msgspec

from leasestar.applicants.bodies import BodyDecoder
from leasestar.instants import format_instant
from leasestar.webhooks.outbox import DATA_NEW

if TYPE_CHECKING:
    from leasestar.webhooks.subscriptions import Subscription

OBJECT: Final = "applicants"
EVENT_COLUMNS: Final = (
    "change_seq, event_id, event_type, record_id, integration_id, property_id, created_at, data"
)
_encode = msgspec.json.Encoder().encode


class Event(NamedTuple):
    """A row of webhook_events."""

    change_seq: int
    event_id: str
    event_type: str
    record_id: str
    integration_id: str
    property_id: str
    created_at: int
    data: bytes


def events_query(subscription: Subscription) -> tuple[str, list[object]]:
    """The statement reading the events sent to `subscription`, and its parameters but the
    first (the change sequence read after) and the last (how many)."""
    sql = f"SELECT {EVENT_COLUMNS} FROM webhook_events WHERE change_seq > ?"
    params: list[object] = []
    if subscription.integrations is not None:
        sql += f" AND integration_id IN ({', '.join('?' * len(subscription.integrations))})"
        params.extend(sorted(subscription.integrations))
    sql += f" AND event_type IN ({', '.join('?' * len(subscription.events))})"
    params.extend(sorted(subscription.events))
    return sql + " ORDER BY change_seq LIMIT ?", params


def payload(event: Event, decoder: BodyDecoder) -> bytes:
    head = _encode(
        {
            "event_id": event.event_id,
            "event": event.event_type,
            "change_seq": event.change_seq,
            "created_at": format_instant(event.created_at),
            "meta": {"object": OBJECT, "integration_id": event.integration_id},
            "record_id": event.record_id,
            "context": {"property_id": event.property_id},
        }
    )
    key = b',"data":' if event.event_type == DATA_NEW else b',"diff":'
    return b"".join((head[:-1], key, decoder.decode(bytes(event.data)), b"}"))
