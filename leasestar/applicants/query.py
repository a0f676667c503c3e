"""From query string to SQL: parse the parameters, then build WHERE and ORDER BY.

Data flows one way: the raw query (a multi-dict) is parsed into an `ApplicantQuery`
Struct, and the SQL is built from that Struct alone. SQL identifiers come only from
`SORTABLE_FIELDS`; every value is a bound parameter.

The parameter table `PARAMETERS` is the one source of both the parser's rules and the
OpenAPI description, so the document cannot drift from the behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

import msgspec

from leasestar.applicants.cursors import CursorCodec, CursorState, KeyValue
from leasestar.applicants.records import SortKey
from leasestar.errors import InvalidParameter
from leasestar.instants import INSTANT_RULE, parse_instant

MAX_LIMIT: Final = 250
DEFAULT_LIMIT: Final = 100
MAX_OFFSET: Final = 2**63 - 1
MAX_ORDER_KEYS: Final = 4
MAX_WAIT_SECONDS: Final = 60

# API field name -> SQL column. The only identifiers that ever reach ORDER BY.
SORTABLE_FIELDS: Final[Mapping[str, str]] = {
    name: name
    for name in (
        "id",
        "created_at",
        "updated_at",
        "last_seen",
        "x_id",
        "x_property_id",
        "property_id",
        "integration_id",
        "integration_vendor",
        "first_name",
        "middle_name",
        "last_name",
        "email_1",
        "date_of_birth",
        "city",
        "state",
        "zip",
    )
}
DEFAULT_ORDER: Final = (SortKey("created_at", "desc"),)
# The sync feed's ordering: by change sequence, which is unique (so already total).
CHANGE_ORDER: Final = (SortKey("change_seq", "asc"),)
# Columns an ordering may name: the sortable fields, plus change_seq for the sync feed.
_ORDER_COLUMNS: Final[Mapping[str, str]] = {**SORTABLE_FIELDS, "change_seq": "change_seq"}
_UNIQUE_KEYS: Final = frozenset({"id", "change_seq"})
# Columns that are never null (schema.sql): a descending row-value seek is exact only on these.
_NOT_NULL_KEYS: Final = frozenset(
    {"id", "change_seq", "created_at", "updated_at", "last_seen", "x_id", "x_property_id"}
    | {"property_id", "integration_id", "integration_vendor"}
)

# Equality filters of the list route: parameter -> column.
EQUALITY_FILTERS: Final[Mapping[str, str]] = {
    "integration_id": "integration_id",
    "integration_vendor": "integration_vendor",
    "property_id": "property_id",
    "x_property_id": "x_property_id",
    "x_id": "x_id",
}
DATE_BOUNDS: Final[Mapping[str, tuple[str, str]]] = {
    "updated_at_gte": ("updated_at", ">="),
    "updated_at_lte": ("updated_at", "<="),
    "last_seen_gte": ("last_seen", ">="),
    "last_seen_lte": ("last_seen", "<="),
}

_INTEGER = re.compile(r"[0-9]+")
_PHONE = re.compile(r"[0-9]{10}")
_ORDER_KEY = re.compile(r"(?P<field>[A-Za-z0-9_]+)(?::(?P<direction>[A-Za-z]+))?")


class ApplicantQuery(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A validated query: everything the storage layer needs, nothing HTTP."""

    offset: int = 0
    limit: int = DEFAULT_LIMIT
    order_by: tuple[SortKey, ...] = DEFAULT_ORDER
    # Date bounds, in UTC microseconds since the epoch.
    updated_at_gte: int | None = None
    updated_at_lte: int | None = None
    last_seen_gte: int | None = None
    last_seen_lte: int | None = None
    # Equality filters (list route only).
    integration_id: str | None = None
    integration_vendor: str | None = None
    property_id: str | None = None
    x_property_id: str | None = None
    x_id: str | None = None
    email_1: str | None = None
    phone_1: str | None = None  # exactly ten digits
    # Sync feed: only records whose change sequence is above this.
    changed_since: int | None = None
    # Keyset: the total-order key values of the last record served (from a cursor).
    after: tuple[KeyValue, ...] | None = None

    @property
    def sql_offset(self) -> int:
        """Rows to skip in SQL: a cursor page seeks by key, so it skips none."""
        return 0 if self.after is not None else self.offset


