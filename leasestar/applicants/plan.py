"""From a validated query to the statements a request runs: the plan of a list page.

A list page may run four statements, all here: the sizes that choose how to walk
(`ListPlan.sizes`), the checkpoints of a deep page (`ListPlan.anchors`), the
page (`ListPlan.page`) and its count (`ListPlan.count`, or `ListPlan.page_and_count`
when writes keep landing between the two). `storage.py` runs them and keeps the caches.
How the choices are made and why: docs/list-planning.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

import msgspec

from leasestar.applicants.cursors import KeyValue
from leasestar.applicants.filters import FILTERS_BY_NAME
from leasestar.applicants.ordering import (
    SqlFragment,
    build_order_by,
    keyset_ranges,
    order_columns,
    total_order,
)
from leasestar.applicants.query import MAX_OFFSET, ApplicantQuery

Scope = frozenset[str] | None
Anchors = tuple[tuple[KeyValue, ...], ...]
SeekRanges = tuple[tuple[str, KeyValue, KeyValue], ...]  # (column, low, high) of leading keys

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
        "SELECT coalesce(max(change_seq), 0) FROM integration_versions "
        f"WHERE integration_id IN ({marks})",
        tuple(sorted(scope)),
    )


EVERYTHING: Final = SqlFragment("")  # the WHERE of every applicant
# Deep offsets seek to the nearest checkpoint (every CHECKPOINT_EVERY-th match of a
# query's filters in its order) instead of stepping over every skipped row.
CHECKPOINT_EVERY: Final = 1000
DEEP_OFFSET: Final = 10 * CHECKPOINT_EVERY
# (filter column, leading order key) pairs that one composite index in schema.sql serves
# together: a page with such a filter and order needs no plan hint.
FILTER_ORDER_INDEXES: Final = frozenset(
    {("property_id", "created_at"), ("integration_id", "created_at")}
)
# Orders of several keys one index of schema.sql serves, walked in either direction when
# every key goes the same way (the id last).
ORDER_INDEXES: Final = FILTER_ORDER_INDEXES | {("last_name", "first_name")}
# Lead order key -> the columns its index in schema.sql carries besides it: a walk of that
# index tests filters on them without reading the row (the default order's carries the
# two filterable instants).
WALK_INDEX_CARRIES: Final = {"created_at": frozenset({"updated_at", "last_seen"})}
# What each plan costs per row, relative to collecting one match (a filter's index entry,
# its row read for the sort keys and body, and its share of the sort; ~3-4 us). Measured
# on 100,000 seeded applicants, default order or last_name, an updated_at bound of
# 0.2-30 % of the rows: walking an index and reading each row to test the filters ~0.8 us a
# row; walking an index that carries the filtered columns ~0.14 us.
WALK_READING_ROWS_COST: Final = 0.25
WALK_INDEX_ONLY_COST: Final = 0.04
# Reading a match by its rowid (`rowid IN (json_each)`) and its share of the sort:
# ~1-1.5 us at 100,000 rows, no index entry to read first.
ROWID_READ_COST: Final = 0.4


def count(where: SqlFragment) -> SqlFragment:
    """(data version, the number of rows `where` matches)."""
    return SqlFragment(
        f"SELECT {VERSION}, (SELECT count(*) FROM applicants {where.sql})", where.params
    )


def record(applicant_id: str, query: ApplicantQuery, scope: Scope) -> SqlFragment:
    """(data version, the record's stored body or NULL) for `GET /v1/applicants/{id}`."""
    where = build_where(query, scope)
    condition = f"{where.sql} AND id = ?" if where.sql else "WHERE id = ?"
    return SqlFragment(
        f"SELECT {VERSION}, (SELECT CAST(body AS BLOB) FROM applicants {condition})",
        (*where.params, applicant_id),
    )


def stream(query: ApplicantQuery, scope: Scope) -> SqlFragment:
    """(stored body, change_seq) of every match in the total order: a streamed list
    (`stream.py`)."""
    where = build_where(query, scope)
    return SqlFragment(
        f"SELECT CAST(body AS BLOB), change_seq FROM applicants {where.sql} "
        f"{build_order_by(query.order_by)}",
        where.params,
    )


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
            rather than answer them with their own (`walks_order_index`).
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
        hint = "+" if hinted("integration_id") else ""
        clauses.append(f"{hint}integration_id IN ({', '.join('?' * len(ordered))})")
        params.extend(ordered)
    if not clauses:
        return SqlFragment("")
    return SqlFragment("WHERE " + " AND ".join(clauses), tuple(params))


def walks_order_index(query: ApplicantQuery, scope: Scope) -> bool | None:
    """Whether the page walks the ordering's index past the filters (True) or lets SQLite
    collect the matches through a filter's index and sort them (False); None when that
    depends on how many rows match (`ListPlan.walks`)."""
    specs = [FILTERS_BY_NAME[name] for name, _ in query.filters]
    if not specs and scope is None:
        return False
    if not all(spec.broad for spec in specs):
        return False  # a selective filter's own index always wins
    columns = [spec.column for spec in specs]
    if scope is not None and len(scope) == 1 and query.value("integration_id") is None:
        columns.append("integration_id")
    lead = total_order(query.order_by)[0].field
    if len(columns) == 1 and (columns[0], lead) in FILTER_ORDER_INDEXES:
        return False  # one composite index serves both the filter and the order
    if scope is None and all(column == lead for column in columns):
        return False  # every filter is a range of the ordering's own index
    return None


def walk_row_cost(query: ApplicantQuery, scope: Scope) -> float:
    """The cost of a walk per row it steps over (`WALK_INDEX_CARRIES`)."""
    lead = total_order(query.order_by)[0].field
    carried = WALK_INDEX_CARRIES.get(lead, frozenset()) | {lead}
    tested = {FILTERS_BY_NAME[name].column for name, _ in query.filters}
    if scope is None and query.changed_since is None and tested <= carried:
        return WALK_INDEX_ONLY_COST
    return WALK_READING_ROWS_COST


def _skip(query: ApplicantQuery) -> int:
    """Rows to skip in SQL: a cursor page seeks by key, so it skips none."""
    return 0 if query.after is not None else query.offset


@lru_cache(maxsize=4096)  # pure; the same few query shapes recur on every request
def build_page_select(
    query: ApplicantQuery,
    scope: Scope,
    *,
    limit: int,
    skip: int,
    walk_order: bool = False,
    start: tuple[KeyValue, ...] | None = None,
    seek: SeekRanges = (),
    sort_matches: bool = False,
    collect_by: str | None = None,
    rowids: str | None = None,
) -> SqlFragment:
    """The rows (body, change_seq) of a page in the total order.

    Args:
        query: the validated query; the page starts after its cursor position, if any.
        scope: the token's integrations, None for all.
        limit: rows to read; skip: rows to skip first.
        walk_order: hint the filters so the ordering's index is walked (`build_where`).
        sort_matches: the opposite: collect the matches through a filter's index and
            sort them. SQLite knows nothing of how many rows a range keeps (no ANALYZE),
            so left to itself it walked the ordering's index past every non-match: 16 s
            at 1,000,000 rows for a date bound that 52 rows meet, 17 ms sorted.
        collect_by: with `sort_matches`, the column whose index collects (`build_where`).
        rowids: a JSON array of the rowids of every match the page may hold (every match
            within the seek's ranges: `MatchCounter.seek`), read by rowid and sorted.
        start: a checkpoint's key values: the page starts at or after them.
        seek: for the order's leading keys, the (column, low, high) values that every
            match the page wants lies within (`MatchCounter.seek`): ranges to seek to.

    Two keyset ranges become a UNION ALL: docs/list-planning.md, "The page statement".
    """
    keys = total_order(query.order_by)
    ranges: tuple[SqlFragment, ...]
    pinned = 0
    if rowids is not None:
        # Nothing else to find them by: every filter tested on the rows read, the order's
        # index not walked.
        ranges = (SqlFragment("rowid IN (SELECT value FROM json_each(?))", (rowids,)),)
        sort_matches, collect_by = True, "rowid"
    elif query.after is not None:
        ranges = keyset_ranges(keys, query.after)
    elif start is not None:
        ranges = keyset_ranges(keys, start, inclusive=True)
    elif seek:
        leading = order_columns(query.order_by)[: len(seek)]
        if [column for column, _, _ in seek] != leading:
            raise ValueError(f"seek ranges {seek} are not of the order's leading keys")
        # Of several ranges the last is the narrowest (a group of ties of the keys before
        # it): unless one index leads with the first two keys, only the last range's
        # column is left for SQLite to seek; the others are tested.
        hinted = leading
        if len(leading) > 1 and tuple(leading[:2]) not in ORDER_INDEXES:
            hinted = [f"+{column}" for column in leading[:-1]] + leading[-1:]
        # Keys each range holds to one value are the same on every row the page reads:
        # ordered by the keys after them, the last range's own index gives the order
        # (`zip IS NULL ORDER BY id` walks (zip, id)) instead of a sort of the range.
        pinned = 0
        # (A key that is unique, as the sync feed's change_seq, ends the total order: it
        # stays, or there would be no ORDER BY at all.)
        while pinned < min(len(seek), len(keys) - 1) and seek[pinned][1] == seek[pinned][2]:
            pinned += 1
        clauses: list[str] = []
        values: list[KeyValue] = []
        for column, (_, low, high) in zip(hinted, seek, strict=True):
            if low is not None and low == high:
                # An equality, not a range of one value: SQLite then knows the column's
                # index, (column, id), gives the rest of the order (a BETWEEN left it to
                # walk the id's index past every other value: 300-500 ms at 1,000,000).
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
        ranges = (SqlFragment(" AND ".join(clauses), tuple(values)),)
    else:
        ranges = ()
    unkeyed = msgspec.structs.replace(query, after=None)
    order_by = build_order_by(query.order_by, sort=sort_matches, skip=pinned if seek else 0)
    if len(ranges) <= 1:
        where = build_where(
            unkeyed,
            scope,
            walk_order=walk_order,
            keyset=ranges[0] if ranges else None,
            collect_by=collect_by if sort_matches else None,
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
    # The second arm wants only what the first leaves of the page (docs/list-planning.md).
    # Bound values are 64-bit: near the largest offset, skip + limit would not fit.
    wanted = min(skip + limit, MAX_OFFSET)
    still_wanted = (
        f"max(0, ? - (SELECT count(*) FROM (SELECT 1 FROM applicants {first_where.sql} LIMIT ?)))"
    )
    # A compound SELECT's ORDER BY names result columns: never `+column`.
    return SqlFragment(
        f"{select} {first_where.sql} UNION ALL SELECT * FROM "
        f"({select} {then_where.sql} {order_by} LIMIT {still_wanted}) "
        f"{build_order_by(query.order_by)} LIMIT ? OFFSET ?",
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


@dataclass(frozen=True, slots=True)
class ListPlan:
    """Every statement one list page may run, and the choices between them."""

    query: ApplicantQuery
    scope: Scope
    matches: SqlFragment = field(init=False)  # the WHERE of the matches: counts, cache keys
    walk: bool | None = field(init=False)  # None: chosen by `walks` from the sizes
    # A cursor page reads one record more, to know whether another follows it.
    peek: int = field(init=False)
    # The stored bodies concatenated and their byte lengths: Python splits them and
    # decompresses each (`bodies.BodyDecoder.decode_joined`). CAST AS BLOB hands Python
    # the bytes as stored (JSON of a database from before is text). Only the sync feed
    # needs the records' change sequence numbers (its position and its cursor are the
    # last one).
    _columns: str = field(init=False)

    def __post_init__(self) -> None:
        sync = self.query.changed_since is not None
        sequences = "coalesce(group_concat(change_seq), '')" if sync else "''"
        columns = (
            "count(*), CAST(coalesce(group_concat(body, ''), '') AS BLOB), "
            f"coalesce(group_concat(length(CAST(body AS BLOB))), ''), {sequences}"
        )
        object.__setattr__(self, "matches", build_where(self.query, self.scope))
        object.__setattr__(self, "walk", walks_order_index(self.query, self.scope))
        object.__setattr__(self, "peek", 1 if self.query.after is not None else 0)
        object.__setattr__(self, "_columns", columns)

    @property
    def count(self) -> SqlFragment:
        """(data version, the number of matches): `meta.total`."""
        return count(self.matches)

    @property
    def sizes(self) -> SqlFragment:
        """(data version, matches, every applicant): what `walks` decides by."""
        return SqlFragment(
            f"SELECT {VERSION}, (SELECT count(*) FROM applicants {self.matches.sql}), "
            "(SELECT count(*) FROM applicants)",
            self.matches.params,
        )

    @property
    def wanted(self) -> int:
        """The matches a page's walk must reach: those it skips, then the page."""
        return _skip(self.query) + self.query.limit

    def walks(
        self,
        matches: int,
        everything: int,
        stepped: int | None = None,
        collected: int | None = None,
    ) -> bool:
        """Walk the ordering's index when that costs less than collecting the matches.

        The walk steps over `stepped` rows when the caller knows (the rows of the order up
        to the last one the page needs), else about wanted * everything / matches, as if
        the matches were spread evenly through the order. Collecting reads `collected`
        rows when the caller knows (those the collecting index keeps, of which the other
        filters keep the matches), else the matches alone.
        """
        if stepped is None:
            stepped = min(everything, self.wanted * everything // max(matches, 1))
        return stepped * walk_row_cost(self.query, self.scope) < (collected or matches)

    def reads_by_rowid(
        self, candidates: int, matches: int, everything: int, stepped: int | None
    ) -> bool:
        """Read the page's `candidates` (rowids the copy gave) when that costs less than a
        walk: of the seek's range (`stepped` rows), else of the whole order."""
        if stepped is None:
            stepped = min(everything, self.wanted * everything // max(matches, 1))
        return candidates * ROWID_READ_COST <= stepped * walk_row_cost(self.query, self.scope)

    def walks_whatever_the_spread(
        self, matches: int, everything: int, collected: int | None = None
    ) -> bool | None:
        """`walks` where how the matches spread through the order cannot change it: a
        walk steps over at least `wanted` rows and at most every non-match besides (and
        never more rows than there are)."""
        cost = walk_row_cost(self.query, self.scope)
        collecting = collected or matches
        if min(everything, everything - matches + self.wanted) * cost < collecting:
            return True
        if min(everything, self.wanted) * cost >= collecting:
            return False
        return None

    @property
    def uses_checkpoints(self) -> bool:
        """Whether the page starts from a checkpoint: a deep offset.

        Not a shallow page of a walked list: the checkpoints take one pass over every
        match, which a first page with a filter value never asked before (a sync
        client's fresh timestamp, a date picker) paid on every request: 300-500 ms at
        100,000 rows, where the walk itself reads about limit * rows / matches rows.
        """
        query = self.query
        return query.after is None and query.changed_since is None and query.offset >= DEEP_OFFSET

    @property
    def checkpoint_key(self) -> tuple[object, ...]:
        """The checkpoints' cache key: the matches and the order."""
        return (self.matches.sql, self.matches.params, self.query.order_by)

    def anchors(self, walk: bool) -> SqlFragment:
        """(data version, key values) of matches number 0, K, 2K, ... in the order: one pass."""
        where = build_where(self.query, self.scope, walk_order=walk)
        columns = ", ".join(order_columns(self.query.order_by))
        return SqlFragment(
            f"SELECT {VERSION}, {columns} FROM ("
            f"SELECT {columns}, row_number() OVER ({build_order_by(self.query.order_by)}) "
            f"AS position FROM applicants {where.sql}) "
            f"WHERE (position - 1) % {CHECKPOINT_EVERY} = 0",
            where.params,
        )

    def start(self, anchors: Anchors) -> tuple[tuple[KeyValue, ...] | None, int]:
        """The checkpoint to start the page from, and the rows to skip after it."""
        if not anchors:
            return None, _skip(self.query)
        index = min(self.query.offset // CHECKPOINT_EVERY, len(anchors) - 1)
        return anchors[index], self.query.offset - index * CHECKPOINT_EVERY

    def page(
        self,
        walk: bool,
        start: tuple[KeyValue, ...] | None = None,
        skip: int | None = None,
        seek: SeekRanges = (),
        collect_by: str | None = None,
        rowids: str | None = None,
    ) -> SqlFragment:
        """(data version, rows, their stored bodies concatenated, their lengths, their
        change sequences)."""
        select = self._select(walk, start, skip, seek, collect_by, rowids)
        return SqlFragment(f"SELECT {VERSION}, {self._columns} FROM ({select.sql})", select.params)

    def page_and_count(
        self,
        walk: bool,
        start: tuple[KeyValue, ...] | None = None,
        skip: int | None = None,
        collect_by: str | None = None,
    ) -> SqlFragment:
        """`page` with the number of matches after the version, in one snapshot."""
        select = self._select(walk, start, skip, collect_by=collect_by)
        return SqlFragment(
            f"SELECT {VERSION}, (SELECT count(*) FROM applicants {self.matches.sql}), "
            f"{self._columns} FROM ({select.sql})",
            (*self.matches.params, *select.params),
        )

    def _select(
        self,
        walk: bool,
        start: tuple[KeyValue, ...] | None,
        skip: int | None,
        seek: SeekRanges = (),
        collect_by: str | None = None,
        rowids: str | None = None,
    ) -> SqlFragment:
        return build_page_select(
            self.query,
            self.scope,
            limit=self.query.limit + self.peek,
            skip=_skip(self.query) if skip is None else skip,
            walk_order=walk,
            start=start,
            seek=seek,
            # Collecting was chosen by the sizes: not where no filter narrows the rows,
            # or an index serves filter and order (`walks_order_index`), nor where a
            # seek bounds the ordering's index.
            sort_matches=not walk and self.walk is None and not seek,
            collect_by=collect_by,
            rowids=rowids,
        )


plan_list = lru_cache(maxsize=4096)(ListPlan)  # the same few query shapes recur
