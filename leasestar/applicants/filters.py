"""The filters of the applicant routes: one row each, from which everything else is derived.

As Datasette's `filters.py` keeps its operators in one list, every filter is one row of
`FILTERS`: its name (the query parameter, and its key in `ApplicantQuery.filters`), its
rule, its SQL, its test on the columnar copy, its OpenAPI text, whether a sync may use
it, and whether it is broad (the planner may walk an ordering's index past it, see
`planner.py`) or selective (its own index always wins). Columns come only from this
table; values reach SQL only as bound parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from leasestar.applicants.prepared import phone_digits
from leasestar.errors import InvalidParameter
from leasestar.instants import INSTANT_RULE, parse_instant

FilterValue = str | int


class Within(NamedTuple):
    """What the columnar copy tests for an instant bound: `low <= column <= high`, either
    side open (None)."""

    column: str
    low: int | None
    high: int | None


class Equals(NamedTuple):
    """What the columnar copy tests for an exact match: `column` holds `value`."""

    column: str
    value: str


class AnyOf(NamedTuple):
    """What the columnar copy tests for a token's scope: `column` holds one of `values`."""

    column: str
    values: frozenset[str]


CopyTest = Within | Equals | AnyOf


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryParameterSpec:
    """One query parameter: its text and schema for OpenAPI."""

    name: str
    description: str
    schema: Mapping[str, Any]
    list_only: bool = False
    example: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Filter(QueryParameterSpec):
    """Exact match on the column of the same name (a list-route filter by default).

    `broad`: matches may be many, so walking an ordering's index past them can beat
    collecting them (`planner.py`); a selective filter's own index always wins.
    `sync_safe`: a record never changes this field, so a sync may narrow by it.
    `requires`: filters that must be given with this one.
    """

    description: str = ""
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})
    list_only: bool = True
    column: str = ""
    broad: bool = True
    sync_safe: bool = False
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.column:
            object.__setattr__(self, "column", self.name)
        if not self.description:
            object.__setattr__(self, "description", f"Exact match on {self.name}.")

    def parse(self, text: str) -> FilterValue:
        """The value of a non-empty parameter (raises InvalidParameter)."""
        return text

    @property
    def equality(self) -> bool:
        """Whether the filter holds its column to one value (not a range of it)."""
        return True

    def where(self, column: str, value: FilterValue) -> tuple[str, tuple[FilterValue, ...]]:
        """The SQL condition on `column` (the column, or its planner-hinted form)."""
        return f"{column} = ?", (value,)

    def copy_test(self, value: FilterValue) -> CopyTest:
        """The same condition on the columnar copy (`match_counter.py`): a broad filter's."""
        return Equals(self.column, str(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class InstantBound(Filter):
    """`<column>_gte` / `<column>_lte`: an inclusive bound on a datetime column."""

    # Both forms it takes have a format generators know (and "no offset" and minutes
    # are in the description): a generated client then takes a datetime or a date.
    schema: Mapping[str, Any] = field(
        default_factory=lambda: {
            "anyOf": [
                {"type": "string", "format": "date-time"},
                {"type": "string", "format": "date"},
            ]
        }
    )
    example: str | None = "2024-01-01T00:00:00Z"
    list_only: bool = False
    at_least: bool = field(init=False, default=False)  # `_gte`; else `_lte`

    def __post_init__(self) -> None:
        column, _, bound = self.name.rpartition("_")
        side = "at or after" if bound == "gte" else "at or before"
        object.__setattr__(self, "column", column)
        object.__setattr__(self, "at_least", bound == "gte")
        object.__setattr__(
            self,
            "description",
            f"Keeps records whose {column} is {side} this instant (inclusive, compared to "
            f"the microsecond). Accepts {INSTANT_RULE}.",
        )

    def parse(self, text: str) -> FilterValue:
        try:
            return parse_instant(text)
        except ValueError:
            raise InvalidParameter(self.name, text, f"{self.name} must be {INSTANT_RULE}") from None

    @property
    def equality(self) -> bool:
        return False

    def where(self, column: str, value: FilterValue) -> tuple[str, tuple[FilterValue, ...]]:
        return f"{column} {'>=' if self.at_least else '<='} ?", (value,)

    def copy_test(self, value: FilterValue) -> CopyTest:
        bound = int(value)
        return (
            Within(self.column, bound, None) if self.at_least else Within(self.column, None, bound)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AsciiCaseless(Filter):
    """Exact match ignoring ASCII case."""

    def where(self, column: str, value: FilterValue) -> tuple[str, tuple[FilterValue, ...]]:
        # NOCASE folds ASCII only, which is exactly the contract's rule, and lets the
        # column's index answer; but it stops comparing at a NUL character, so upper()
        # (ASCII only too, and over every byte) makes the match exact.
        return f"{column} = ? COLLATE NOCASE AND upper({column}) = upper(?)", (value, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhoneDigits(Filter):
    """Ten digits, matched against the stored digits of a phone (`phone_digits`)."""

    def parse(self, text: str) -> FilterValue:
        if len(text) != 10 or phone_digits(text) != text:
            raise InvalidParameter(self.name, text, f"{self.name} must be exactly 10 digits")
        return text

    def where(self, column: str, value: FilterValue) -> tuple[str, tuple[FilterValue, ...]]:
        return f"{column} IN (?, ?)", (value, f"1{value}")


FILTERS: Final[tuple[Filter, ...]] = (
    InstantBound(name="updated_at_gte"),
    InstantBound(name="updated_at_lte"),
    InstantBound(name="last_seen_gte"),
    InstantBound(name="last_seen_lte"),
    Filter(name="integration_id", sync_safe=True),
    Filter(name="integration_vendor"),
    Filter(name="property_id"),
    Filter(name="x_property_id", sync_safe=True),
    AsciiCaseless(
        name="email_1",
        description="Exact match on email_1, ignoring ASCII case.",
        broad=False,
    ),
    PhoneDigits(
        name="phone_1",
        description="Exactly 10 digits; matches a stored phone_1 whose digits are those 10, "
        "or those 10 behind a leading country code 1.",
        schema={"type": "string", "pattern": "^[0-9]{10}$"},
        column="phone_1_digits",
        broad=False,
    ),
    Filter(
        name="x_id",
        description="Exact match on the source-system id; requires integration_id and "
        "x_property_id, because source systems reuse ids across integrations and properties.",
        broad=False,  # near-unique
        sync_safe=True,
        requires=("integration_id", "x_property_id"),
    ),
)
FILTERS_BY_NAME: Final[Mapping[str, Filter]] = {spec.name: spec for spec in FILTERS}
# The filters a sync may narrow by: parts of the upsert key, which a record never
# changes. Under any other filter a record could leave the matches by a write, and the
# feed, which lists records as they are now, could never tell the client so.
SYNC_FILTERS: Final = tuple(spec.name for spec in FILTERS if spec.sync_safe)
