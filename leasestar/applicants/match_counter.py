"""Statistics of the broad filters' matches, from the columnar copy (`columnar_copy.py`).

It answers questions and decides nothing (`planner.py` does): how many rows match a
query, its sync position and a scope (`count`, exact), what each filter keeps alone
(`kept_by_each`), and where a page's first matches lie in an order (`seek`). Each
filter's row says what it tests here (`Filter.copy_test`). The selective filters
(`email_1`, `phone_1`, `x_id`) are not copied: their own index finds their few rows, so
SQLite counts them cheaply (`MatchCounter.covers`). Why a copy, how fast, and how it
follows writes: docs/list-planning.md, "Exact totals from a columnar copy" and
"Seeking to where the matches are".
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, NamedTuple

import numpy as np

from leasestar.applicants import copy_file, sorted_rows
from leasestar.applicants.columnar_copy import WRITTEN_MERGED_MOST, ColumnarCopy
from leasestar.applicants.copy_columns import (
    COLUMNS,
    INSTANT_ORDER,
    MISSING,
    Array,
    Codes,
    KeyValue,
    Order,
)
from leasestar.applicants.filters import FILTERS_BY_NAME, AnyOf, CopyTest, Equals, Within
from leasestar.applicants.query import ApplicantQuery
from leasestar.applicants.records import SortKey
from leasestar.applicants.resource import APPLICANTS

Scope = frozenset[str] | None

# Seeking a page's first matches in the order's rows: the first chunk of rows, and how
# many times the rows an even spread of the matches needs are stepped through before
# gathering every match instead.
_STEP_FIRST: Final = 1024
_STEP_SPREAD: Final = 8
# Rows of a range tested for the page's candidates (`Seek.candidates`), at most.
_CANDIDATES_LOOKED_AT: Final = 1 << 18
# The matches of a range listed from its sorted rows, at most: sorting more rowids
# costs more than a pass over the copy.
_LISTED_MOST: Final = 1 << 16
# The rows a seek asks a range about are told one by one until they add up to 1/256 of
# the copy's rows, then from a mask made once, a pass over the copy (1/64 left the
# matrix's seeks that step far at 0.87-0.94x of before). 0: always one by one.
_GATHERED_PART: Final = 256
# A range's mask is set from its matches' rowids (`_RangeMatches.gathered`) while they
# are fewer than this part of the rows, a pass over the copy beyond (at 1,000,000 rows,
# 10 %: 0.5 ms against 1.5; 50 %: 2.5 against 1.7).
_SCATTERED_PART: Final = 3
# Rows of a copy whose 8-byte columns (16 MB) stay in this machine's cache (35 MB L3):
# beyond, a range's matches are sorted before their keys are read (`_RangeMatches.gathered`).
_CACHED_ROWS_MOST: Final = 1 << 21
# Beyond this part of the rows, a range's matches are listed from its mask once made
# (`_RangeMatches.gathered`).
_GATHERED_BY_MASK: Final = 8


class Seek(NamedTuple):
    """What the copy tells a page's plan (`MatchCounter.seek`)."""

    matches: int
    ranges: tuple[tuple[str, KeyValue, KeyValue], ...]  # (column, low, high), leading keys
    stepped: int | None  # rows a walk of the lead key's range steps over; None without one
    # The rowids of every match within the ranges (of every match, without ranges) when
    # they are few (`candidates_most`): the page is those rows, sorted. None: too many.
    candidates: Array | None = None


