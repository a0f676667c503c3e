"""How a list page is read: every choice in one pure function, `choose`.

`choose(query, scope, stats) -> ReadPlan` decides whether the page walks the ordering's
index, collects the matches through a filter's index and sorts them, seeks to the
ranges of the order where its matches lie, or reads them by rowid. It reads the
resource's facts (`resource.APPLICANTS`) and, when the choice depends on how many rows
match, the statistics `stats`: the columnar copy (`match_counter.MatchCounter`, which
answers counts and where matches lie, and decides nothing), or the two sizes SQLite
counted (`Sizes`). `stats_needed` says which a query's choice reads, so that storage
fetches only those. `plan.py` then builds the statements from the `ReadPlan` alone, and
`storage.py` runs them. Why each choice, with its measurements: docs/list-planning.md.
"""

from __future__ import annotations

import enum
from functools import lru_cache
from typing import Final, NamedTuple

import msgspec

from leasestar.applicants.cursors import KeyValue
from leasestar.applicants.filters import FILTERS_BY_NAME
from leasestar.applicants.match_counter import MatchCounter
from leasestar.applicants.ordering import total_order
from leasestar.applicants.query import ApplicantQuery
from leasestar.applicants.records import SortKey
from leasestar.applicants.resource import APPLICANTS

Scope = frozenset[str] | None
SeekRanges = tuple[tuple[str, KeyValue, KeyValue], ...]  # (column, low, high) of leading keys

# Deep offsets start from the nearest checkpoint (every CHECKPOINT_EVERY-th match of a
# query's filters in its order) instead of stepping over every skipped row.
CHECKPOINT_EVERY: Final = 1000
DEEP_OFFSET: Final = 10 * CHECKPOINT_EVERY
# What each read costs per row, relative to collecting one match (a filter's index
# entry, its row read for the sort keys and body, and its share of the sort; ~3-4 us):
# walking an index and reading each row to test the filters ~0.8 us; walking an index
# that carries the filtered columns ~0.14 us; reading a match by its rowid and its
# share of the sort ~1-1.5 us (docs/list-planning.md, "Walking an ordering's index, or
# collecting the matches").
WALK_READING_ROWS_COST: Final = 0.25
WALK_INDEX_ONLY_COST: Final = 0.04
ROWID_READ_COST: Final = 0.4
# A page's matches read by rowid, at most: up to where a walk costs less (8,192;
# docs/list-planning.md, "Seeking to where the matches are").
ROWID_READ_MOST: Final = 8192


class Read(enum.Enum):
    """How the page's rows are found."""

    INDEX = "index"  # as SQLite plans it, unhinted: one index serves the query
    WALK = "walk"  # the ordering's index, the broad filters hinted `+column`
    COLLECT = "collect"  # the matches through `collect_by`'s index, sorted
    SEEK = "seek"  # the ordering's index within `ranges`
    ROWIDS = "rowids"  # `rowids`, read one by one and sorted


class How(msgspec.Struct, frozen=True, gc=False):
    """How a page is read, and what that way needs.

    A seek or a rowid read holds at the copy's version (`version`): a page read at
    another is read `otherwise`.
    """

    read: Read
    collect_by: str | None = None  # COLLECT: the column whose index collects (None: SQLite's)
    ranges: SeekRanges = ()  # SEEK
    # SEEK of several ranges that no one index serves: only the last range's column is
    # left for SQLite to seek; the keys before it are tested.
    seeks_last_only: bool = False
    rowids: str | None = None  # ROWIDS: a JSON array
    version: int | None = None  # SEEK, ROWIDS
    otherwise: How | None = None  # SEEK, ROWIDS
    # The matches the copy counted while choosing, at `counted_at`: the page's total.
    counted: int | None = None
    counted_at: int | None = None

    @property
    def unsought(self) -> How:
        """This way, or the one for a page read at another version than the copy's."""
        return self if self.otherwise is None else self.otherwise


INDEX: Final = How(Read.INDEX)
WALK: Final = How(Read.WALK)
COLLECT_ANY: Final = How(Read.COLLECT)


class ReadPlan(msgspec.Struct, frozen=True, gc=False):
    """One page's query and how it is read: all `plan.py` builds its statements from."""

    query: ApplicantQuery
    scope: Scope
    how: How

    @property
    def uses_checkpoints(self) -> bool:
        return uses_checkpoints(self.query)


class Sizes(NamedTuple):
    """The sizes SQLite counted, when the copy does not answer: what a walk is weighed by."""

    matches: int
    everything: int


Stats = MatchCounter | Sizes


class Needed(enum.Enum):
    """What a query's choice reads (`stats_needed`)."""

    NOTHING = "nothing"
    COPY = "copy"  # the copy, once read; without it, the index is read as it is
    COPY_OR_SIZES = "copy or sizes"  # the copy, once read; without it, `Sizes`


