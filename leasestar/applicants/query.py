"""From query string to a validated `ApplicantQuery`: the parameters, their rules, cursors.

`PARAMETERS` is the one source of both the parser's rules and the OpenAPI description,
so the document cannot drift from the behaviour; its filters are the rows of
`filters.FILTERS`. Nothing here knows SQL: `planner.py` chooses how a query is read,
`plan.py` writes its statements.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import msgspec

from leasestar.applicants.cursors import CursorCodec, CursorState, KeyValue
from leasestar.applicants.fields import FIELDS, Fields, is_selection, parse_fields
from leasestar.applicants.filters import (
    FILTERS,
    FILTERS_BY_NAME,
    SYNC_FILTERS,
    FilterValue,
    QueryParameterSpec,
)
from leasestar.applicants.ordering import CHANGE_ORDER, SORTABLE_FIELDS, total_order
from leasestar.applicants.records import SortKey
from leasestar.errors import InvalidParameter

MAX_LIMIT: Final = 250
DEFAULT_LIMIT: Final = 100
MAX_OFFSET: Final = 2**63 - 1
# `changed_since=latest`: start the feed at the current sequence (Microsoft Graph's
# `$deltatoken=latest`). Held as LATEST until the handler reads the sequence.
LATEST_TEXT: Final = "latest"
LATEST: Final = -1
MAX_ORDER_KEYS: Final = 4
MAX_WAIT_SECONDS: Final = 60
DEFAULT_ORDER: Final = (SortKey("created_at", "desc"),)

_INTEGER = re.compile(r"[0-9]+")
_ORDER_KEY = re.compile(r"(?P<field>[A-Za-z0-9_]+)(?::(?P<direction>[A-Za-z]+))?")


class ApplicantQuery(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A validated query: everything the planner needs, nothing HTTP."""

    offset: int = 0
    limit: int = DEFAULT_LIMIT
    order_by: tuple[SortKey, ...] = DEFAULT_ORDER
    # (name, value) of each filter given, in `FILTERS` order; instants in UTC microseconds.
    filters: tuple[tuple[str, FilterValue], ...] = ()
    # Sync feed: only records whose change sequence is above this.
    changed_since: int | None = None
    # Keyset: the total-order key values of the last record served (from a cursor).
    after: tuple[KeyValue, ...] | None = None
    # `fields=`: the records narrowed to these, in the record's order; None: whole.
    fields: Fields | None = None

    def value(self, name: str) -> FilterValue | None:
        """The value of filter `name`, None when it is not given."""
        for given, value in self.filters:
            if given == name:
                return value
        return None


