"""The outbox: every write's events recorded in its own transaction (issue 28, point 2)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from leasestar.applicants.bodies import BodyDecoder
from leasestar.applicants.pipeline import ImportRefused, write_records
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from leasestar.webhooks.outbox import _decode_fields, _values_differ, diff
from leasestar.webhooks.payloads import EVENT_COLUMNS, Event, payload
from leasestar.webhooks.subscriptions import create_subscription, revoke_subscription
from tests.applicants.lines import (
    T1,
    T1_TEXT,
    T2,
    T2_TEXT,
    exported,
    ndjson,
    rows,
    run_import,
    source,
)


def events(db: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every recorded event as a receiver is sent it, in change order."""
    decoder = BodyDecoder.of(db)
    found = db.execute(f"SELECT {EVENT_COLUMNS} FROM webhook_events ORDER BY change_seq")
    return [json.loads(payload(Event(*row), decoder)) for row in found]


def subscribe(db: sqlite3.Connection) -> str:
    return create_subscription(db, "http://127.0.0.1:9/hook").id


def test_no_subscription_records_nothing(db: sqlite3.Connection) -> None:
    run_import(db, ndjson(source(1), source(2)), seen_at=T1)
    assert events(db) == []


def test_new_records_are_data_new_with_the_record_as_served(db: sqlite3.Connection) -> None:
    subscribe(db)
    run_import(db, ndjson(source(1), source(2, first_name="Bo")), seen_at=T1)
    stored = rows(db)
    sent = events(db)
    assert [event["event"] for event in sent] == ["DATA_NEW", "DATA_NEW"]
    assert [event["data"] for event in sent] == [stored["X0001"]["json"], stored["X0002"]["json"]]
    assert [event["change_seq"] for event in sent] == [
        stored["X0001"]["change_seq"],
        stored["X0002"]["change_seq"],
    ]
    first = sent[0]
    assert first["record_id"] == stored["X0001"]["id"]
    assert first["meta"] == {"object": "applicants", "integration_id": "int_1"}
    assert first["context"] == {"property_id": "prop_1"}
    assert len({event["event_id"] for event in sent}) == 2


def test_a_change_is_data_update_with_only_the_changed_fields(db: sqlite3.Connection) -> None:
    subscribe(db)
    run_import(db, ndjson(source(1), source(2)), seen_at=T1)
    run_import(db, ndjson(source(1, first_name="Cy", city="Oslo"), source(2)), seen_at=T2)
    update = events(db)[2:]
    assert len(update) == 1
    assert update[0]["event"] == "DATA_UPDATE"
    assert update[0]["record_id"] == rows(db)["X0001"]["id"]
    assert update[0]["diff"] == {
        "previous": {"city": None, "first_name": "Ann", "updated_at": T1_TEXT},
        "new": {"city": "Oslo", "first_name": "Cy", "updated_at": T2_TEXT},
    }


def test_an_import_that_changes_nothing_records_nothing(db: sqlite3.Connection) -> None:
    subscribe(db)
    run_import(db, ndjson(source(1), source(2)), seen_at=T1)
    before = events(db)
    run_import(db, ndjson(source(1), source(2)), seen_at=T2)  # only last_seen moves
    run_import(db, exported(db))  # not written at all
    assert events(db) == before


def test_a_refused_import_records_no_event(db: sqlite3.Connection) -> None:
    subscribe(db)
    with pytest.raises(ImportRefused):
        run_import(db, ndjson(source(1)) + b'{"x_id": 1}\n', seen_at=T1)
    assert events(db) == []
    assert rows(db) == {}


def test_a_revoked_subscription_stops_the_recording(db: sqlite3.Connection) -> None:
    revoke_subscription(db, subscribe(db))
    run_import(db, ndjson(source(1)), seen_at=T1)
    assert events(db) == []


def test_a_seed_records_data_new_bodies_even_across_dictionary_training(
    db: sqlite3.Connection,
) -> None:
    # 1,500 rows: the write trains its first dictionary at 1,000 and recompresses the
    # rows before it; the events keep the bodies as first encoded, still decodable.
    subscribe(db)
    write_records(db, synthetic_applicants(1_500, seed=3))
    decoder = BodyDecoder.of(db)
    stored = {
        record_id: json.loads(decoder.decode(body))
        for record_id, body in db.execute("SELECT id, body FROM applicants")
    }
    sent = events(db)
    assert len(sent) == 1_500
    assert {event["record_id"]: event["data"] for event in sent} == stored


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.none() | st.integers(0, 3) | st.text(max_size=2)),
    st.dictionaries(st.sampled_from("abcdef"), st.none() | st.integers(0, 3) | st.text(max_size=2)),
)
def test_the_diff_holds_exactly_the_fields_that_differ(
    previous: dict[str, Any], new: dict[str, Any]
) -> None:
    changes = diff(previous, new)
    differing = {k for k in "abcdef" if previous.get(k) != new.get(k)}
    if not differing:
        assert changes is None
        return
    assert changes is not None
    assert set(changes["previous"]) == set(changes["new"]) == differing
    for field in differing:
        assert changes["previous"][field] == previous.get(field)
        assert changes["new"][field] == new.get(field)


def test_an_older_database_gains_the_tables_on_open(tmp_path: Any) -> None:
    path = tmp_path / "old.db"
    open_for_write(path).close()
    with sqlite3.connect(path) as old:
        old.execute("DROP TABLE webhook_events")
        old.execute("PRAGMA user_version = 3")
    connection = open_for_write(path)
    try:
        subscribe(connection)
        run_import(connection, ndjson(source(1)), seen_at=T1)
        assert len(events(connection)) == 1
    finally:
        connection.close()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.text("ab", max_size=2),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("xy", max_size=1), inner),
    max_leaves=6,
)
BODIES = st.dictionaries(st.sampled_from("abcde"), JSON_VALUES)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(BODIES, BODIES)
@example({"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}})  # the same object, reordered
@example({"a": None}, {})  # null and absent alike
def test_the_diff_of_encoded_bodies_is_the_diff_of_their_values(
    previous: dict[str, Any], new: dict[str, Any]
) -> None:
    """The outbox compares fields as encoded bytes first: what it reports is what
    comparing the decoded values reports, byte for byte once encoded."""
    encode = msgspec.json.encode
    from_bytes = diff(_decode_fields(encode(previous)), _decode_fields(encode(new)), _values_differ)
    from_values = diff(previous, new)
    assert encode(from_bytes) == encode(from_values)
