"""The total order of a list in SQL: ORDER BY, its columns, and the keyset after a position.

Identifiers come only from `SORTABLE_FIELDS` (and `change_seq`, the sync feed's order).
Why a position is one or two ranges: docs/list-planning.md, "Keyset ranges".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from leasestar.applicants.cursors import KeyValue
from leasestar.applicants.records import SortKey
from leasestar.applicants.resource import APPLICANTS

# API field name -> SQL column (the same names): the only identifiers that ever reach
# ORDER BY. The names are the resource's (`resource.APPLICANTS`).
SORTABLE_FIELDS: Final[Mapping[str, str]] = {name: name for name in APPLICANTS.sortable}
# The sync feed's ordering: by change sequence, which is unique (so already total).
CHANGE_ORDER: Final = (SortKey("change_seq", "asc"),)
# Columns an ordering may name: the sortable fields, plus change_seq for the sync feed.
_ORDER_COLUMNS: Final[Mapping[str, str]] = {**SORTABLE_FIELDS, "change_seq": "change_seq"}
_UNIQUE_KEYS: Final = APPLICANTS.unique_keys
# A descending row-value seek is exact only on columns never null.
_NOT_NULL_KEYS: Final = APPLICANTS.not_null


@dataclass(frozen=True, slots=True)
class SqlFragment:
    """A piece of SQL and the values bound to its placeholders."""

    sql: str
    params: tuple[Any, ...] = ()


@lru_cache(maxsize=4096)  # pure; the same few query shapes recur on every request
def total_order(order_by: tuple[SortKey, ...]) -> tuple[SortKey, ...]:
    """The ordering actually run: the requested keys plus the hidden `id` tiebreak."""
    if not order_by:
        return (SortKey("id", "asc"),)
    if any(key.field in _UNIQUE_KEYS for key in order_by):
        return order_by
    return (*order_by, SortKey("id", order_by[-1].direction))


def order_columns(order_by: tuple[SortKey, ...]) -> list[str]:
    """The whitelisted columns of the total order, in order."""
    return [_ORDER_COLUMNS[key.field] for key in total_order(order_by)]


@lru_cache(maxsize=4096)  # pure; the same few query shapes recur on every request
def build_order_by(order_by: tuple[SortKey, ...], *, sort: bool = False, skip: int = 0) -> str:
    """ORDER BY clause from whitelisted columns; SQLite's null placement is the contract's.

    `sort`: written `+column`, an expression no index provides, so SQLite sorts the rows
    it finds rather than walking the ordering's index to find them in order.
    `skip`: leave out the total order's first keys (each one value on every row read).
    """
    keys = total_order(order_by)[skip:]
    prefix = "+" if sort else ""
    return "ORDER BY " + ", ".join(
        f"{prefix}{_ORDER_COLUMNS[key.field]} {key.direction.upper()}" for key in keys
    )


def _after_one(
    column: str, direction: str, value: KeyValue, *, or_equal: bool, nullable: bool
) -> tuple[str, tuple[KeyValue, ...]]:
    """SQL for "column comes after value" (or equals it) in the contract's null placement."""
    if direction == "asc":  # nulls first
        if value is None:
            return (f"{column} IS NOT NULL", ())
        return (f"{column} {'>=' if or_equal else '>'} ?", (value,))
    # desc: nulls last, so nothing comes after a null but other nulls (left to the tiebreak)
    if value is None:
        return "0", ()
    smaller = f"{column} {'<=' if or_equal else '<'} ?"
    return (f"({smaller} OR {column} IS NULL)" if nullable else smaller), (value,)


def _keys_up_to_id(
    keys: tuple[SortKey, ...], values: tuple[KeyValue, ...]
) -> tuple[tuple[SortKey, ...], tuple[KeyValue, ...]]:
    # Ids are unique, so keys after `id` (`order-by=id,first_name`) decide nothing; and
    # kept, a null among them made "at or after" drop the row it starts from.
    fields = [key.field for key in keys]
    if "id" in fields[:-1]:
        cut = fields.index("id") + 1
        return keys[:cut], values[:cut]
    return keys, values


