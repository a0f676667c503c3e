"""leasestar/applicants/resource.py: the declaration is what SQLite reads from schema.sql.

The expected facts come from SQLite itself (an in-memory database built from
`schema_sql()`, read back with PRAGMA index_list, index_info and table_info), never
from the declaration under test.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace

import pytest

from leasestar.applicants.filters import FILTERS
from leasestar.applicants.resource import APPLICANTS, Index
from leasestar.database import schema_sql


@pytest.fixture(scope="module")
def schema() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:")
    connection.executescript(schema_sql())
    yield connection
    connection.close()


def declared_indexes(schema: sqlite3.Connection) -> dict[str, tuple[str, ...]]:
    """name -> columns of every index schema.sql creates (not the primary key's own)."""
    indexes: dict[str, tuple[str, ...]] = {}
    for _, name, _, origin, _ in schema.execute(f"PRAGMA index_list({APPLICANTS.table})"):
        if origin == "c":
            columns = schema.execute(f"PRAGMA index_info({name})").fetchall()
            indexes[name] = tuple(column for _, _, column in sorted(columns))
    return indexes


def test_the_indexes_are_schema_sqls(schema: sqlite3.Connection) -> None:
    assert {index.name: index.columns for index in APPLICANTS.indexes} == declared_indexes(schema)


def test_the_not_null_columns_are_schema_sqls(schema: sqlite3.Connection) -> None:
    columns = schema.execute(f"PRAGMA table_info({APPLICANTS.table})").fetchall()
    not_null = {name for _, name, _, required, _, _ in columns if required}
    # Of the columns an order or the copy may name (the body and hash are never keyed).
    keyed = set(APPLICANTS.sortable) | {"change_seq"}
    assert APPLICANTS.not_null == not_null & keyed


def test_every_copy_column_and_sortable_field_is_a_column(schema: sqlite3.Connection) -> None:
    columns = {row[1] for row in schema.execute(f"PRAGMA table_info({APPLICANTS.table})")}
    assert set(APPLICANTS.copy_columns) <= columns
    assert set(APPLICANTS.sortable) <= columns
    assert APPLICANTS.scope_column in columns


def test_every_broad_filter_tests_a_copy_column() -> None:
    """A broad filter the copy cannot answer would be counted wrong."""
    for spec in FILTERS:
        if spec.broad:
            assert spec.column in APPLICANTS.copy_columns, spec.name


def test_what_the_indexes_serve(schema: sqlite3.Connection) -> None:
    """Orders of several keys whose index continues with the id, read from SQLite; the
    default order's index carries the two filterable instants after its id."""
    served = set()
    for columns in declared_indexes(schema).values():
        if "id" in columns[1:] and columns.index("id") > 1:
            served.add(columns[: columns.index("id")])
    assert APPLICANTS.order_indexes == served
    assert APPLICANTS.order_indexes == {
        ("property_id", "created_at"),
        ("integration_id", "created_at"),
        ("last_name", "first_name"),
    }
    assert APPLICANTS.filter_order_indexes == {
        ("property_id", "created_at"),
        ("integration_id", "created_at"),
    }
    assert APPLICANTS.walk_index_carries == {"created_at": {"updated_at", "last_seen"}}


@pytest.mark.parametrize("field", APPLICANTS.sortable)
def test_every_sortable_field_leads_an_index_followed_by_the_id(
    schema: sqlite3.Connection, field: str
) -> None:
    """So that every single-key order, either direction, is an index walk."""
    assert (field, "id") in {
        columns[:2] for columns in declared_indexes(schema).values()
    } or field == "id"


def test_the_scope_versions_table_keys_the_scope_column(schema: sqlite3.Connection) -> None:
    """A scoped page's version is read from one row per scope value: the table's primary
    key is the scope column, and it holds a change sequence."""
    columns = schema.execute(f"PRAGMA table_info({APPLICANTS.scope_versions})").fetchall()
    primary = [name for _, name, _, _, _, key in columns if key]
    assert primary == [APPLICANTS.scope_column]
    assert "change_seq" in {name for _, name, *_ in columns}


def test_the_copy_reads_together_the_instants_one_index_holds(
    schema: sqlite3.Connection,
) -> None:
    """Read from that index (the smallest holding them all), not from the table."""
    together, *apart = APPLICANTS.copy_instant_groups
    holding = [c for c in declared_indexes(schema).values() if set(together) <= set(c)]
    assert holding
    assert len(together) == 3
    assert sorted(c for group in apart for c in group) == ["change_seq"]
    assert sorted(together + tuple(c for group in apart for c in group)) == sorted(
        APPLICANTS.copy_instants
    )


def test_an_index_led_by_an_instant_serves_no_filter_on_it() -> None:
    """A range of an index's first key leaves the rest of it out of order: only an
    equality filter (or the scope) on it lets the index serve a filter and an order."""
    with_instant_lead = replace(
        APPLICANTS,
        indexes=(*APPLICANTS.indexes, Index("by_both", ("updated_at", "created_at", "id"))),
    )
    assert ("updated_at", "created_at") in with_instant_lead.order_indexes
    assert ("updated_at", "created_at") not in with_instant_lead.filter_order_indexes
    assert with_instant_lead.filter_order_indexes == APPLICANTS.filter_order_indexes