@dataclass(frozen=True, slots=True)
class QueryParameterSpec:
    """One query parameter: its rule for the parser and its text for OpenAPI."""

    name: str
    description: str
    schema: dict[str, Any]
    list_only: bool = False
    example: str | None = field(default=None)


_SORTABLE_LIST = ", ".join(SORTABLE_FIELDS)
# The grammar of order-by for OpenAPI (empty, or 1-4 keys); "no field twice" is in words.
_ORDER_BY_KEY = f"({'|'.join(SORTABLE_FIELDS)})(:([Aa][Ss][Cc]|[Dd][Ee][Ss][Cc]))?"
_ORDER_BY_PATTERN = f"^({_ORDER_BY_KEY}(,{_ORDER_BY_KEY}){{0,{MAX_ORDER_KEYS - 1}}})?$"
PARAMETERS: Final[tuple[QueryParameterSpec, ...]] = (
    QueryParameterSpec(
        "offset",
        "Number of records skipped. Past the end: empty results, hasMore false.",
        {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0},
    ),
    QueryParameterSpec(
        "limit",
        f"Maximum number of records returned, 1 to {MAX_LIMIT}.",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    ),
    QueryParameterSpec(
        "order-by",
        "Comma-separated `field[:asc|desc]` keys, at most 4, no field twice; direction "
        "case-insensitive, asc when omitted. Absent: `created_at:desc`. Present but empty: "
        "no sorting requested (records in id order, `orderBy: []`). Strings compare by code "
        "point; nulls sort first ascending, last descending; a hidden final `id` key in the "
        f"direction of the last key makes every order total. Sortable fields: {_SORTABLE_LIST}.",
        {"type": "string", "default": "created_at:desc", "pattern": _ORDER_BY_PATTERN},
        example="last_name:asc,first_name:asc",
    ),
    *(
        QueryParameterSpec(
            name,
            f"Keeps records whose {column} is {'at or after' if op == '>=' else 'at or before'} "
            f"this instant (inclusive, compared to the microsecond). Accepts {INSTANT_RULE}.",
            {"type": "string", "format": "date-time"},
            example="2024-01-01T00:00:00Z",
        )
        for name, (column, op) in DATE_BOUNDS.items()
    ),
    *(
        QueryParameterSpec(name, f"Exact match on {name}.", {"type": "string"}, list_only=True)
        for name in ("integration_id", "integration_vendor", "property_id", "x_property_id")
    ),
    QueryParameterSpec(
        "email_1",
        "Exact match on email_1, ignoring ASCII case.",
        {"type": "string"},
        list_only=True,
    ),
    QueryParameterSpec(
        "phone_1",
        "Exactly 10 digits; matches a stored phone_1 whose digits are those 10, or those 10 "
        "behind a leading country code 1.",
        {"type": "string", "pattern": "^[0-9]{10}$"},
        list_only=True,
    ),
    QueryParameterSpec(
        "x_id",
        "Exact match on the source-system id; requires integration_id and x_property_id, "
        "because source systems reuse ids across integrations and properties.",
        {"type": "string"},
        list_only=True,
    ),
    QueryParameterSpec(
        "cursor",
        "The `meta.next` of a previous page: the page after it, with the same ordering, "
        "filters and limit. Other parameters given with a cursor must match it or be "
        "absent; `offset` cannot be given. Unlike offsets, a cursor walk never skips or "
        "repeats a record that exists throughout the walk, even while data is written.",
        {"type": "string"},
        list_only=True,
    ),
    QueryParameterSpec(
        "changed_since",
        "Incremental sync: only records written after this change sequence, in change "
        "order (`order-by` and `offset` cannot be given; of the filters only "
        "`integration_id`, `x_property_id` and `x_id`, which a record never changes). "
        "Start at 0, follow `meta.next` while `hasMore`, then store `meta.changeSeq` and "
        "pass it here next time.",
        {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
        list_only=True,
    ),
    QueryParameterSpec(
        "wait",
        "Long poll of the sync feed, with `changed_since` (or its cursor): when no record "
        f"is newer, hold the request up to this many seconds (0 to {MAX_WAIT_SECONDS}) until "
        "a write lands, then answer with the new records; when none lands, an empty page "
        "whose `meta.changeSeq` is the one asked for.",
        {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS},
        list_only=True,
    ),
)
LIST_PARAMETER_NAMES: Final = frozenset(spec.name for spec in PARAMETERS)
RECORD_PARAMETER_NAMES: Final = frozenset(spec.name for spec in PARAMETERS if not spec.list_only)


def _single_values(pairs: Iterable[tuple[str, str]], allowed: frozenset[str]) -> dict[str, str]:
    """Reject unknown and repeated parameters; drop empty values (absent), except order-by."""
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise InvalidParameter(name, value, f"unknown query parameter '{name}'")
        if name in seen:
            raise InvalidParameter(name, value, f"query parameter '{name}' is given more than once")
        seen[name] = value
    return {name: value for name, value in seen.items() if value != "" or name == "order-by"}


def _integer(name: str, text: str, low: int, high: int) -> int:
    # Bound the length before int(): a string of thousands of digits makes int() raise.
    digits = text.lstrip("0") or "0"
    if (
        _INTEGER.fullmatch(text) is None
        or len(digits) > len(str(high))
        or not low <= int(digits) <= high
    ):
        raise InvalidParameter(name, text, f"{name} must be an integer between {low} and {high}")
    return int(digits)


def parse_order_by(text: str) -> tuple[SortKey, ...]:
    """Parse `order-by`: comma-separated `field[:asc|desc]`; empty means no sorting."""
    if text == "":
        return ()
    keys: list[SortKey] = []
    rule = (
        "order-by must be up to 4 comma-separated keys field[:asc|desc], no field twice, "
        f"fields from: {_SORTABLE_LIST}"
    )
    parts = text.split(",")
    if len(parts) > MAX_ORDER_KEYS:
        raise InvalidParameter("order-by", text, rule)
    for part in parts:
        match = _ORDER_KEY.fullmatch(part)
        if match is None or match["field"] not in SORTABLE_FIELDS:
            raise InvalidParameter("order-by", text, rule)
        direction = (match["direction"] or "asc").lower()
        if direction not in ("asc", "desc") or any(k.field == match["field"] for k in keys):
            raise InvalidParameter("order-by", text, rule)
        keys.append(SortKey(match["field"], "asc" if direction == "asc" else "desc"))
    return tuple(keys)


def _parse(values: dict[str, str]) -> ApplicantQuery:
    fields: dict[str, Any] = {}
    if "offset" in values:
        fields["offset"] = _integer("offset", values["offset"], 0, MAX_OFFSET)
    if "limit" in values:
        fields["limit"] = _integer("limit", values["limit"], 1, MAX_LIMIT)
    if "order-by" in values:
        fields["order_by"] = parse_order_by(values["order-by"])
    for name in DATE_BOUNDS:
        if name in values:
            try:
                fields[name] = parse_instant(values[name])
            except ValueError:
                raise InvalidParameter(
                    name, values[name], f"{name} must be {INSTANT_RULE}"
                ) from None
    for name in ("integration_id", "integration_vendor", "property_id", "x_property_id", "email_1"):
        if name in values:
            fields[name] = values[name]
    if "phone_1" in values:
        if _PHONE.fullmatch(values["phone_1"]) is None:
            raise InvalidParameter(
                "phone_1", values["phone_1"], "phone_1 must be exactly 10 digits"
            )
        fields["phone_1"] = values["phone_1"]
    if "x_id" in values:
        if "integration_id" not in values or "x_property_id" not in values:
            raise InvalidParameter(
                "x_id", values["x_id"], "x_id requires integration_id and x_property_id"
            )
        fields["x_id"] = values["x_id"]
    return ApplicantQuery(**fields)


# Query parameter -> ApplicantQuery field, for comparing parameters with a cursor.
_FIELD_OF_PARAMETER: Final = {"order-by": "order_by"}
_FILTER_FIELDS: Final = (
    *DATE_BOUNDS,
    "integration_id",
    "integration_vendor",
    "property_id",
    "x_property_id",
    "x_id",
    "email_1",
    "phone_1",
)


# The filters a sync may narrow by: parts of the upsert key, which a record never
# changes. Under any other filter a record could leave the matches by a write, and the
# feed, which lists records as they are now, could never tell the client so.
SYNC_FILTERS: Final = ("integration_id", "x_property_id", "x_id")
_NOT_WITH_SYNC: Final = (
    "integration_vendor",
    "property_id",
    "email_1",
    "phone_1",
    *DATE_BOUNDS,
)


def _with_changed_since(values: dict[str, str], query: ApplicantQuery) -> ApplicantQuery:
    text = values["changed_since"]
    since = _integer("changed_since", text, 0, MAX_OFFSET)
    for conflicting in ("order-by", "offset"):
        if conflicting in values:
            raise InvalidParameter(
                conflicting,
                values[conflicting],
                f"{conflicting} cannot be combined with changed_since (the feed is in "
                "change order; follow meta.next)",
            )
    for mutable in _NOT_WITH_SYNC:
        if mutable in values:
            raise InvalidParameter(
                mutable,
                values[mutable],
                f"{mutable} cannot be combined with changed_since: a record can leave its "
                "matches by a write, which the feed could not report; a sync filters only "
                f"on {', '.join(SYNC_FILTERS)}, which never change",
            )
    return msgspec.structs.replace(query, changed_since=since, order_by=CHANGE_ORDER)


def cursor_state(query: ApplicantQuery, position: int, after: tuple[KeyValue, ...]) -> CursorState:
    """What the cursor to the page after `position` must remember of `query`."""
    filters = tuple(
        (name, value) for name in _FILTER_FIELDS if (value := getattr(query, name)) is not None
    )
    return CursorState(
        version=1,
        limit=query.limit,
        order_by=query.order_by,
        filters=filters,
        changed_since=query.changed_since,
        position=position,
        after=after,
    )


def _from_cursor(text: str, codec: CursorCodec) -> ApplicantQuery:
    state = codec.decode(text)
    filters = dict(state.filters)
    # Signed, so written by this database's server; still checked against the rules of
    # this version, so no state it would not write reaches SQL (a 400, never a 5xx).
    ordering_known = (
        state.order_by == CHANGE_ORDER
        if state.changed_since is not None
        else all(key.field in SORTABLE_FIELDS for key in state.order_by)
    )
    if (
        not filters.keys() <= set(_FILTER_FIELDS)
        or len(state.after) != len(total_order(state.order_by))
        or not ordering_known
        or not 1 <= state.limit <= MAX_LIMIT
        or not 0 <= state.position <= MAX_OFFSET
    ):
        raise InvalidParameter("cursor", text, "cursor is not valid")
    return ApplicantQuery(
        offset=state.position,
        limit=state.limit,
        order_by=state.order_by,
        changed_since=state.changed_since,
        after=state.after,
        **filters,  # type: ignore[arg-type]
    )


def parse_list_query(
    pairs: Iterable[tuple[str, str]], codec: CursorCodec | None = None
) -> ApplicantQuery:
    """Validate the query string of `GET /v1/applicants` (with its cursor, if any)."""
    values = _single_values(pairs, LIST_PARAMETER_NAMES)
    values.pop("wait", None)  # how long to hold the answer, not what it is: parse_wait
    cursor = values.pop("cursor", None)
    if cursor is None or codec is None:
        if cursor is not None:
            raise InvalidParameter("cursor", cursor, "cursors are not available here")
        query = _parse(values)
        return _with_changed_since(values, query) if "changed_since" in values else query
    if "offset" in values:
        raise InvalidParameter("offset", values["offset"], "offset cannot be combined with cursor")
    resumed = _from_cursor(cursor, codec)
    given = _parse(values)
    if "changed_since" in values:
        given = _with_changed_since(values, given)
    for name in values:
        field_name = _FIELD_OF_PARAMETER.get(name, name)
        if getattr(given, field_name) != getattr(resumed, field_name):
            raise InvalidParameter(
                name,
                values[name],
                f"{name} does not match the cursor: omit it, or give the value the "
                "cursor was made with",
            )
    return resumed


def parse_record_query(pairs: Iterable[tuple[str, str]]) -> ApplicantQuery:
    """Validate the query string of `GET /v1/applicants/{id}` (no list-only filters)."""
    return _parse(_single_values(pairs, RECORD_PARAMETER_NAMES))


@dataclass(frozen=True, slots=True)
class SqlFragment:
    """A piece of SQL and the values bound to its placeholders."""

    sql: str
    params: tuple[Any, ...] = ()


@lru_cache(maxsize=4096)  # pure; the same few query shapes recur on every request
def build_where(
    query: ApplicantQuery,
    scope: frozenset[str] | None,
    *,
    walk_order: bool = False,
    keyset: SqlFragment | None = None,
) -> SqlFragment:
    """WHERE clause (possibly empty) for the filters and the token's integration scope.

    With `walk_order`, the broad filters (date ranges, equality on integration, vendor,
    property) are written `+column`, which keeps SQLite from answering them with their
    own index: it then walks the ordering's index and filters as it goes, which beats
    collecting and sorting every match when matches are many (see storage.py).
    `keyset` is one more clause: a range of a page's keyset (see `build_page_select`).
    A cursor's position (`query.after`) is not read here: it reaches SQL only as those
    ranges, which SQLite can seek, and counts and checkpoints ignore it.
    """
    clauses: list[str] = []
    params: list[Any] = []
    hint = "+" if walk_order else ""
    for name, (column, op) in DATE_BOUNDS.items():
        bound = getattr(query, name)
        if bound is not None:
            clauses.append(f"{hint}{column} {op} ?")
            params.append(bound)
    for name, column in EQUALITY_FILTERS.items():
        value = getattr(query, name)
        if value is not None:
            # x_id is near-unique: its own index always wins.
            clauses.append(f"{'' if name == 'x_id' else hint}{column} = ?")
            params.append(value)
    if query.email_1 is not None:
        # NOCASE folds ASCII only, which is exactly the contract's rule, and lets the
        # email index answer; but it stops comparing at a NUL character, so upper()
        # (ASCII only too, and over every byte) makes the match exact.
        clauses.append("email_1 = ? COLLATE NOCASE AND upper(email_1) = upper(?)")
        params.extend((query.email_1, query.email_1))
    if query.phone_1 is not None:
        clauses.append("phone_1_digits IN (?, ?)")
        params.extend((query.phone_1, "1" + query.phone_1))
    if query.changed_since is not None:
        clauses.append("change_seq > ?")
        params.append(query.changed_since)
    if keyset is not None:
        clauses.append(keyset.sql)
        params.extend(keyset.params)
    if scope is not None:
        ordered = sorted(scope)
        clauses.append(f"{hint}integration_id IN ({', '.join('?' * len(ordered))})")
        params.extend(ordered)
    if not clauses:
        return SqlFragment("")
    return SqlFragment("WHERE " + " AND ".join(clauses), tuple(params))


# (filter column, leading order key) pairs that one composite index in schema.sql serves
# together: a page with such a filter and order needs no plan hint.
FILTER_ORDER_INDEXES: Final = frozenset(
    {("property_id", "created_at"), ("integration_id", "created_at")}
)


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
def build_order_by(order_by: tuple[SortKey, ...]) -> str:
    """ORDER BY clause from whitelisted columns; SQLite's null placement is the contract's."""
    keys = total_order(order_by)
    return "ORDER BY " + ", ".join(
        f"{_ORDER_COLUMNS[key.field]} {key.direction.upper()}" for key in keys
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
    """The rows after these key values as one predicate, knowing `not_null` fields non-null.

    When every key runs one way and no value is null this is a row-value comparison,
    which SQLite answers with one index seek; otherwise the expanded form
    `k1 after v1 OR (k1 = v1 AND k2 after v2) OR ...`, led by a plain range on k1 when
    its value bounds the walk on one side.
    """
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
    """The rows after these key values in the total order `keys` (or at or after them,
    with `inclusive`: the last key is unique and never null), as one or two disjoint
    predicates, in walk order, each a single range of the first key's index.

    SQLite seeks an index only for one range of its first column, and a range never
    holds nulls: `k < ?` stops at them, `k IS NULL` is nothing but them. So when the
    rows after a cursor span both a null block and non-null values of the first key,
    one predicate (`k < ? OR k IS NULL`) would make SQLite walk the index from its far
    end to the cursor, a cost growing with depth. Instead each side is its own range:

    * asc after a value, or a key that is never null: one range from the value (the
      nulls, first, are all behind it);
    * desc after a value: the smaller values, then the trailing null block;
    * desc after a null: the rest of the null block, by the keys after it;
    * asc after a null: the rest of the null block, then every non-null value.
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


def build_keyset(
    keys: tuple[SortKey, ...], values: tuple[KeyValue, ...], *, inclusive: bool = False
) -> SqlFragment:
    """WHERE fragment for "after these key values" in the total order `keys` (or "at or
    after" them, with `inclusive`: the last key is unique and never null).

    One predicate: exact, but when it joins two ranges (see `keyset_ranges`) SQLite
    cannot seek it; pages are read by `build_page_select`, which seeks each range.
    """
    ranges = keyset_ranges(keys, values, inclusive=inclusive)
    if len(ranges) == 1:
        return ranges[0]
    return SqlFragment(
        "(" + " OR ".join(f"({part.sql})" for part in ranges) + ")",
        tuple(param for part in ranges for param in part.params),
    )


@lru_cache(maxsize=4096)  # pure; the same few query shapes recur on every request
def build_page_select(
    query: ApplicantQuery,
    scope: frozenset[str] | None,
    *,
    limit: int,
    skip: int,
    walk_order: bool = False,
    start: tuple[KeyValue, ...] | None = None,
) -> SqlFragment:
    """The statement reading a page: the rows (body, change_seq) of the matches in the
    total order, `limit` of them after skipping `skip`; after the cursor's key values
    (`query.after`), or else at or after `start` (a checkpoint's key values), else from
    the first match.

    When the keyset is two ranges (see `keyset_ranges`), each is one arm of a UNION ALL.
    SQLite runs a compound's ORDER BY as a merge of its arms, each walking its own range
    of the index in order, so the page still reads about `limit` rows at any depth. A
    compound's ORDER BY names result columns, so the arms select the order's columns.
    """
    keys = total_order(query.order_by)
    if query.after is not None:
        ranges = keyset_ranges(keys, query.after)
    elif start is not None:
        ranges = keyset_ranges(keys, start, inclusive=True)
    else:
        ranges = ()
    unkeyed = msgspec.structs.replace(query, after=None)
    order_by = build_order_by(query.order_by)
    if len(ranges) <= 1:
        where = build_where(
            unkeyed, scope, walk_order=walk_order, keyset=ranges[0] if ranges else None
        )
        return SqlFragment(
            f"SELECT body, change_seq FROM applicants {where.sql} {order_by} LIMIT ? OFFSET ?",
            (*where.params, limit, skip),
        )
    first, then = ranges
    first_where = build_where(unkeyed, scope, walk_order=walk_order, keyset=first)
    then_where = build_where(unkeyed, scope, walk_order=walk_order, keyset=then)
    # change_seq is selected already (and is never null: it never leads two ranges).
    columns = ", ".join(c for c in order_columns(query.order_by) if c != "change_seq")
    select = f"SELECT body, change_seq, {columns} FROM applicants"
    # The merge starts by reading each arm's first row; where the index is not (key, id)
    # (last_name's) that means sorting a whole null block or group of ties, even for a
    # page that never reaches it. The second range comes wholly after the first, so it
    # is limited to the rows the page still wants after the first range's: none while
    # the first fills the page. SQLite evaluates a LIMIT once, before the walk (a WHERE
    # condition on a subquery it would test on every row of the range instead).
    # Bound values are 64-bit: near the largest offset, skip + limit would not fit (and
    # no table holds that many rows, so the cap changes nothing).
    wanted = min(skip + limit, MAX_OFFSET)
    still_wanted = (
        f"max(0, ? - (SELECT count(*) FROM (SELECT 1 FROM applicants {first_where.sql} LIMIT ?)))"
    )
    return SqlFragment(
        f"{select} {first_where.sql} UNION ALL SELECT * FROM "
        f"({select} {then_where.sql} {order_by} LIMIT {still_wanted}) "
        f"{order_by} LIMIT ? OFFSET ?",
        (
            *first_where.params,
            *then_where.params,
            wanted,
            *first_where.params,
            wanted,
            limit,
            skip,
        ),
    )


def parse_wait(text: str | None, *, sync: bool) -> int:
    """Seconds to hold an empty sync page (`wait`); 0 when not asked for."""
    if text is None or text == "":
        return 0
    seconds = _integer("wait", text, 0, MAX_WAIT_SECONDS)
    if seconds and not sync:
        raise InvalidParameter(
            "wait", text, "wait applies only to the sync feed: give changed_since (or its cursor)"
        )
    return seconds
