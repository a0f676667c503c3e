"""The statements of a list page, built from its `planner.ReadPlan` alone.

A list page may run four statements, all here: the sizes a choice may weigh
(`sizes`), the checkpoints of a deep page (`anchors`), the page (`page`) and its count
(`count`, or `page_and_count` when writes keep landing between the two). The choices
are `planner.py`'s; `storage.py` runs the statements and keeps the caches. Why each
statement is written as it is: docs/list-planning.md.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from leasestar.applicants.cursors import KeyValue
from leasestar.applicants.fields import column_object, from_columns
from leasestar.applicants.filters import FILTERS_BY_NAME, FilterValue
from leasestar.applicants.ordering import (
    SqlFragment,
    build_order_by,
    keyset_ranges,
    order_columns,
    total_order,
)
from leasestar.applicants.planner import (
    CHECKPOINT_EVERY,
    How,
    Read,
    ReadPlan,
    Scope,
)
from leasestar.applicants.query import MAX_OFFSET, ApplicantQuery
from leasestar.applicants.resource import APPLICANTS

Anchors = tuple[tuple[KeyValue, ...], ...]
# A checkpoint's key values (None: none), and the rows to skip after it.
Start = tuple[tuple[KeyValue, ...] | None, int]

TABLE: Final = APPLICANTS.table
# Every statement reads the data version with its answer, from the same snapshot.
VERSION: Final = "(SELECT change_seq FROM sync_state)"
DATA_VERSION: Final = SqlFragment(f"SELECT {VERSION}")
CURSOR_KEY: Final = SqlFragment("SELECT cursor_key FROM sync_state")


@lru_cache(maxsize=1024)
def scope_version(scope: frozenset[str]) -> SqlFragment:
    """The version of a token scope's data: the change sequence of the last write to one
    of its integrations' applicants (0 before any), one primary-key lookup each."""
    marks = ", ".join("?" * len(scope))
    return SqlFragment(
        f"SELECT coalesce(max(change_seq), 0) FROM {APPLICANTS.scope_versions} "
        f"WHERE {APPLICANTS.scope_column} IN ({marks})",
        tuple(sorted(scope)),
    )


EVERYTHING: Final = SqlFragment("")  # the WHERE of every applicant


def count(where: SqlFragment) -> SqlFragment:
    """(data version, the number of rows `where` matches)."""
    return SqlFragment(
        f"SELECT {VERSION}, (SELECT count(*) FROM {TABLE} {where.sql})", where.params
    )


def record(applicant_id: str, query: ApplicantQuery, scope: Scope) -> SqlFragment:
    """(data version, the record's stored body or NULL) for `GET /v1/applicants/{id}`."""
    where = build_where(query, scope)
    condition = f"{where.sql} AND id = ?" if where.sql else "WHERE id = ?"
    return SqlFragment(
        f"SELECT {VERSION}, (SELECT {_stored_record(query)} FROM {TABLE} {condition})",
        (*where.params, applicant_id),
    )


def stream(query: ApplicantQuery, scope: Scope) -> SqlFragment:
    """(stored body, change_seq) of every match in the total order: a streamed list
    (`stream.py`)."""
    where = build_where(query, scope)
    return SqlFragment(
        f"SELECT {_stored_record(query)}, change_seq FROM {TABLE} {where.sql} "
        f"{build_order_by(query.order_by)}",
        where.params,
    )


def _stored_record(query: ApplicantQuery) -> str:
    """A row's record as Python reads it: its stored body (`bodies.py`), or, narrowed to
    fields its columns hold, the served JSON of those (`fields.py`), which the body
    decoder hands on as it is (it starts with `{`, as the JSON of a database from
    before does). CAST AS BLOB: the bytes, not text."""
    if from_columns(query.fields):
        return f"CAST({column_object(query.fields)} AS BLOB)"
    return "CAST(body AS BLOB)"


def matches(query: ApplicantQuery, scope: Scope) -> SqlFragment:
    """The WHERE of the query's matches: its filters, its sync position, the scope (the
    counts' and checkpoints' key). Cached by those alone: every page of a query shares it."""
    return _matches(query.filters, query.changed_since, scope)


@lru_cache(maxsize=4096)
def _matches(
    filters: tuple[tuple[str, FilterValue], ...], changed_since: int | None, scope: Scope
) -> SqlFragment:
    return build_where(ApplicantQuery(filters=filters, changed_since=changed_since), scope)