def shape(query: ApplicantQuery) -> tuple[object, ...]:
    """What of a query its choice depends on: not the cursor's values, nor a cursor
    page's position (the key of the choices cached per copy version)."""
    cursor = query.after is not None
    return (
        query.filters,
        query.order_by,
        query.changed_since,
        query.limit,
        cursor,
        0 if cursor else query.offset,
    )


def stats_needed(query: ApplicantQuery, scope: Scope) -> Needed:
    """Which statistics the choice of `query`'s read depends on."""
    return _stats_needed(_filter_names(query), query.order_by, scope)


@lru_cache(maxsize=4096)  # pure; keyed by what it reads, not by the filters' values
def _stats_needed(names: tuple[str, ...], order_by: tuple[SortKey, ...], scope: Scope) -> Needed:
    if not _one_index_serves(names, order_by, scope):
        return Needed.COPY_OR_SIZES  # every filter a broad one: the copy holds them all
    copied = all(FILTERS_BY_NAME[name].broad for name in names)
    return Needed.COPY if copied and _sorts_without_index(order_by) else Needed.NOTHING


def _filter_names(query: ApplicantQuery) -> tuple[str, ...]:
    return tuple(name for name, _ in query.filters)


def choose(query: ApplicantQuery, scope: Scope, stats: Stats | None) -> ReadPlan:
    """How the page of `query` is read, from the statistics `stats_needed` asks for
    (None: none needed, or the copy is not there)."""
    return ReadPlan(query, scope, _how(query, scope, stats))


def _how(query: ApplicantQuery, scope: Scope, stats: Stats | None) -> How:
    one_index = _one_index_serves(_filter_names(query), query.order_by, scope)
    if isinstance(stats, MatchCounter):
        how = _by_copy(query, scope, stats)
        if not one_index:
            return how
        # An index serves filter and order, but SQLite sorts every match of an order of
        # several keys unless told where the page lies: a seek or a walk of the
        # copy's choosing, else the index as it is.
        if how.read is Read.COLLECT:
            return msgspec.structs.replace(how, read=Read.INDEX, collect_by=None)
        if how.otherwise == COLLECT_ANY:
            return msgspec.structs.replace(how, otherwise=INDEX)
        return how
    if one_index or stats is None:
        return INDEX
    return WALK if Costs(query, scope).walks(stats.matches, stats.everything) else COLLECT_ANY


def _by_copy(query: ApplicantQuery, scope: Scope, copy: MatchCounter) -> How:
    """A first page whose lead key the copy holds seeks to the range its matches lie
    in, and walks it when that steps over fewer rows than collecting the matches; few
    matches there are read by rowid. Any other page walks or collects by the counts."""
    costs, everything, version = Costs(query, scope), copy.rows, copy.version
    if query.after is None and not uses_checkpoints(query):
        found = copy.seek(query, scope, total_order(query.order_by), costs.wanted, ROWID_READ_MOST)
        counted, counted_at = found.matches, version
        # A walk of several ranges that no one index serves tests the keys before the
        # last on every row of it, for a length not estimated: few matches within them
        # are read by rowid.
        several = tuple(column for column, _, _ in found.ranges[:2])
        unserved = len(several) > 1 and several not in APPLICANTS.order_indexes
        if found.candidates is not None and (
            unserved
            or costs.reads_by_rowid(len(found.candidates), found.matches, everything, found.stepped)
        ):
            rowids = "[" + ",".join(map(str, found.candidates.tolist())) + "]"
            return How(
                Read.ROWIDS,
                rowids=rowids,
                version=version,
                otherwise=COLLECT_ANY,
                counted=counted,
                counted_at=counted_at,
            )
        if found.ranges:
            seek = How(
                Read.SEEK,
                ranges=found.ranges,
                seeks_last_only=unserved,
                version=version,
                otherwise=WALK,
                counted=counted,
                counted_at=counted_at,
            )
            if len(found.ranges) > 1:
                return seek  # the last range sought, every filter tested
            collect_by, collected = _collected_by(query, scope, copy)
            if costs.walks(found.matches, everything, found.stepped, collected):
                return seek
            # Collected as if there were no range: through the fewest rows.
            return How(Read.COLLECT, collect_by=collect_by, counted=counted, counted_at=counted_at)
        matches = found.matches
    else:
        matches, counted, counted_at = copy.count(query, scope), None, None
    collect_by, collected = _collected_by(query, scope, copy)
    walks = costs.walks_whatever_the_spread(matches, everything, collected)
    if walks is None:
        walks = costs.walks(matches, everything, collected=collected)
    if walks:
        return How(Read.WALK, counted=counted, counted_at=counted_at)
    return How(Read.COLLECT, collect_by=collect_by, counted=counted, counted_at=counted_at)


