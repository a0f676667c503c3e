"""Property (issue 7): a cursor walk never skips or repeats a record, even while writes run.

Each example draws a data set and a list query (tests/strategies.py: awkward text, ties,
nulls, every filter), serves it with the real app, and walks the list page by page with
`meta.next`. Between pages it writes through the real upsert (`write_records`): new
records, updates of fields that neither sort nor filter, and updates of sort-key or
filter fields. A Python model of the records follows every write. The walk must:

* serve every record as it is at that moment, matching the query at that moment;
* serve records in strictly increasing total order (as served): pages never go back;
* serve exactly once every record that existed from start to end and whose sort-key
  and filter values never changed;
* serve a record twice only if its sort-key values changed;
* end: the last page has `hasMore` false and no `next`, and `next` is there exactly
  when `hasMore` is.
"""

from __future__ import annotations

import functools
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from leasestar.applicants.pipeline import write_records
from leasestar.database import open_for_write
from tests.contract import IDENTITY, SORTABLE
from tests.strategies import (
    DATE_BOUNDS,
    ListQuery,
    ModelRow,
    applicant_rows,
    datasets,
    list_queries,
    matches,
    serve,
    served_values,
    sort_rows,
    text,
    total_keys,
)

# Sortable fields a write can change. id and the upsert key (integration_id,
# Fields no ordering or filter reads.
# Sortable fields a write can change. id and the upsert key (integration_id,
# x_property_id, x_id) identify the record: writing them makes another record.
MUTABLE_SORTABLE = tuple(field for field in SORTABLE if field not in IDENTITY)
PLAIN_FIELDS = ("notes", "address_1", "x_lead_id", "city_alternate", "type_raw")
MAX_WRITES = 10
MAX_PAGES = 200

WALK_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def compare(a: Any, b: Any) -> int:
    """Nulls first; strings by code point; instants (ints) by value."""
    if a is None or b is None:
        return (a is not None) - (b is not None)
    return (a > b) - (a < b)


def order_compare(keys: Sequence[tuple[str, str]], a: ModelRow, b: ModelRow) -> int:
    for name, direction in keys:
        result = compare(a.values[name], b.values[name])
        if result:
            return result if direction == "asc" else -result
    return 0


def filter_fields(query: ListQuery) -> set[str]:
    fields = {DATE_BOUNDS[bound][0] for bound in query.bounds} | set(query.equal)
    if query.email_1 is not None:
        fields.add("email_1")
    return fields


def walk_params(query: ListQuery, limit: int) -> list[tuple[str, str]]:
    kept = [(name, value) for name, value in query.params if name not in ("offset", "limit")]
    return [*kept, ("limit", str(limit))]


class Model:
    """The records as the contract says they are stored, and what the walk did to them."""

    def __init__(self, rows: Sequence[ModelRow], query: ListQuery) -> None:
        self.rows = {row.values["id"]: row for row in rows}
        self.keys = {(r.record.integration_id, r.record.x_property_id, r.record.x_id) for r in rows}
        self.initial = set(self.rows)
        self.ids = set(self.rows)  # every id given out, written yet or not
        self.sort_fields = {name for name, _ in total_keys(query.order_keys)}
        self.filter_fields = filter_fields(query)
        self.moved: set[str] = set()  # a sort-key value changed
        self.refiltered: set[str] = set()  # a filter value changed
        self.counter = 0

    def write(self, connection: sqlite3.Connection, rows: list[ModelRow]) -> None:
        write_records(connection, [row.record for row in rows])
        for row in rows:
            identifier = row.values["id"]
            old = self.rows.get(identifier)
            if old is not None:
                changed = {n for n in old.values if old.values[n] != row.values[n]}
                if changed & self.sort_fields:
                    self.moved.add(identifier)
                if changed & self.filter_fields:
                    self.refiltered.add(identifier)
            self.rows[identifier] = row

    def fresh(self, row: ModelRow) -> ModelRow:
        """`row` made new: an id and an upsert key no record has."""
        self.counter += 1
        record, values = row.record, dict(row.values)
        if values["id"] in self.ids:
            values["id"] = f"{values['id']}~{self.counter}"
        self.ids.add(values["id"])
        key = (record.integration_id, record.x_property_id, record.x_id)
        x_id = record.x_id if key not in self.keys else f"{record.x_id}~{self.counter}"
        values["x_id"] = x_id
        record = msgspec.structs.replace(
            record,
            id=values["id"],
            x_id=x_id,
            applications=[
                msgspec.structs.replace(a, applicant_id=x_id) for a in record.applications
            ],
        )
        self.keys.add((record.integration_id, record.x_property_id, x_id))
        return ModelRow(record=record, values=values, phone_1=row.phone_1)


