"""Unit tests of leasestar/applicants/plan.py: the WHERE clause, and the page statements.

Cursor pages seek the order's index at any depth (issue 7), nulls included.

A cursor page costs the same at any depth only if SQLite starts its index walk at the
cursor. SQLite seeks an index for one range of its first column, and a range never
holds nulls; so a keyset over a nullable first key that ran into or out of the null
block used to be one OR that SQLite answered by walking the index from its far end
(`SCAN applicants USING INDEX ...`). These tests ask SQLite itself: the statement the
real reader runs for a cursor page is EXPLAINed over the seeded database, for every
sortable field and direction, with the cursor's value null and not null, and the
page it serves is checked against the same page read with LIMIT/OFFSET.

Expected pages come from plain `ORDER BY ... LIMIT/OFFSET` (SQLite's null placement is
the contract's), or for the keyset parts from a Python sort by the contract's rules.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasestar.applicants import plan as plan_module
from leasestar.applicants import planner
from leasestar.applicants.cursors import KeyValue
from leasestar.applicants.ordering import (
    SORTABLE_FIELDS,
    SqlFragment,
    build_order_by,
    keyset_ranges,
    order_columns,
    total_order,
)
from leasestar.applicants.plan import build_where
from leasestar.applicants.query import MAX_OFFSET, ApplicantQuery, parse_list_query, parse_order_by
from leasestar.applicants.records import SortKey
from leasestar.applicants.storage import ApplicantReader
from leasestar.database import ReadPool, read_uri
from tests.contract import NULLABLE_SORTABLE
from tests.json_body import key_values, register_json_body

HOSTILE = "x' OR 1=1 --"
LIMIT = 10
# Orderings of several keys led by a nullable one: the lead key's range bounds the walk.
MULTI_KEY = (
    "middle_name:desc,last_name:asc",
    "email_1:asc,created_at:desc",
    "city:desc,state:desc,zip:asc",
    "state:asc,middle_name:desc,first_name:asc,zip:desc",
    "zip:desc,id:asc",
)


class RecordingPool:
    """Runs each statement on one sqlite3 connection and keeps it, to EXPLAIN later."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.statements: list[tuple[str, tuple[Any, ...]]] = []
        # The file, for the reader's columnar copy of the counts (match_counter.py).
        self.path = Path(connection.execute("PRAGMA database_list").fetchone()[2])

    async def fetchall(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        self.statements.append((sql, tuple(parameters)))
        return self.connection.execute(sql, parameters).fetchall()

    fetchall_on_pool = fetchall


@pytest.fixture(scope="module")
def seeded(seeded_template: Path) -> Iterator[sqlite3.Connection]:
    """The 300 seeded applicants, read-only (every null block and tie of the seed)."""
    connection = sqlite3.connect(read_uri(seeded_template), uri=True, check_same_thread=False)
    yield connection
    connection.close()


def ordered_rows(connection: sqlite3.Connection, order: tuple[SortKey, ...]) -> list[Any]:
    """(id, body, change_seq, lead value) of every record, in the order."""
    lead = order_columns(order)[0]
    register_json_body(connection)
    return connection.execute(
        f"SELECT id, json_body(body), change_seq, {lead} FROM applicants {build_order_by(order)}"
    ).fetchall()


async def served_page(
    connection: sqlite3.Connection, query: ApplicantQuery
) -> tuple[list[str], str, str]:
    """The ids the real reader serves for `query`, its page statement and that
    statement's plan as SQLite reports it."""
    pool = RecordingPool(connection)
    page = await ApplicantReader(cast(ReadPool, pool)).fetch_page(query, None)
    (sql, params), *others = [s for s in pool.statements if "LIMIT ? OFFSET ?" in s[0]]
    assert not others
    plan = "\n".join(row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    ids = [record["id"] for record in json.loads(b"[" + page.results_json + b"]")]
    return ids, sql, plan


async def check_cursor_page(
    connection: sqlite3.Connection, order: tuple[SortKey, ...], position: int
) -> str:
    """Serve the cursor page after the record at `position` - 1; check it is the OFFSET
    page and that its statement seeks; return the plan."""
    rows = ordered_rows(connection, order)
    _, body, change_seq, _ = rows[position - 1]
    after = key_values(total_order(order), body, change_seq)
    query = ApplicantQuery(limit=LIMIT, order_by=order, after=after, offset=position)
    ids, sql, plan = await served_page(connection, query)
    assert ids == [row[0] for row in rows[position : position + LIMIT]], sql
    assert "SCAN applicants" not in plan, f"{sql}\n{plan}"
    assert "SEARCH applicants" in plan, f"{sql}\n{plan}"
    return plan


def test_the_nullable_sortable_fields_are_the_schemas(seeded: sqlite3.Connection) -> None:
    columns = seeded.execute("PRAGMA table_info(applicants)").fetchall()
    nullable = {name for _, name, _, not_null, _, _ in columns if not not_null}
    assert nullable & set(SORTABLE_FIELDS) == set(NULLABLE_SORTABLE)
    for field in NULLABLE_SORTABLE:  # the seed has a null block to walk into and out of
        (nulls,) = seeded.execute(
            f"SELECT count(*) FROM applicants WHERE {field} IS NULL"
        ).fetchone()
        assert nulls, field


CURSOR_CASES = [
    pytest.param(field, direction, lead, id=f"{field}-{direction}-{lead}")
    for field in SORTABLE_FIELDS
    for direction in ("asc", "desc")
    for lead in (("value", "null") if field in NULLABLE_SORTABLE else ("value",))
]


@pytest.mark.parametrize(("field", "direction", "lead"), CURSOR_CASES)
async def test_a_cursor_page_seeks_the_orders_index(
    seeded: sqlite3.Connection, field: str, direction: str, lead: str
) -> None:
    """The cursor is the deepest record whose lead value is (or is not) null that still
    has a full page after it: as deep as the seed allows, so a scan from either end
    would have rows to wade through."""
    order = parse_order_by(f"{field}:{direction}")
    rows = ordered_rows(seeded, order)
    positions = [
        index + 1
        for index, row in enumerate(rows[: -LIMIT - 1])
        if (row[3] is None) == (lead == "null")
    ]
    plan = await check_cursor_page(seeded, order, positions[len(positions) * 3 // 4])
    # The field's own index: applicants_by_<field>, or applicants_sorted_by_<field> where
    # the first goes on in another order after the field (schema.sql).
    assert re.search(rf"INDEX applicants_(?:sorted_)?by_{field}\b", plan) or field == "id", plan


@pytest.mark.parametrize("direction", ["asc", "desc"])
@pytest.mark.parametrize("field", NULLABLE_SORTABLE)
async def test_a_page_across_the_null_block_edge_is_the_offset_page(
    seeded: sqlite3.Connection, field: str, direction: str
) -> None:
    """A page that starts on one side of the null block's edge and ends on the other:
    desc walks from the values into the trailing nulls, asc out of the leading nulls."""
    order = parse_order_by(f"{field}:{direction}")
    rows = ordered_rows(seeded, order)
    edge = next(i for i in range(1, len(rows)) if (rows[i - 1][3] is None) != (rows[i][3] is None))
    for position in (edge - LIMIT + 1, edge - 3, edge - 1, edge, edge + 1):
        await check_cursor_page(seeded, order, position)


@pytest.mark.parametrize("text", MULTI_KEY)
async def test_a_multi_key_cursor_page_seeks_its_lead_key(
    seeded: sqlite3.Connection, text: str
) -> None:
    order = parse_order_by(text)
    rows = ordered_rows(seeded, order)
    nulls = [i + 1 for i, row in enumerate(rows[: -LIMIT - 1]) if row[3] is None]
    values = [i + 1 for i, row in enumerate(rows[: -LIMIT - 1]) if row[3] is not None]
    for position in (nulls[len(nulls) // 2], values[len(values) // 2], values[-1], nulls[-1]):
        await check_cursor_page(seeded, order, position)


@pytest.mark.parametrize("direction", ["asc", "desc"])
@pytest.mark.parametrize("field", ["middle_name", "email_1"])
async def test_a_deep_offset_seeks_from_its_checkpoint(
    seeded: sqlite3.Connection, field: str, direction: str
) -> None:
    """Deep offsets start at a checkpoint's key values (the same keyset, at or after) and
    skip the rest: every offset, so pages start and end on both sides of the null
    block's edge, with and without rows to skip."""
    order = parse_order_by(f"{field}:{direction}")
    rows = ordered_rows(seeded, order)
    with (
        patch.object(plan_module, "CHECKPOINT_EVERY", 7),
        patch.object(planner, "DEEP_OFFSET", 0),
    ):
        for offset in range(len(rows)):
            query = ApplicantQuery(limit=LIMIT, order_by=order, offset=offset)
            ids, sql, plan = await served_page(seeded, query)
            assert ids == [row[0] for row in rows[offset : offset + LIMIT]], sql
            if offset >= 7:  # served from a checkpoint
                assert "SCAN applicants" not in plan, f"{sql}\n{plan}"


@pytest.mark.parametrize("direction", ["asc", "desc"])
async def test_the_largest_offset_over_two_ranges_is_an_empty_page(
    seeded: sqlite3.Connection, direction: str
) -> None:
    """The page at offset 2**63 - 1 starts from the first checkpoint (a null middle name
    ascending, a value descending: two ranges either way) and skips nearly 2**63 rows:
    the rows it wants, skip + limit, must still fit a bound 64-bit value. Found by
    test_pagination_properties."""
    order = parse_order_by(f"middle_name:{direction}")
    ids, _, _ = await served_page(
        seeded, ApplicantQuery(limit=LIMIT, order_by=order, offset=MAX_OFFSET)
    )
    assert ids == []


# --- the parts of a keyset ---------------------------------------------------------------


def contract_compare(a: KeyValue, b: KeyValue) -> int:
    """Nulls first; strings by code point; instants (integers) by value."""
    if a is None or b is None:
        return (a is not None) - (b is not None)
    return (a > b) - (a < b)


orders = st.lists(
    st.tuples(st.sampled_from(sorted(SORTABLE_FIELDS)), st.sampled_from(("asc", "desc"))),
    min_size=1,
    max_size=4,
    unique_by=lambda key: key[0],
).map(lambda keys: tuple(SortKey(field, direction) for field, direction in keys))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=orders, inclusive=st.booleans(), data=st.data())
def test_keyset_parts_are_disjoint_ordered_and_exactly_the_rows_after(
    seeded: sqlite3.Connection,
    order: tuple[SortKey, ...],
    inclusive: bool,
    data: st.DataObject,
) -> None:
    """Each part is read as its own index range and the parts are merged by the ORDER BY:
    together they must be the rows after the cursor, none twice, each part wholly after
    the one before it (the walk order `keyset_ranges` promises)."""
    keys = total_order(order)
    columns = order_columns(order)
    rows = seeded.execute(f"SELECT {', '.join(columns)} FROM applicants").fetchall()

    def compare(a: tuple[KeyValue, ...], b: tuple[KeyValue, ...]) -> int:
        for key, left, right in zip(keys, a, b, strict=True):
            result = contract_compare(left, right)
            if result:
                return result if key.direction == "asc" else -result
        return 0

    walk = sorted(rows, key=functools.cmp_to_key(compare))
    cursor = data.draw(st.sampled_from(walk), label="cursor")
    expected = [row for row in walk if compare(row, cursor) > 0 or (inclusive and row == cursor)]
    parts = keyset_ranges(keys, cursor, inclusive=inclusive)
    assert 1 <= len(parts) <= 2
    served: list[list[tuple[KeyValue, ...]]] = [
        seeded.execute(
            f"SELECT {', '.join(columns)} FROM applicants WHERE {part.sql} {build_order_by(order)}",
            part.params,
        ).fetchall()
        for part in parts
    ]
    assert [row for part in served for row in part] == expected


@pytest.mark.parametrize("direction", ["asc", "desc"])
@pytest.mark.parametrize("field", sorted(SORTABLE_FIELDS))
async def test_a_page_in_any_one_fields_order_is_an_index_walk(
    seeded: sqlite3.Connection, field: str, direction: str
) -> None:
    """Every sortable field has an index in (field, id) order, the total order the
    contract gives it: a first page is an index walk, never a sort of the matches (found
    by review: last_name's index was (last_name, first_name, id) and integration_id's
    (integration_id, created_at, id), so every group of ties was sorted, ~50-100 ms a
    page at 100,000 rows)."""
    ids, _, plan = await served_page(
        seeded, ApplicantQuery(limit=LIMIT, order_by=(SortKey(field, direction),))
    )
    assert "TEMP B-TREE" not in plan, plan
    assert ids == [row[0] for row in ordered_rows(seeded, (SortKey(field, direction),))][:LIMIT]


@pytest.mark.parametrize("field", ["email_1", "last_name", "city", "id"])
async def test_a_page_whose_few_matches_are_collected_is_sorted_not_walked(
    seeded: sqlite3.Connection, field: str
) -> None:
    """A date bound that a few rows meet: the plan collects them and sorts, and the
    statement makes SQLite do that (found at 1,000,000 rows: SQLite, knowing nothing of
    how many rows the bound keeps, walked the ordering's whole index, 5-16 s a page,
    where collecting took 17 ms)."""
    instants = sorted(row[0] for row in seeded.execute("SELECT updated_at FROM applicants"))
    bound = instants[4]  # five rows meet it (the seed's instants are distinct)
    order = (SortKey(field, "asc"),)
    query = ApplicantQuery(limit=LIMIT, order_by=order, filters=(("updated_at_lte", bound),))
    ids, sql, plan = await served_page(seeded, query)
    expected = [
        row[0]
        for row in seeded.execute(
            f"SELECT id FROM applicants WHERE updated_at <= ? {build_order_by(order)}", (bound,)
        )
    ]
    assert len(expected) == 5
    assert ids == expected
    assert "USING INDEX applicants_by_updated_at" in plan, f"{sql}\n{plan}"
    assert "TEMP B-TREE FOR ORDER BY" in plan, f"{sql}\n{plan}"


# --- build_where ----------------------------------------------------------------------


def test_no_filters_and_no_scope_is_no_where() -> None:
    assert build_where(ApplicantQuery(), None) == SqlFragment("", ())


@pytest.mark.parametrize(
    ("pairs", "sql", "params"),
    [
        ([("updated_at_gte", "1970-01-01T00:00:01Z")], "WHERE updated_at >= ?", (1_000_000,)),
        ([("updated_at_lte", "1970-01-01")], "WHERE updated_at <= ?", (0,)),
        ([("last_seen_gte", "1969-12-31T23:59:59Z")], "WHERE last_seen >= ?", (-1_000_000,)),
        ([("last_seen_lte", "1970-01-01T00:00:00.000001Z")], "WHERE last_seen <= ?", (1,)),
        ([("integration_id", "int_a")], "WHERE integration_id = ?", ("int_a",)),
        ([("integration_vendor", "YARDI")], "WHERE integration_vendor = ?", ("YARDI",)),
        ([("property_id", "p")], "WHERE property_id = ?", ("p",)),
        ([("x_property_id", "P")], "WHERE x_property_id = ?", ("P",)),
        (
            [("email_1", "A@b.c")],
            "WHERE email_1 = ? COLLATE NOCASE AND upper(email_1) = upper(?)",
            ("A@b.c", "A@b.c"),
        ),
        (
            [("phone_1", "5551234567")],
            "WHERE phone_1_digits IN (?, ?)",
            ("5551234567", "15551234567"),
        ),
        (
            [
                ("updated_at_gte", "1970-01-01T00:00:01Z"),
                ("updated_at_lte", "1970-01-01T00:00:02Z"),
                ("last_seen_gte", "1970-01-01T00:00:03Z"),
                ("last_seen_lte", "1970-01-01T00:00:04Z"),
            ],
            "WHERE updated_at >= ? AND updated_at <= ? AND last_seen >= ? AND last_seen <= ?",
            (1_000_000, 2_000_000, 3_000_000, 4_000_000),
        ),
    ],
)
def test_each_filter_is_one_clause_with_its_value_bound(
    pairs: list[tuple[str, str]], sql: str, params: tuple[object, ...]
) -> None:
    assert build_where(parse_list_query(pairs), None) == SqlFragment(sql, params)


def test_x_id_filter_binds_all_three_parts_of_the_source_key() -> None:
    query = parse_list_query([("x_id", "A"), ("integration_id", "i"), ("x_property_id", "P")])
    where = build_where(query, None)
    assert where.sql == "WHERE integration_id = ? AND x_property_id = ? AND x_id = ?"
    assert where.params == ("i", "P", "A")


def test_scope_is_an_in_list_of_bound_ids_in_a_stable_order() -> None:
    assert build_where(ApplicantQuery(), frozenset({"int_b", "int_a", "INT_c"})) == SqlFragment(
        "WHERE integration_id IN (?, ?, ?)", ("INT_c", "int_a", "int_b")
    )


def test_filters_and_scope_combine_with_and() -> None:
    query = parse_list_query(
        [
            ("integration_id", "int_a"),
            ("updated_at_gte", "1970-01-01T00:00:01Z"),
            ("email_1", "a@b.c"),
            ("phone_1", "5551234567"),
        ]
    )
    assert build_where(query, frozenset({"int_a"})) == SqlFragment(
        "WHERE updated_at >= ? AND integration_id = ? AND email_1 = ? COLLATE NOCASE "
        "AND upper(email_1) = upper(?) AND phone_1_digits IN (?, ?) AND integration_id IN (?)",
        (1_000_000, "int_a", "a@b.c", "a@b.c", "5551234567", "15551234567", "int_a"),
    )


@pytest.mark.parametrize(
    "name", ["integration_id", "integration_vendor", "property_id", "x_property_id", "email_1"]
)
@pytest.mark.parametrize("value", [HOSTILE, "'; DROP TABLE applicants; --", '" OR ""="', "%s"])
def test_hostile_values_are_bound_never_written_into_the_sql(name: str, value: str) -> None:
    where = build_where(parse_list_query([(name, value)]), frozenset({value}))
    assert value not in where.sql
    assert "'" not in where.sql
    assert '"' not in where.sql
    # the filter (email_1's twice: its index, then its exact check), and the scope
    assert where.params.count(value) == (3 if name == "email_1" else 2)
    assert where.sql.count("?") == len(where.params)