@lru_cache(maxsize=4096)  # pure; the same few query shapes recur on every request
def build_where(
    query: ApplicantQuery,
    scope: Scope,
    *,
    walk_order: bool = False,
    keyset: SqlFragment | None = None,
    collect_by: str | None = None,
) -> SqlFragment:
    """WHERE clause (possibly empty): the filters, the sync position, `keyset`, the scope.

    Args:
        query: the validated query; its cursor position (`after`) is not read here.
        scope: the token's integrations, None for all.
        walk_order: write broad filters `+column`, so SQLite walks the ordering's index
            rather than answer them with their own (`planner.Read.WALK`).
        keyset: one more clause, a range of the page's keyset (`keyset_ranges`).
        collect_by: the column whose index collects the matches: the other broad
            filters, the scope and the sync position are written `+column`.
    """
    clauses: list[str] = []
    params: list[object] = []
    # A filter on the ordering's own lead column is a range of the walked index: never
    # hinted, so SQLite seeks to it rather than walk from the index's end.
    lead = total_order(query.order_by)[0].field if walk_order else None

    def hinted(column: str) -> bool:
        if walk_order:
            return column != lead
        return collect_by is not None and column != collect_by

    for name, value in query.filters:
        spec = FILTERS_BY_NAME[name]
        sql, values = spec.where(
            f"+{spec.column}" if spec.broad and hinted(spec.column) else spec.column, value
        )
        clauses.append(sql)
        params.extend(values)
    if query.changed_since is not None:
        sequence = (
            "+change_seq" if collect_by is not None and hinted("change_seq") else "change_seq"
        )
        clauses.append(f"{sequence} > ?")
        params.append(query.changed_since)
    if keyset is not None:
        clauses.append(keyset.sql)
        params.extend(keyset.params)
    if scope is not None:
        ordered = sorted(scope)
        column = APPLICANTS.scope_column
        hint = "+" if hinted(column) else ""
        clauses.append(f"{hint}{column} IN ({', '.join('?' * len(ordered))})")
        params.extend(ordered)
    if not clauses:
        return SqlFragment("")
    return SqlFragment("WHERE " + " AND ".join(clauses), tuple(params))


def sizes(query: ApplicantQuery, scope: Scope) -> SqlFragment:
    """(data version, matches, every applicant): what a choice without the columnar
    copy weighs (`planner.Sizes`)."""
    where = matches(query, scope)
    return SqlFragment(
        f"SELECT {VERSION}, (SELECT count(*) FROM {TABLE} {where.sql}), "
        f"(SELECT count(*) FROM {TABLE})",
        where.params,
    )


def checkpoint_key(read_plan: ReadPlan) -> tuple[object, ...]:
    """The checkpoints' cache key: the matches and the order."""
    where = matches(read_plan.query, read_plan.scope)
    return (where.sql, where.params, read_plan.query.order_by)


def anchors(read_plan: ReadPlan) -> SqlFragment:
    """(data version, key values) of matches number 0, K, 2K, ... in the order: one pass."""
    query = read_plan.query
    walk_order = read_plan.how.read is Read.WALK
    where = build_where(query, read_plan.scope, walk_order=walk_order)
    columns = ", ".join(order_columns(query.order_by))
    return SqlFragment(
        f"SELECT {VERSION}, {columns} FROM ("
        f"SELECT {columns}, row_number() OVER ({build_order_by(query.order_by)}) "
        f"AS position FROM {TABLE} {where.sql}) "
        f"WHERE (position - 1) % {CHECKPOINT_EVERY} = 0",
        where.params,
    )