class MatchCounter(ColumnarCopy):
    """Counts of the broad filters' matches, and where a page's matches lie in an order,
    from the columnar copy (on the event loop: a count is one numpy pass)."""

    def __init__(self, path: Path) -> None:
        # column -> (the order it was sorted by, its rows' rowids and sort keys in that
        # order), for `_in_order`.
        self._sorted: dict[str, tuple[Order, Array, Array]] = {}
        # "group/instant" -> (where each code's rows start, every row's instant, its
        # rowid), by code then instant, held by this worker: sorted here, or the file's
        # with the rows written since moved (`_by_group`).
        self._grouped: dict[str, tuple[Array, Array, Array]] = {}
        # What was written over the copy since each of those was sorted (rowids, in
        # batches): moved to where they now sort when it is next used (`sorted_rows.moved`).
        self._sorted_stale: dict[str, list[Array]] = {}
        self._grouped_stale: dict[str, list[Array]] = {}
        super().__init__(path)

    def _changed(self) -> None:
        self._sorted, self._sorted_stale = {}, {}
        self._grouped, self._grouped_stale = {}, {}

    def _written(self, rowids: Array) -> None:
        """Each order and grouping sorted here has these rows moved when next used;
        one with more rows to move than `WRITTEN_MERGED_MOST` is sorted again instead."""
        for held, stale in (
            (self._sorted, self._sorted_stale),
            (self._grouped, self._grouped_stale),
        ):
            for key in list(held):
                batches = stale.setdefault(key, [])
                batches.append(rowids)
                if sum(len(batch) for batch in batches) > WRITTEN_MERGED_MOST:
                    del held[key], stale[key]

    @staticmethod
    def covers(query: ApplicantQuery) -> bool:
        """Whether the copy answers this query's count: every filter is a broad one."""
        return all(FILTERS_BY_NAME[name].broad for name, _ in query.filters)

    def count(self, query: ApplicantQuery, scope: Scope) -> int:
        """The number of applicants at the copy's version that match the query's filters,
        its sync position and the scope (`covers(query)` must hold).

        The common shapes, a range of one instant (date bounds, or the sync position)
        alone or within one group (an equality filter, or the token's integrations), are
        counted by binary searches in that instant's rows by group, then instant (the
        copy's file holds them: `_by_group`): O(log n). Any other combination by one comparison per
        filter over the copy: O(n), ~1 ns a row.
        """
        shape = self._shape(query, scope)
        if shape is not None:
            return self._count_range(*shape)
        return int(np.count_nonzero(self._matches(query, scope)))

    def _shape(
        self, query: ApplicantQuery, scope: Scope
    ) -> tuple[str | None, int, int, str | None, frozenset[str]] | None:
        """`_ranged_shape`, a group alone only where its column's order is at hand and
        current (sorted here with no rows written since, or the file's with none written
        since it): sorting it for a count (~1 s at 10,000,000 rows), or moving the rows
        written since into it (~0.4 s there for 100 rows), would cost more than the pass
        it saves (~8 ms)."""
        shape = _ranged_shape(query, scope)
        if shape is not None and shape[0] is None and shape[3] is not None:
            group = shape[3]
            cached = self._sorted.get(group)
            order_of = self._order_of(group)
            if cached is not None:
                at_hand = cached[0] is order_of and not self._sorted_stale.get(group)
            else:
                at_hand = order_of.keys_are_values and not self._written_since_file
            if not (at_hand and (cached is not None or self._file_order(group))):
                return None
        return shape

    def _count_range(
        self, instant: str | None, low: int, high: int, group: str | None, values: frozenset[str]
    ) -> int:
        """Rows whose `instant` is within [low, high] (every row without one), of those
        whose `group` column holds one of `values` (every row without a group)."""
        if instant is None:
            assert group is not None
            return sum(span.stop - span.start for span in self._group_spans(group, values)[1])
        if group is None:
            keys = self._in_order(instant, INSTANT_ORDER)[1]
            return sorted_rows.between(keys, low, high)
        grouping = self._by_group(group, instant)
        counted = 0
        for value in values:
            code = self._codes[group].of(value)
            if 0 <= code < len(grouping[0]) - 1:
                span = sorted_rows.group_span(grouping, code, low, high, self._column(instant))
                counted += span.stop - span.start
        return counted

    def _group_spans(self, group: str, values: frozenset[str]) -> tuple[Array, list[slice]]:
        """(the rows in `group`'s order, where each of `values` lies in it): each value's
        rows side by side, in rowid order."""
        order_of = self._order_of(group)
        rowids, keys = self._in_order(group, order_of)
        codes = np.array(_codes_of(self._codes[group], values), np.int64)
        return rowids, [sorted_rows.span(keys, key, key) for key in map(int, order_of.keys(codes))]

    def _by_group(self, group: str, instant: str) -> tuple[Array, Array | None, Array]:
        """(where each code's rows start, their instants, their rowids) with the rows by
        code, then instant: the file's grouping (its instants read through its rowids:
        None), shared by every worker; the rows written since moved where they sort
        (`sorted_rows.regrouped`: this worker's own), or sorted here where the file has none."""
        key = copy_file.grouping_key(group, instant)
        cached = self._grouped.get(key)
        stale = self._grouped_stale.pop(key, None)
        groups, instants = self._column(group), self._column(instant)
        if cached is not None and stale:
            cached = self._grouped[key] = sorted_rows.regrouped(*cached, stale, groups, instants)
        if cached is not None:
            return cached
        stored = self._file_grouping(group, instant)
        if stored is not None and not self._written_since_file:
            return stored[0], None, stored[1]
        if stored is not None:
            starts, rowids = stored
            written = self._written_since_file
            cached = sorted_rows.regrouped(
                starts, instants.take(rowids), rowids, written, groups, instants
            )
        else:
            by_instant, _ = self._in_order(instant, INSTANT_ORDER)
            starts, rowids = copy_file.grouped(by_instant, groups)
            rowids = rowids.astype(sorted_rows.rowid_type(self._present), copy=False)
            cached = (starts, instants.take(rowids), rowids)
        self._grouped[key] = cached
        return cached

    def kept_by_each(self, query: ApplicantQuery, scope: Scope) -> dict[str, int]:
        """For each column the query tests (its filters', the scope's, the sync
        position's `change_seq`), the rows its conditions alone keep."""
        shape = self._shape(query, scope)
        if shape is not None:
            instant, low, high, group, values = shape
            if instant is None:
                assert group is not None
                return {group: self._count_range(None, low, high, group, values)}
            counts = {instant: self._count_range(instant, low, high, None, values)}
            if group is not None:
                counts[group] = self._count_range(
                    instant, sorted_rows.LOWEST, sorted_rows.HIGHEST, group, values
                )
            return counts
        masks: dict[str, Array] = {}
        for test in copy_tests(query, scope):
            kept = self._present & self._kept(test)
            masks[test.column] = masks[test.column] & kept if test.column in masks else kept
        return {column: int(np.count_nonzero(mask)) for column, mask in masks.items()}

    def seek(
        self,
        query: ApplicantQuery,
        scope: Scope,
        order: tuple[SortKey, ...],
        wanted: int,
        candidates_most: int,
    ) -> Seek:
        """The matches, and where in `order` a page's first `wanted` of them lie.

        `ranges` holds, for the order's leading keys that the copy holds (instants and
        coded columns), the (column, lowest, highest) values those matches take: the
        lead key's over all of them, and each next key's over those matches that share
        the single value the keys before it take (a group of ties the page lies in).
        `stepped` estimates the rows of any kind a walk of the lead key's index confined
        to its range steps over (`_stepped`).

        Matches are seldom spread evenly through an order: a record is updated after it
        is created, and a vendor's properties sort together. Told where its matches are,
        a page seeks to them instead of stepping over every other vendor's rows, and an
        order of two keys without an index of its own sorts one group, not the table.
        """
        matches = self._matched(query, scope)
        found = matches.count
        ranges: list[tuple[str, KeyValue, KeyValue]] = []
        stepped: int | None = None
        within, count = matches, found
        candidates = matches.rowids() if found <= candidates_most else None
        for number, key in enumerate(order):
            if key.field not in COLUMNS or not count:
                break
            order_of = self._order_of(key.field)
            # Stepping meets `wanted` matches in about wanted * rows / count rows of the
            # order; fewer matches than that are gathered at once.
            first = None
            if count * count > min(wanted, count) * len(self._present):
                first = self._first_in_order(key, order_of, within, count, wanted)
            if first is None:
                first = self._first_gathered(key, order_of, within, wanted)
            low, high, level_stepped = first
            ranges.append((key.field, order_of.value(low), order_of.value(high)))
            if stepped is None:
                stepped = level_stepped
            following = order[number + 1].field if number + 1 < len(order) else None
            if low != high or following not in COLUMNS:
                candidates = self._matches_between(
                    key.field, order_of, within, count, low, high, most=candidates_most
                )
                break
            # The next key orders the matches among the lead key's ties: the rows of
            # that one value, which its order holds side by side, in rowid order.
            rowids, keys = self._in_order(key.field, order_of)
            ties = sorted_rows.span(keys, low, low)
            if within.listed_cheaply and count < ties.stop - ties.start:
                listed = within.rowids()
                listed = listed[order_of.keys(self._column(key.field).take(listed)) == low]
            else:
                tied = rowids[ties]
                listed = tied[within.at(tied)]
            within = _ListedMatches(listed, len(self._present))
            count = within.count
        return Seek(found, tuple(ranges), stepped, candidates)

    def _matches_between(
        self,
        column: str,
        order_of: Order,
        within: _Matches,
        count: int,
        low: int,
        high: int,
        *,
        most: int,
    ) -> Array | None:
        """The rowids of the `count` matches (`within`) whose key in `column`'s order is
        within [low, high], when there are at most `most` of them: from the matches when
        they are that few, else from the rows in that range of the order."""
        if count <= most:
            matched = within.rowids()
            keys_of = order_of.keys(self._column(column).take(matched))
            return matched[(keys_of >= low) & (keys_of <= high)]
        rowids, keys = self._in_order(column, order_of)
        start = np.searchsorted(keys, keys.dtype.type(low), "left")
        end = np.searchsorted(keys, keys.dtype.type(high), "right")
        if end - start > _CANDIDATES_LOOKED_AT:
            return None
        in_range = rowids[start:end]
        kept = within.at(in_range)
        if np.count_nonzero(kept) > most:
            return None
        return in_range[kept]

    def _first_in_order(
        self, key: SortKey, order_of: Order, within: _Matches, count: int, wanted: int
    ) -> tuple[int, int, int] | None:
        """(low, high, stepped) of the first `wanted` matches in `key`'s order, found by
        stepping through the rows in that order (`_in_order`) in growing chunks: when
        matches are many, they are met within a few times wanted * rows / matches rows,
        where gathering every match's key costs a pass over all of them. None when the
        first chunks hold too few of them (matches bunched late in the order): gathered
        instead."""
        rowids, keys = self._in_order(key.field, order_of)
        rows = len(rowids)
        take = min(wanted, count)
        budget = min(rows, max(_STEP_FIRST, _STEP_SPREAD * take * rows // count))
        reached, hits = 0, np.empty(0, np.int64)
        size = _STEP_FIRST
        while len(hits) < take and reached < budget:
            span = np.arange(reached, min(rows, reached + size))
            positions = span if key.direction == "asc" else rows - 1 - span
            hits = np.concatenate((hits, positions[within.at(rowids[positions])]))
            reached, size = reached + len(span), size * 2
        if len(hits) < take:
            return None
        hits = hits[:take]
        first, last = keys[hits[0]], keys[hits[-1]]
        low, high = (first, last) if key.direction == "asc" else (last, first)
        group = np.searchsorted(keys, last, "left"), np.searchsorted(keys, last, "right")
        whole = int(np.searchsorted(keys, high, "right") - np.searchsorted(keys, low, "left"))
        tied = int(group[1] - group[0])
        tied_matches = int(np.count_nonzero(within.at(rowids[group[0] : group[1]])))
        needed = take - int(np.count_nonzero(keys[hits] != last))
        return int(low), int(high), _steps(whole, tied, tied_matches, needed)

    def _first_gathered(
        self, key: SortKey, order_of: Order, within: _Matches, wanted: int
    ) -> tuple[int, int, int]:
        """(low, high, stepped) of the first `wanted` matches in `key`'s order, from
        every match's key: for few matches, or matches the order meets late."""
        # Gathered by position: a boolean mask branches on every row (~8x slower).
        keys = order_of.keys(self._column(key.field).take(within.gathered()))
        take = min(wanted, len(keys))
        if key.direction == "asc":
            low, high = keys.min(), np.partition(keys, take - 1)[take - 1]
        else:
            low, high = np.partition(keys, len(keys) - take)[len(keys) - take], keys.max()
        stepped = self._stepped(key, order_of, keys, int(low), int(high), take)
        return int(low), int(high), stepped

    def _stepped(
        self, key: SortKey, order_of: Order, keys: Array, low: int, high: int, take: int
    ) -> int:
        """The rows a walk of `key`'s order confined to [low, high] steps over to reach
        its `take`-th match (`_steps`)."""
        last = high if key.direction == "asc" else low
        whole = self._rows_between(key.field, order_of, low, high)
        tied = self._rows_between(key.field, order_of, last, last)
        tied_matches = int(np.count_nonzero(keys == keys.dtype.type(last)))
        if key.direction == "asc":
            matches_before = int(np.count_nonzero(keys < keys.dtype.type(last)))
        else:
            matches_before = int(np.count_nonzero(keys > keys.dtype.type(last)))
        return _steps(whole, tied, tied_matches, take - matches_before)

    def _order_of(self, column: str) -> Order:
        """How `column` sorts: by the instant itself, or by its code's rank among the
        column's values (SQLite's BINARY order of text is code-point order, as Python's),
        taken once for a whole plan, so values read meanwhile cannot shift it."""
        if column in self._codes:
            return self._codes[column].order()
        return INSTANT_ORDER

    def _rows_between(self, column: str, order_of: Order, low: int, high: int) -> int:
        """Rows whose key in `column`'s order is within [low, high]: two binary searches
        in the rows' keys, sorted once per change of the copy (and of the ranks)."""
        keys = self._in_order(column, order_of)[1]
        # In the keys' own type: another would have numpy convert the whole array first.
        low, high = keys.dtype.type(low), keys.dtype.type(high)
        return int(np.searchsorted(keys, high, "right") - np.searchsorted(keys, low, "left"))

    def _in_order(self, column: str, order_of: Order) -> tuple[Array, Array]:
        """(rowids, their keys) of every row in `column`'s order: the file's, or sorted
        here once the column's codes are numbered anew (a new value) or too many rows
        were written; the rows written since moved where they sort (`sorted_rows.moved`)."""
        cached = self._sorted.get(column)
        stale = self._sorted_stale.pop(column, None)
        if cached is not None and cached[0] is not order_of:
            cached = None  # the column's values were numbered again (a new value)
        if cached is not None and stale:
            values = self._column(column)
            cached = self._sorted[column] = (
                order_of,
                *sorted_rows.moved(*cached[1:], stale, values, order_of),
            )
        if cached is None and order_of.keys_are_values:
            # As the file holds them (shared by every worker), with the rows written
            # since moved (the result is this worker's own).
            stored = self._file_order(column)
            if stored is not None and self._written_since_file:
                values = self._column(column)
                stored = sorted_rows.moved(*stored, self._written_since_file, values, order_of)
            if stored is not None:
                cached = self._sorted[column] = (order_of, *stored)
        if cached is None:
            present = np.flatnonzero(self._present)
            keys = order_of.keys(self._column(column).take(present))
            by_key = np.argsort(keys, kind="stable")
            rowids: Array = present.take(by_key).astype(sorted_rows.rowid_type(self._present))
            cached = self._sorted[column] = (order_of, rowids, keys.take(by_key))
        return cached[1], cached[2]

    def _matched(self, query: ApplicantQuery, scope: Scope) -> _Matches:
        """The query's matches: a range of one instant, alone or within one group, or a
        group alone, is told row by row and counted by binary search (`_RangeMatches`);
        any other combination by one pass over the copy."""
        shape = self._shape(query, scope)
        if shape is None:
            return _Matches(self._matches(query, scope))
        return _RangeMatches(self, *shape)

    def _matches(self, query: ApplicantQuery, scope: Scope) -> Array:
        matches = self._present.copy()
        for test in copy_tests(query, scope):
            matches &= self._kept(test)
        return matches

    def _kept(self, test: CopyTest) -> Array:
        """The rows one test keeps (rows no longer present included)."""
        values = self._column(test.column)
        kept: Array
        if isinstance(test, Within):
            # One comparison where one side is open: the common date bound.
            if test.high is None:
                kept = values >= test.low
            elif test.low is None:
                kept = values <= test.high
            else:
                kept = (values >= test.low) & (values <= test.high)
            return kept
        codes = self._codes[test.column]
        if isinstance(test, Equals):
            kept = values == codes.of(test.value)
            return kept
        return _holds_any(values, _codes_of(codes, test.values))


class _Matches:
    """The rows a query keeps, as a seek asks of them: how many, which of some rows
    (`at`), all of them in rowid order; here from a mask over the copy."""

    def __init__(self, mask: Array) -> None:
        self._mask = mask
        self.count = int(np.count_nonzero(mask))

    @property
    def listed_cheaply(self) -> bool:
        """Whether `rowids` costs about a step per match, not a pass over the copy."""
        return False

    def mask(self) -> Array:
        return self._mask

    def at(self, rowids: Array) -> Array:
        return self.mask().take(rowids)

    def rowids(self) -> Array:
        return np.flatnonzero(self.mask())

    def gathered(self) -> Array:
        """The matches' rowids in any order: what a question of all of them, whose
        answer does not depend on their order, reads at least cost."""
        return self.rowids()


class _ListedMatches(_Matches):
    """Matches known by their rowids (sorted), few: a mask only if asked about many."""

    def __init__(self, rowids: Array, rows: int) -> None:
        self._listed, self._rows = rowids, rows
        self._made: Array | None = None
        self.count = len(rowids)

    @property
    def listed_cheaply(self) -> bool:
        return True

    def mask(self) -> Array:
        if self._made is None:
            self._made = np.zeros(self._rows, np.bool_)
            self._made[self._listed] = True
        return self._made

    def rowids(self) -> Array:
        return self._listed


class _RangeMatches(_Matches):
    """The matches of a range of one instant, alone or within one group, or of a group
    alone: slices of sorted rows (`_slices`), counted by binary search
    (`MatchCounter._count_range`), each row asked about tested alone, every one read
    through the slices. A mask only once a seek has asked about many rows: set from the
    slices while the matches are under a third of the rows, else one pass over the copy
    (~1.5 ms at 1,000,000 rows, ~25 at 10,000,000)."""

    def __init__(
        self,
        counter: MatchCounter,
        instant: str | None,
        low: int,
        high: int,
        group: str | None,
        values: frozenset[str],
    ) -> None:
        self._counter, self._instant, self._low, self._high = counter, instant, low, high
        self._group, self._values = group, values
        self._codes = [] if group is None else _codes_of(counter._codes[group], values)
        self._made: Array | None = None
        self._listed: Array | None = None
        self._asked = 0  # rows told one by one so far
        self._last_asked: tuple[object, ...] = ()
        self._last_rowids: Array = np.empty(0, np.int64)
        self._last_told: Array = np.empty(0, np.bool_)
        self.count = counter._count_range(instant, low, high, group, values)

    def mask(self) -> Array:
        if self._made is None and self.count * _SCATTERED_PART < len(self._counter._present):
            made = np.zeros(len(self._counter._present), np.bool_)
            made[self.gathered()] = True
            self._made = made
        if self._made is None:
            column = self._counter._column
            made = self._counter._present.copy()
            if self._instant is not None:
                instants = column(self._instant)
                if self._low > sorted_rows.LOWEST:
                    made &= instants >= self._low
                if self._high < sorted_rows.HIGHEST:
                    made &= instants <= self._high
            if self._group is not None:
                made &= _holds_any(column(self._group), self._codes)
            self._made = made
        return self._made

    def at(self, rowids: Array) -> Array:
        # A seek asks about a group of ties twice (how many of its rows match, then
        # which): the same rows of the same order, told once. The rows asked are held
        # while remembered: freed, their memory could hold other rows at that address.
        asked = (rowids.__array_interface__["data"][0], rowids.shape, rowids.strides)
        if asked != self._last_asked or rowids.dtype != self._last_rowids.dtype:
            told = self._told(rowids)
            self._last_asked, self._last_rowids, self._last_told = asked, rowids, told
        return self._last_told

    def _told(self, rowids: Array) -> Array:
        self._asked += len(rowids)
        if self._made is not None or self._asked * _GATHERED_PART > len(self._counter._present):
            return self.mask().take(rowids)
        column = self._counter._column
        kept: Array = self._counter._present.take(rowids)
        if self._instant is not None:
            instants = column(self._instant).take(rowids)
            if self._low > sorted_rows.LOWEST:
                kept &= instants >= self._low
            if self._high < sorted_rows.HIGHEST:
                kept &= instants <= self._high
        if self._group is not None:
            kept &= _holds_any(column(self._group).take(rowids), self._codes)
        return kept

    @property
    def listed_cheaply(self) -> bool:
        return self._listed is not None or (self._made is None and self.count <= _LISTED_MOST)

    def rowids(self) -> Array:
        if self._listed is None:
            rows = len(self._counter._present)
            if self._made is not None:
                self._listed = np.flatnonzero(self._made)
            elif self._instant is None and len(self._codes) == 1:
                self._listed = self._slices()  # one value's rows: in rowid order
            elif self.count <= _LISTED_MOST or (
                rows > _CACHED_ROWS_MOST and self.count * _SCATTERED_PART < rows
            ):
                self._listed = np.sort(self._slices())
            else:
                self._listed = np.flatnonzero(self.mask())
        return self._listed

    def gathered(self) -> Array:
        """The matches in any order, read at least cost: while the copy's columns fit in
        the cache, the slices of sorted rows as they are (`_slices`: no pass over the copy,
        no sort), or a mask already made when the matches are many (rows taken in rowid
        order read memory in turn: beyond 1/8 of the rows that costs less, at 1,000,000
        rows, 30 %: 1.9 ms against 3.2). Beyond the cache, in rowid order (`rowids`):
        reading rows at random from memory costs more than sorting them first (at
        10,000,000 rows, 10 %: 19 ms against 5 to sort)."""
        rows = len(self._counter._present)
        if self._listed is not None or rows > _CACHED_ROWS_MOST:
            return self.rowids()
        if self._made is not None and self.count * _GATHERED_BY_MASK > rows:
            return np.flatnonzero(self._made)
        return self._slices()

    def _slices(self) -> Array:
        """The matches from the slices of sorted rows that hold them: the instant's
        (`_in_order`), the grouping's by group then instant (`_by_group`), or the group
        column's (`_group_spans`)."""
        counter = self._counter
        if self._instant is None:
            assert self._group is not None
            rowids, spans = counter._group_spans(self._group, self._values)
            parts = [rowids[span] for span in spans]
            return parts[0] if len(parts) == 1 else np.concatenate(parts or [rowids[:0]])
        if self._group is None:
            rowids, keys = counter._in_order(self._instant, INSTANT_ORDER)
            return rowids[sorted_rows.span(keys, self._low, self._high)]
        grouping = counter._by_group(self._group, self._instant)
        instants = counter._column(self._instant)
        parts = [
            grouping[2][sorted_rows.group_span(grouping, code, self._low, self._high, instants)]
            for code in self._codes
            if code < len(grouping[0]) - 1
        ]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)


def copy_tests(query: ApplicantQuery, scope: Scope) -> tuple[CopyTest, ...]:
    """What the query asks of the copy: its filters' tests (each row of `FILTERS` says
    its own), the sync position, the scope."""
    tests = [FILTERS_BY_NAME[name].copy_test(value) for name, value in query.filters]
    if query.changed_since is not None:
        tests.append(Within("change_seq", query.changed_since + 1, None))
    if scope is not None:
        tests.append(AnyOf(APPLICANTS.scope_column, scope))
    return tuple(tests)


def _ranged_shape(
    query: ApplicantQuery, scope: Scope
) -> tuple[str | None, int, int, str | None, frozenset[str]] | None:
    """(instant or None, low, high, group column or None, its values) when the query is
    a range of one instant (its bounds, or the sync position on `change_seq`), alone or
    within one group (one equality filter, or the scope), or one group alone; None for
    any other combination (or none)."""
    instant: str | None = None
    low, high = sorted_rows.LOWEST, sorted_rows.HIGHEST
    group: str | None = None
    values: frozenset[str] = frozenset()
    for test in copy_tests(query, scope):
        if isinstance(test, Within):
            if instant not in (None, test.column):
                return None
            instant = test.column
            low = low if test.low is None else max(low, test.low)
            high = high if test.high is None else min(high, test.high)
        elif group is None:
            group = test.column
            values = frozenset({test.value}) if isinstance(test, Equals) else test.values
        else:
            return None
    if instant is None and group is None:
        return None
    return instant, low, high, group, values


def _steps(whole: int, tied: int, tied_matches: int, needed: int) -> int:
    """The rows a walk of a range (`whole` rows) steps over to reach the match it needs:
    every row before the last value it reaches, then as many of that value's `tied` rows
    as `needed` of its `tied_matches` take. Ties follow the id, which no filter follows,
    so the group's matches are spread evenly in it."""
    return whole - tied + -(-needed * tied // max(tied_matches, 1))


def _holds_any(values: Array, codes: list[int]) -> Array:
    """Which `values` are one of a few `codes`: a comparison each (`np.isin` sorts or
    tabulates, ~4x slower on a copy's column)."""
    found = np.zeros(len(values), np.bool_)
    for code in codes:
        found |= values == code
    return found


def _codes_of(codes: Codes, values: frozenset[str]) -> list[int]:
    """The codes of those `values` some row holds, sorted."""
    return sorted(code for code in map(codes.of, values) if code != MISSING)