def _collected_by(
    query: ApplicantQuery, scope: Scope, copy: MatchCounter
) -> tuple[str | None, int | None]:
    """The column whose index collects the matches, the one whose conditions keep
    fewest rows (None: one column only, or none: SQLite's pick, which without
    statistics is as often the wrong one), and those rows."""
    kept = copy.kept_by_each(query, scope)
    if not kept:
        return None, None
    fewest = min(kept, key=kept.__getitem__)
    return (fewest if len(kept) > 1 else None), kept[fewest]


def uses_checkpoints(query: ApplicantQuery) -> bool:
    """Whether the page starts from a checkpoint: a deep offset.

    Not a shallow page of a walked list: the checkpoints take one pass over every
    match, which a first page with a filter value never asked before (a sync client's
    fresh timestamp, a date picker) would pay on every request (docs/list-planning.md,
    "The statements of one page").
    """
    return query.after is None and query.changed_since is None and query.offset >= DEEP_OFFSET


@lru_cache(maxsize=4096)  # pure; keyed by what it reads, not by the filters' values
def _one_index_serves(names: tuple[str, ...], order_by: tuple[SortKey, ...], scope: Scope) -> bool:
    """Whether one index serves the query as SQLite plans it (no hint); else walking
    the ordering's index or collecting the matches depends on how many rows match."""
    specs = [FILTERS_BY_NAME[name] for name in names]
    if not specs and scope is None:
        return True
    if not all(spec.broad for spec in specs):
        return True  # a selective filter's own index always wins
    columns = [spec.column for spec in specs]
    if scope is not None and len(scope) == 1 and APPLICANTS.scope_column not in columns:
        columns.append(APPLICANTS.scope_column)
    lead = total_order(order_by)[0].field
    if len(columns) == 1 and (columns[0], lead) in APPLICANTS.filter_order_indexes:
        return True  # one composite index serves both the filter and the order
    # Every filter a range of the ordering's own index, or not.
    return scope is None and all(column == lead for column in columns)


def _sorts_without_index(order_by: tuple[SortKey, ...]) -> bool:
    """An order of several keys led by a column of the columnar copy that no index of
    schema.sql serves: SQLite sorts every match unless told where the page lies."""
    keys = total_order(order_by)
    if len(keys) <= 2 or keys[0].field not in APPLICANTS.copy_columns:
        return False
    served = tuple(key.field for key in keys[:-1]) in APPLICANTS.order_indexes
    return not (served and len({key.direction for key in keys}) == 1)


def walk_row_cost(query: ApplicantQuery, scope: Scope) -> float:
    """The cost of a walk per row it steps over (`resource.ListResource.walk_index_carries`)."""
    return _walk_row_cost(
        _filter_names(query), query.order_by, scope, query.changed_since is not None
    )


@lru_cache(maxsize=4096)  # pure; keyed by what it reads, not by the filters' values
def _walk_row_cost(
    names: tuple[str, ...], order_by: tuple[SortKey, ...], scope: Scope, syncing: bool
) -> float:
    lead = total_order(order_by)[0].field
    carried = APPLICANTS.walk_index_carries.get(lead, frozenset()) | {lead}
    tested = {FILTERS_BY_NAME[name].column for name in names}
    if scope is None and not syncing and tested <= carried:
        return WALK_INDEX_ONLY_COST
    return WALK_READING_ROWS_COST


def wanted(query: ApplicantQuery) -> int:
    """The matches a page's walk must reach: those it skips, then the page (a cursor
    page seeks by key, so it skips none)."""
    return (0 if query.after is not None else query.offset) + query.limit


class Costs:
    """What walking, collecting and reading by rowid cost one page."""

    def __init__(self, query: ApplicantQuery, scope: Scope) -> None:
        self.wanted = wanted(query)
        self.row_cost = walk_row_cost(query, scope)

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
        return stepped * self.row_cost < (collected or matches)

    def reads_by_rowid(
        self, candidates: int, matches: int, everything: int, stepped: int | None
    ) -> bool:
        """Read the page's `candidates` (rowids the copy gave) when that costs less than a
        walk: of the seek's range (`stepped` rows), else of the whole order."""
        if stepped is None:
            stepped = min(everything, self.wanted * everything // max(matches, 1))
        return candidates * ROWID_READ_COST <= stepped * self.row_cost

    def walks_whatever_the_spread(
        self, matches: int, everything: int, collected: int | None = None
    ) -> bool | None:
        """`walks` where how the matches spread through the order cannot change it: a
        walk steps over at least `wanted` rows and at most every non-match besides (and
        never more rows than there are)."""
        collecting = collected or matches
        if min(everything, everything - matches + self.wanted) * self.row_cost < collecting:
            return True
        if min(everything, self.wanted) * self.row_cost >= collecting:
            return False
        return None