@st.composite
def writes(draw: st.DrawFn, model: Model, budget: int) -> list[ModelRow]:
    """Up to `budget` rows to write in one transaction: new, plainly changed, or moved."""
    rows: list[ModelRow] = []
    written: set[str] = set()
    for _ in range(draw(st.integers(0, min(3, budget)))):
        existing = sorted(set(model.rows) - written)
        kind = draw(
            st.sampled_from(("insert", "plain", "sort", "sort") if existing else ("insert",))
        )
        if kind == "insert":
            row = model.fresh(draw(applicant_rows()))
        else:
            old = model.rows[draw(st.sampled_from(existing))]
            if kind == "plain":
                name = draw(st.sampled_from(PLAIN_FIELDS))
                record = msgspec.structs.replace(old.record, **{name: draw(st.none() | text())})
                row = ModelRow(record=record, values=old.values, phone_1=old.phone_1)
            else:
                # Mostly a field that matters to this walk's order or filters.
                relevant = sorted((model.sort_fields | model.filter_fields) & set(MUTABLE_SORTABLE))
                name = draw(
                    st.sampled_from(relevant or MUTABLE_SORTABLE)
                    | st.sampled_from(MUTABLE_SORTABLE)
                )
                donor = draw(applicant_rows())
                record = msgspec.structs.replace(old.record, **{name: getattr(donor.record, name)})
                values = {**old.values, name: donor.values[name]}
                row = ModelRow(record=record, values=values, phone_1=old.phone_1)
        written.add(row.values["id"])
        rows.append(row)
    return rows


def check_served(result: dict[str, Any], model: Model, query: ListQuery) -> ModelRow:
    """A served record is the model's record as it is now, and matches the query now."""
    row = model.rows.get(result["id"])
    assert row is not None, f"served an unknown record {result['id']!r}"
    assert {name: result[name] for name in row.values} == served_values(row)
    assert result["notes"] == row.record.notes
    assert matches(row, query), f"served {result['id']!r}, which does not match the query"
    return row


def unfiltered(query: ListQuery) -> ListQuery:
    """The same ordering with no filter, so walks are long enough to write during."""
    kept = [(name, value) for name, value in query.params if name == "order-by"]
    return ListQuery(params=kept, order_keys=query.order_keys, plus_for_space=query.plus_for_space)


@WALK_SETTINGS
@given(rows=datasets(max_size=16).filter(lambda rows: len(rows) >= 4), data=st.data())
async def test_cursor_walk_under_writes_serves_every_steady_record_once(
    rows: list[ModelRow], data: st.DataObject
) -> None:
    query = data.draw(list_queries(rows), label="query")
    if data.draw(st.booleans(), label="drop the filters"):
        query = unfiltered(query)
    limit = data.draw(st.integers(1, 3), label="limit")
    model = Model(rows, query)
    keys = total_keys(query.order_keys)
    start_matching = {i for i, row in model.rows.items() if matches(row, query)}
    async with serve(rows, {"all": ()}) as served:
        client = served.client
        client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        connection = open_for_write(served.db_path)
        try:
            url = "/v1/applicants?" + query.query_string(walk_params(query, limit))
            seen: list[str] = []
            previous: ModelRow | None = None
            budget = MAX_WRITES
            for _ in range(MAX_PAGES):
                note(f"GET {url}")
                response = await client.get(url)
                assert response.status_code == 200, response.text
                body = response.json()
                meta = body["meta"]
                assert ("next" in meta) == meta["hasMore"], meta
                assert len(body["results"]) <= limit
                for result in body["results"]:
                    row = check_served(result, model, query)
                    if previous is not None:
                        assert order_compare(keys, previous, row) < 0, (
                            f"{result['id']!r} served after {previous.values['id']!r}: "
                            "the walk went back"
                        )
                    previous = row
                    seen.append(result["id"])
                if "next" not in meta:
                    break
                batch = data.draw(writes(model, budget), label="writes")
                if batch:
                    note(f"write {[(r.values['id'], r.values) for r in batch]}")
                    model.write(connection, batch)
                    budget -= len(batch)
                url = "/v1/applicants?" + query.query_string([("cursor", meta["next"])])
            else:
                raise AssertionError("the walk did not end")
        finally:
            connection.close()
    assert not meta["hasMore"]
    event(f"rows written during the walk: {min(MAX_WRITES - budget, 3)}+")
    counts = Counter(seen)
    note(f"seen: {seen}; moved: {model.moved}; refiltered: {model.refiltered}")
    steady = start_matching - model.moved - model.refiltered
    for identifier in steady:
        assert counts[identifier] == 1, f"{identifier!r} was served {counts[identifier]} times"
    for identifier, count in counts.items():
        assert count == 1 or identifier in model.moved, f"{identifier!r} served {count} times"


def test_model_order_matches_the_strategies_order() -> None:
    """The walk's comparator is the contract's: sorting by it gives `sort_rows` order."""

    @given(rows=datasets(max_size=12), data=st.data())
    @settings(max_examples=10, deadline=None)
    def check(rows: list[ModelRow], data: st.DataObject) -> None:
        query = data.draw(list_queries(rows))
        keys = total_keys(query.order_keys)
        ours = sorted(rows, key=functools.cmp_to_key(lambda a, b: order_compare(keys, a, b)))
        assert [r.values["id"] for r in ours] == [
            r.values["id"] for r in sort_rows(rows, query.order_keys)
        ]

    check()