def _keyset_range(
    keys: tuple[SortKey, ...],
    values: tuple[KeyValue, ...],
    inclusive: bool,
    not_null: frozenset[str],
) -> SqlFragment:
    """The rows after these key values as one predicate, `not_null` fields known non-null:
    a row-value comparison where that is exact, else the expanded OR form."""
    columns = [_ORDER_COLUMNS[key.field] for key in keys]
    directions = {key.direction for key in keys}
    # Descending, nulls come last, but `(a, b) < (?, ?)` is not true for a null a or b:
    # the row value would drop them, so it is used only where no column can be null.
    if (
        len(directions) == 1
        and None not in values
        and (directions == {"asc"} or all(key.field in not_null for key in keys))
    ):
        op = (">" if directions == {"asc"} else "<") + ("=" if inclusive else "")
        placeholders = ", ".join("?" * len(values))
        return SqlFragment(f"({', '.join(columns)}) {op} ({placeholders})", tuple(values))
    alternatives: list[str] = []
    params: list[KeyValue] = []
    for index, (key, column, value) in enumerate(zip(keys, columns, values, strict=True)):
        equal: list[str] = []
        for previous_column, previous in zip(columns[:index], values[:index], strict=True):
            if previous is None:
                equal.append(f"{previous_column} IS NULL")
            else:
                equal.append(f"{previous_column} = ?")
                params.append(previous)
        after_sql, after_params = _after_one(
            column,
            key.direction,
            value,
            or_equal=inclusive and index == len(keys) - 1,
            nullable=key.field not in not_null,
        )
        params.extend(after_params)
        alternatives.append("(" + " AND ".join([*equal, after_sql]) + ")")
    expanded = "(" + " OR ".join(alternatives) + ")"
    first, first_value = keys[0], values[0]
    if first_value is not None and (first.direction == "asc" or first.field in not_null):
        # Implied by the expansion, but a plain range SQLite can seek the index with.
        op = ">=" if first.direction == "asc" else "<="
        return SqlFragment(f"{columns[0]} {op} ? AND {expanded}", (first_value, *params))
    return SqlFragment(expanded, tuple(params))


def keyset_ranges(
    keys: tuple[SortKey, ...], values: tuple[KeyValue, ...], *, inclusive: bool = False
) -> tuple[SqlFragment, ...]:
    """The rows after `values` in the total order `keys`, as one or two disjoint ranges.

    Args:
        keys: the total order (`total_order`).
        values: the key values of a position (a cursor's last record, or a checkpoint).
        inclusive: the rows at or after `values` (the last key is unique, never null).

    Each range is one seekable range of the first key's index, in walk order:
    docs/list-planning.md, "Keyset ranges".
    """
    keys, values = _keys_up_to_id(keys, values)
    first, value = keys[0], values[0]
    column = _ORDER_COLUMNS[first.field]
    if first.field in _NOT_NULL_KEYS or (first.direction == "asc" and value is not None):
        return (_keyset_range(keys, values, inclusive, _NOT_NULL_KEYS),)
    if value is not None:
        smaller = _keyset_range(keys, values, inclusive, _NOT_NULL_KEYS | {first.field})
        return smaller, SqlFragment(f"{column} IS NULL")
    # A nullable key is never the last: the total order ends with a unique key.
    tail = _keyset_range(keys[1:], values[1:], inclusive, _NOT_NULL_KEYS)
    among_nulls = SqlFragment(f"{column} IS NULL AND {tail.sql}", tail.params)
    if first.direction == "desc":
        return (among_nulls,)
    # `k IS NOT NULL` seeks too: SQLite starts the walk just past the nulls.
    return among_nulls, SqlFragment(f"{column} IS NOT NULL")