def start(read_plan: ReadPlan, anchors: Anchors) -> Start:
    """The checkpoint to start the page from (None: none), and the rows to skip after it."""
    query = read_plan.query
    if not anchors:
        return None, 0 if query.after is not None else query.offset
    index = min(query.offset // CHECKPOINT_EVERY, len(anchors) - 1)
    return anchors[index], query.offset - index * CHECKPOINT_EVERY


def page(read_plan: ReadPlan, at: Start | None = None) -> SqlFragment:
    """(data version, rows, their stored bodies concatenated, their lengths, their
    change sequences), the page starting at a checkpoint `at`, else as the query says."""
    return _page(read_plan.query, read_plan.scope, read_plan.how, at)


def page_and_count(read_plan: ReadPlan, at: Start | None = None) -> SqlFragment:
    """`page` with the number of matches after the version, in one snapshot (read as
    if the copy had not placed the page: its version is not this snapshot's)."""
    query, scope = read_plan.query, read_plan.scope
    where = matches(query, scope)
    select = _select(query, scope, read_plan.how.unsought, at)
    return SqlFragment(
        f"SELECT {VERSION}, (SELECT count(*) FROM {TABLE} {where.sql}), "
        f"{_page_columns(query)} FROM ({select.sql})",
        (*where.params, *select.params),
    )


@lru_cache(maxsize=4096)  # pure; a page asked again (the hot path) builds nothing
def _page(query: ApplicantQuery, scope: Scope, how: How, at: Start | None) -> SqlFragment:
    select = _select(query, scope, how, at)
    return SqlFragment(
        f"SELECT {VERSION}, {_page_columns(query)} FROM ({select.sql})", select.params
    )


def _page_columns(query: ApplicantQuery) -> str:
    """The stored bodies concatenated and their byte lengths: Python splits them and
    decompresses each (`bodies.BodyDecoder.decode_joined`). CAST AS BLOB hands Python
    the bytes as stored (JSON of a database from before is text). Only the sync feed
    needs the records' change sequence numbers (its position and its cursor are the
    last one)."""
    sync = query.changed_since is not None
    sequences = "coalesce(group_concat(change_seq), '')" if sync else "''"
    if from_columns(query.fields):
        return _narrowed_page_columns(query, sequences)
    return (
        "count(*), CAST(coalesce(group_concat(body, ''), '') AS BLOB), "
        f"coalesce(group_concat(length(CAST(body AS BLOB))), ''), {sequences}"
    )


def _narrowed_page_columns(query: ApplicantQuery, sequences: str) -> str:
    """`_page_columns` of records narrowed to columns (`fields.from_columns`): the
    records written from the columns, joined with commas (no body decoded), and each
    row's total-order key values, a JSON array a line (a raw newline is never inside
    JSON text): the next cursor's, from the page's last row (`storage.py`)."""
    assert query.fields is not None
    keys = ", ".join(order_columns(query.order_by))
    return (
        f"count(*), CAST(coalesce(group_concat({column_object(query.fields)}, ','), '') "
        f"AS BLOB), '', {sequences}, "
        f"coalesce(group_concat(json_array({keys}), char(10)), '')"
    )


def _row_columns(query: ApplicantQuery) -> str:
    """What a page's select reads of each row: its stored body and change sequence; for
    records narrowed to columns, those columns, the change sequence and the order's."""
    if not from_columns(query.fields):
        return "body, change_seq"
    assert query.fields is not None
    return ", ".join(dict.fromkeys((*query.fields, "change_seq", *order_columns(query.order_by))))


def _select(query: ApplicantQuery, scope: Scope, how: How, at: Start | None) -> SqlFragment:
    """The rows (body, change_seq) of a page in the total order, found as `how` says.

    A cursor page reads one record more (to know whether another follows it), after
    the cursor's key values; a deep page at or after a checkpoint's; a first page from
    the first match.
    """
    limit = query.limit + (1 if query.after is not None else 0)
    if at is not None:
        checkpoint, skip = at
    else:
        checkpoint, skip = None, 0 if query.after is not None else query.offset
    # Only what build_where reads: its cache then serves every page of the query.
    unkeyed = ApplicantQuery(
        order_by=query.order_by, filters=query.filters, changed_since=query.changed_since
    )
    if how.read is Read.ROWIDS:
        # Nothing else to find them by: every filter tested on the rows read (written
        # `+column`), the order's index not walked.
        rowids = SqlFragment("rowid IN (SELECT value FROM json_each(?))", (how.rowids,))
        where = build_where(unkeyed, scope, keyset=rowids, collect_by="rowid")
        order_by = build_order_by(query.order_by, sort=True)
        return _one_range(where, order_by, limit, skip, _row_columns(query))
    if how.read is Read.SEEK:
        sought, pinned = _sought(query, how)
        where = build_where(unkeyed, scope, walk_order=True, keyset=sought)
        order_by = build_order_by(query.order_by, skip=pinned)
        return _one_range(where, order_by, limit, skip, _row_columns(query))
    keys = total_order(query.order_by)
    ranges: tuple[SqlFragment, ...] = ()
    if query.after is not None:
        ranges = keyset_ranges(keys, query.after)
    elif checkpoint is not None:
        ranges = keyset_ranges(keys, checkpoint, inclusive=True)
    walk_order = how.read is Read.WALK
    # Collecting sorts the matches its index finds: `+column` in the ORDER BY, which no
    # index provides. SQLite knows nothing of how many rows a range keeps (no ANALYZE),
    # so left to itself it walks the ordering's index past every non-match.
    collect = how.read is Read.COLLECT
    order_by = build_order_by(query.order_by, sort=collect)
    if len(ranges) <= 1:
        where = build_where(
            unkeyed,
            scope,
            walk_order=walk_order,
            keyset=ranges[0] if ranges else None,
            collect_by=how.collect_by if collect else None,
        )
        return _one_range(where, order_by, limit, skip, _row_columns(query))
    first, then = (build_where(unkeyed, scope, walk_order=walk_order, keyset=r) for r in ranges)
    return _two_ranges(query, first, then, order_by, limit, skip)


def _one_range(
    where: SqlFragment, order_by: str, limit: int, skip: int, columns: str
) -> SqlFragment:
    return SqlFragment(
        f"SELECT {columns} FROM {TABLE} {where.sql} {order_by} LIMIT ? OFFSET ?",
        (*where.params, limit, skip),
    )


def _two_ranges(
    query: ApplicantQuery,
    first: SqlFragment,
    then: SqlFragment,
    order_by: str,
    limit: int,
    skip: int,
) -> SqlFragment:
    """The keyset's two ranges as the arms of a UNION ALL: docs/list-planning.md,
    "The page statement"."""
    # change_seq is selected already (and is never null: it never leads two ranges).
    read = _row_columns(query)
    selected = read.split(", ")
    columns = ", ".join(c for c in order_columns(query.order_by) if c not in selected)
    select = f"SELECT {', '.join(filter(None, (read, columns)))} FROM {TABLE}"
    # The second arm wants only what the first leaves of the page (docs/list-planning.md).
    # Bound values are 64-bit: near the largest offset, skip + limit would not fit.
    wanted = min(skip + limit, MAX_OFFSET)
    still_wanted = f"max(0, ? - (SELECT count(*) FROM (SELECT 1 FROM {TABLE} {first.sql} LIMIT ?)))"
    # A compound SELECT's ORDER BY names result columns: never `+column`.
    first_arm = SqlFragment(f"{select} {first.sql}", first.params)
    then_arm = SqlFragment(
        f"({select} {then.sql} {order_by} LIMIT {still_wanted})",
        (*then.params, wanted, *first.params, wanted),
    )
    return SqlFragment(
        f"{first_arm.sql} UNION ALL SELECT * FROM {then_arm.sql} "
        f"{build_order_by(query.order_by)} LIMIT ? OFFSET ?",
        (*first_arm.params, *then_arm.params, limit, skip),
    )


def _sought(query: ApplicantQuery, how: How) -> tuple[SqlFragment, int]:
    """The condition that the order's leading keys lie within the seek's ranges, and how
    many leading keys it pins to one value (left out of the ORDER BY)."""
    seek = how.ranges
    leading = order_columns(query.order_by)[: len(seek)]
    if [column for column, _, _ in seek] != leading:
        raise ValueError(f"seek ranges {seek} are not of the order's leading keys")
    # Of several ranges the last is the narrowest (a group of ties of the keys before
    # it): the others are tested, unless one index leads with the first two keys.
    hinted = leading
    if how.seeks_last_only:
        hinted = [f"+{column}" for column in leading[:-1]] + leading[-1:]
    # Keys each range holds to one value are the same on every row the page reads:
    # ordered by the keys after them, the last range's own index gives the order
    # (`zip IS NULL ORDER BY id` walks (zip, id)) instead of a sort of the range.
    # (A key that is unique, as the sync feed's change_seq, ends the total order: it
    # stays, or there would be no ORDER BY at all.)
    pinned = 0
    keys = total_order(query.order_by)
    while pinned < min(len(seek), len(keys) - 1) and seek[pinned][1] == seek[pinned][2]:
        pinned += 1
    clauses: list[str] = []
    values: list[KeyValue] = []
    for column, (_, low, high) in zip(hinted, seek, strict=True):
        if low is not None and low == high:
            # An equality, not a range of one value: SQLite then knows the column's
            # index, (column, id), gives the rest of the order (a BETWEEN left it to
            # walk the id's index past every other value).
            clauses.append(f"{column} = ?")
            values.append(low)
        elif low is not None:
            clauses.append(f"{column} BETWEEN ? AND ?")
            values += [low, high]
        elif high is not None:  # NULL sorts first: the range starts with the NULLs
            clauses.append(f"({column} IS NULL OR {column} <= ?)")
            values.append(high)
        else:
            clauses.append(f"{column} IS NULL")
    return SqlFragment(" AND ".join(clauses), tuple(values)), pinned