_SORTABLE_LIST = ", ".join(SORTABLE_FIELDS)
# The grammar of order-by for OpenAPI (empty, or 1-4 keys); "no field twice" is in words.
_ORDER_BY_KEY = f"({'|'.join(SORTABLE_FIELDS)})(:([Aa][Ss][Cc]|[Dd][Ee][Ss][Cc]))?"
_ORDER_BY_PATTERN = f"^({_ORDER_BY_KEY}(,{_ORDER_BY_KEY}){{0,{MAX_ORDER_KEYS - 1}}})?$"
# The grammar of fields (one or more names); "no field twice" is in words.
_FIELD_NAME = f"({'|'.join(FIELDS)})"
_FIELDS_PATTERN = f"^{_FIELD_NAME}(,{_FIELD_NAME})*$"
# No parameter declares a `default` in the document, though offset, limit and order-by have
# one (in their descriptions): generated clients send every declared default, and a cursor
# or the sync feed refuses those beside it (tests/test_openapi.py holds this).
PARAMETERS: Final[tuple[QueryParameterSpec, ...]] = (
    QueryParameterSpec(
        name="offset",
        description="Number of records skipped; absent: 0. Past the end: empty results, "
        "hasMore false.",
        schema={"type": "integer", "format": "int64", "minimum": 0, "maximum": MAX_OFFSET},
    ),
    QueryParameterSpec(
        name="limit",
        description=f"Maximum number of records returned, 1 to {MAX_LIMIT}; absent: "
        f"{DEFAULT_LIMIT}.",
        schema={"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
    ),
    QueryParameterSpec(
        name="order-by",
        description="Comma-separated `field[:asc|desc]` keys, at most 4, no field twice; "
        "direction case-insensitive, asc when omitted. Absent: `created_at:desc`. Present but "
        "empty: no sorting requested (records in id order, `orderBy: []`). Strings compare by "
        "code point; nulls sort first ascending, last descending; a hidden final `id` key in "
        "the direction of the last key makes every order total. Sortable fields: "
        f"{_SORTABLE_LIST}.",
        schema={"type": "string", "pattern": _ORDER_BY_PATTERN},
        example="last_name:asc,first_name:asc",
    ),
    QueryParameterSpec(
        name="fields",
        description="Comma-separated top-level fields of the record: each record then "
        "holds exactly those fields, in the record's order, each written as in the whole "
        "record (`meta` is unchanged). An unknown or repeated name is a 400 naming it. "
        "Absent: every field. A cursor (`meta.next`) keeps the selection, so a walk by "
        "cursor is narrowed throughout; `fields` given with a cursor must match it. The "
        "response schema stays `Applicant`: a narrowed record lacks the fields not "
        f"selected. Fields: {', '.join(FIELDS)}.",
        schema={"type": "string", "pattern": _FIELDS_PATTERN},
        example="id,first_name,last_name,email_1",
    ),
    *(spec for spec in FILTERS if not spec.list_only),
    *(spec for spec in FILTERS if spec.list_only),
    QueryParameterSpec(
        name="cursor",
        description="The `meta.next` of a previous page: the page after it, with the same "
        "ordering, filters and limit. Other parameters given with a cursor must match it or "
        "be absent; `offset` cannot be given. Unlike offsets, a cursor walk never skips or "
        "repeats a record that exists throughout the walk, even while data is written.",
        schema={"type": "string"},
        list_only=True,
    ),
    QueryParameterSpec(
        name="changed_since",
        description="Incremental sync: only records written after this change sequence, in "
        "change order (`order-by` and `offset` cannot be given; of the filters only "
        "`integration_id`, `x_property_id` and `x_id`, which a record never changes). Start "
        "at 0, follow `meta.next` while `hasMore`, then store `meta.changeSeq` and pass it "
        "here next time. `latest` starts from now, without reading the history: an empty "
        "page whose `meta.changeSeq` is the current sequence (a new webhook subscriber's "
        "starting point).",
        schema={
            "anyOf": [
                {"type": "integer", "format": "int64", "minimum": 0, "maximum": MAX_OFFSET},
                {"type": "string", "enum": [LATEST_TEXT]},
            ]
        },
        list_only=True,
    ),
    QueryParameterSpec(
        name="wait",
        description="Long poll of the sync feed, with `changed_since` (or its cursor): when "
        f"no record is newer, hold the request up to this many seconds (0 to {MAX_WAIT_SECONDS}) "
        "until a write lands, then answer with the new records; when none lands, an empty page "
        "whose `meta.changeSeq` is the one asked for.",
        schema={"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS},
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


def _filters(values: dict[str, str]) -> tuple[tuple[str, FilterValue], ...]:
    """Each filter given, parsed by its row of `FILTERS`, in table order."""
    parsed: list[tuple[str, FilterValue]] = []
    for spec in FILTERS:
        text = values.get(spec.name)
        if text is None:
            continue
        parsed.append((spec.name, spec.parse(text)))
        if any(required not in values for required in spec.requires):
            raise InvalidParameter(
                spec.name, text, f"{spec.name} requires {' and '.join(spec.requires)}"
            )
    return tuple(parsed)


def _parse(values: dict[str, str]) -> ApplicantQuery:
    fields: dict[str, Any] = {}
    if "offset" in values:
        fields["offset"] = _integer("offset", values["offset"], 0, MAX_OFFSET)
    if "limit" in values:
        fields["limit"] = _integer("limit", values["limit"], 1, MAX_LIMIT)
    if "order-by" in values:
        fields["order_by"] = parse_order_by(values["order-by"])
    if "fields" in values:
        fields["fields"] = parse_fields(values["fields"])
    return ApplicantQuery(filters=_filters(values), **fields)


# Filters a sync refuses, the list route's own named before the shared date bounds.
_NOT_WITH_SYNC: Final = tuple(
    spec.name for spec in sorted(FILTERS, key=lambda spec: not spec.list_only) if not spec.sync_safe
)


def _with_changed_since(values: dict[str, str], query: ApplicantQuery) -> ApplicantQuery:
    text = values["changed_since"]
    # `latest` stays symbolic here (parsed queries are cached): the handler puts the
    # current sequence in its place (`resolve_latest`).
    since = LATEST if text == LATEST_TEXT else _integer("changed_since", text, 0, MAX_OFFSET)
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
    return CursorState(
        version=1,
        limit=query.limit,
        order_by=query.order_by,
        filters=query.filters,
        changed_since=query.changed_since,
        position=position,
        after=after,
        fields=query.fields,
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
        not filters.keys() <= FILTERS_BY_NAME.keys()
        or len(state.after) != len(total_order(state.order_by))
        or not ordering_known
        or not 1 <= state.limit <= MAX_LIMIT
        or not 0 <= state.position <= MAX_OFFSET
        or (state.fields is not None and not is_selection(state.fields))
    ):
        raise InvalidParameter("cursor", text, "cursor is not valid")
    return ApplicantQuery(
        offset=state.position,
        limit=state.limit,
        order_by=state.order_by,
        filters=tuple((spec.name, filters[spec.name]) for spec in FILTERS if spec.name in filters),
        changed_since=state.changed_since,
        after=state.after,
        fields=state.fields,
    )


def _parameter_value(query: ApplicantQuery, name: str) -> object:
    """What `query` holds for query parameter `name`, to compare with a cursor's."""
    if name in FILTERS_BY_NAME:
        return query.value(name)
    return getattr(query, name.replace("-", "_"))


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
        if _parameter_value(given, name) != _parameter_value(resumed, name):
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


async def resolve_latest(
    query: ApplicantQuery, current: Callable[[], Awaitable[int]]
) -> ApplicantQuery:
    """`query` with `changed_since=latest` replaced by the sequence `current` reads."""
    if query.changed_since != LATEST:
        return query
    return msgspec.structs.replace(query, changed_since=await current())
