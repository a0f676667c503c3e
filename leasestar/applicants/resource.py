"""The applicant list resource, declared once: what the list planner knows of its table.

The planner (`planner.py`, `plan.py`, `ordering.py`, the columnar copy) learns about
applicants only from this declaration and from the filter table (`filters.FILTERS`):
the table, its sortable fields, which columns are never null, the indexes of
`schema.sql` and what each serves, the column a token's scope tests, and the columns
the columnar copy keeps. tests/applicants/test_resource.py holds the declaration equal
to what SQLite reads from `schema.sql`. A second list resource would be a second
declaration (docs/list-planning.md, "Another list resource").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from leasestar.applicants.filters import FILTERS, Filter
from leasestar.client.records import SORTABLE_FIELDS


@dataclass(frozen=True, slots=True)
class Index:
    """One index of `schema.sql`: its name and its columns, in order."""

    name: str
    columns: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListResource:
    """The facts of one table that a list endpoint (`/v1/<model_name>`) is planned by.

    Derived here, never written twice: which orders of several keys one index serves
    (`order_indexes`), which of those also serve an equality filter on their first key
    (`filter_order_indexes`), and which columns an order's index carries besides its
    key (`walk_index_carries`).
    """

    table: str
    sortable: tuple[str, ...]
    # Keys that are unique: an order holding one is already total (no `id` tiebreak).
    unique_keys: frozenset[str]
    not_null: frozenset[str]
    # The column a token's scope (its integrations) tests, and the table that holds each
    # of its values' last change sequence (what a scoped page's version reads).
    scope_column: str
    scope_versions: str
    filters: tuple[Filter, ...]
    indexes: tuple[Index, ...]
    # The columnar copy: instants and sequences as they are, and text columns as codes,
    # those the broad filters match and those whose values repeat, kept for orders.
    copy_instants: tuple[str, ...]
    copy_filtered_codes: tuple[str, ...]
    copy_ordered_codes: tuple[str, ...]
    order_indexes: frozenset[tuple[str, ...]] = field(init=False)
    filter_order_indexes: frozenset[tuple[str, ...]] = field(init=False)
    walk_index_carries: Mapping[str, frozenset[str]] = field(init=False)

    def __post_init__(self) -> None:
        # An index serves an order of several keys when those keys lead it and the id
        # follows them (the total order); what follows the id it carries.
        served: set[tuple[str, ...]] = set()
        carries: dict[str, frozenset[str]] = {}
        for index in self.indexes:
            if "id" not in index.columns[1:]:
                continue
            cut = index.columns.index("id")
            if cut > 1:
                served.add(index.columns[:cut])
            if cut == 1 and len(index.columns) > 2:
                carries[index.columns[0]] = frozenset(index.columns[2:])
        # A broad filter the copy cannot answer would silently be counted wrong.
        for spec in self.filters:
            if spec.broad and spec.column not in self.copy_columns:
                raise RuntimeError(f"broad filter {spec.name} tests {spec.column}, not copied")
        # An index serves a filter and an order only for an equality on its first key (a
        # range of it would leave the rest of the index out of order).
        equal = {spec.column for spec in self.filters if spec.broad and spec.equality}
        equal.add(self.scope_column)
        object.__setattr__(self, "order_indexes", frozenset(served))
        object.__setattr__(
            self, "filter_order_indexes", frozenset(keys for keys in served if keys[0] in equal)
        )
        object.__setattr__(self, "walk_index_carries", carries)

    @property
    def copy_codes(self) -> tuple[str, ...]:
        return self.copy_filtered_codes + self.copy_ordered_codes

    @property
    def copy_columns(self) -> tuple[str, ...]:
        return self.copy_instants + self.copy_codes

    @property
    def copy_groupings(self) -> tuple[tuple[str, str], ...]:
        """(group, instant): the copy's file holds the rows of each column an equality or
        the scope tests by code, then by each instant a range tests (the bounds' columns,
        and `change_seq`, the sync position's), which a range within one group is
        counted and listed from."""
        ranged = dict.fromkeys(
            spec.column for spec in self.filters if spec.broad and not spec.equality
        )
        return tuple(
            (group, instant)
            for group in self.copy_filtered_codes
            for instant in ("change_seq", *ranged)
        )

    @property
    def copy_instant_groups(self) -> tuple[tuple[str, ...], ...]:
        """The copied instants read together: those one index holds (read from it, not
        from the table), then each of the others alone."""
        held = max(
            ([c for c in self.copy_instants if c in index.columns] for index in self.indexes),
            key=len,
        )
        return (tuple(held), *((c,) for c in self.copy_instants if c not in held))


def _by(*columns: str) -> Index:
    """`applicants_by_<first column>`, schema.sql's name for an index led by it."""
    return Index(f"applicants_by_{columns[0]}", columns)


def _sorted_by(column: str) -> Index:
    """`applicants_sorted_by_<column>`: (column, id), beside an index that continues
    the column with another key."""
    return Index(f"applicants_sorted_by_{column}", (column, "id"))


APPLICANTS: Final = ListResource(
    table="applicants",
    sortable=SORTABLE_FIELDS,
    unique_keys=frozenset({"id", "change_seq"}),
    not_null=frozenset(
        {"id", "change_seq", "created_at", "updated_at", "last_seen", "x_id", "x_property_id"}
        | {"property_id", "integration_id", "integration_vendor"}
    ),
    scope_column="integration_id",
    scope_versions="integration_versions",
    filters=FILTERS,
    indexes=(
        Index("applicants_source_key", ("integration_id", "x_property_id", "x_id")),
        Index("applicants_change_seq", ("change_seq",)),
        # The default order's index carries both filterable instants.
        _by("created_at", "id", "updated_at", "last_seen"),
        _by("updated_at", "id"),
        _by("last_seen", "id"),
        _by("x_id", "id"),
        _by("x_property_id", "id"),
        _by("property_id", "created_at", "id"),
        _by("integration_id", "created_at", "id"),
        _sorted_by("property_id"),
        _sorted_by("integration_id"),
        _by("integration_vendor", "id"),
        _by("first_name", "id"),
        _by("middle_name", "id"),
        _by("last_name", "first_name", "id"),
        _sorted_by("last_name"),
        _by("email_1", "id"),
        Index("applicants_by_email_1_nocase", ("email_1",)),  # COLLATE NOCASE
        _by("phone_1_digits"),
        _by("date_of_birth", "id"),
        _by("city", "id"),
        _by("state", "id"),
        _by("zip", "id"),
    ),
    copy_instants=("change_seq", "created_at", "updated_at", "last_seen"),
    copy_filtered_codes=("integration_id", "integration_vendor", "property_id", "x_property_id"),
    # Not the unique text fields (id, x_id, email_1): a code per row would cost more
    # than the row.
    copy_ordered_codes=(
        "first_name",
        "middle_name",
        "last_name",
        "date_of_birth",
        "state",
        "city",
        "zip",
    ),
)
