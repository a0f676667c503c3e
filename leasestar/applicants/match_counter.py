"""Exact `meta.total` for any combination of the broad filters, without SQLite counting.

SQLite counts a date range by stepping over every matching index entry (tens of ms at
1,000,000 rows), and a date range through a token's scope, or a vendor with a date
bound, by reading every matching row (hundreds of ms, seconds at 1,000,000). Each
process keeps instead a columnar copy of what the broad filters test (`COLUMNS`: the
change sequence, the three instants, the four equality columns as small integer
codes, and seven more codes for orders; 73 bytes a row), indexed by rowid,
and counts a combination with one vectorized comparison per filter over it: about a
nanosecond a row, ~1 ms at 1,000,000, whatever the filters, their values, the scope and
the sync position. Order statistics kept per (column, group) would count in O(log n),
but need a sorted copy per combination of equality filter, scope and date column, each
re-sorted after a write; this one structure answers every combination and follows a
write in O(rows written).

It follows the data version: every write gives each row it touches a change sequence
above every earlier one, so the rows with `change_seq` above the copy's version are
exactly what changed since; they are read in one snapshot and written over their rowids
(the writer updates a row in place, a replica copies the primary's rowid, and records
are never deleted). A database file replaced under the path (a replica's first copy) is
read again whole.

The selective filters (`email_1`, `phone_1`, `x_id`) are not copied: their own index
finds their few rows, so SQLite counts them cheaply (`MatchCounter.covers`).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from leasestar.applicants.filters import FILTERS, FILTERS_BY_NAME, InstantBound
from leasestar.applicants.query import ApplicantQuery
from leasestar.applicants.records import SortKey
from leasestar.database import BUSY_TIMEOUT_MS, read_uri

Scope = frozenset[str] | None
Array = npt.NDArray[Any]

# The instants and sequences a broad filter compares, and the text columns it matches
# exactly, which are kept as codes (each distinct value numbered as first seen).
INSTANT_COLUMNS: Final = ("change_seq", "created_at", "updated_at", "last_seen")
FILTERED_CODES: Final = ("integration_id", "integration_vendor", "property_id", "x_property_id")
# Kept for orders only, the text fields whose values repeat: the copy finds where a
# page's matches lie in their order (`seek`), where a walk of the field's index read
# every row to test a filter, and matches bunch (a date of birth follows the created
# date: 350 ms at 1,000,000 rows for a date window a walk met late), and narrows an
# order of several keys that no index serves to a group of ties key by key, where
# SQLite sorted every match (`state,city,zip`: 300-500 ms). Nullable: NULL is the code
# that sorts first, as SQLite sorts it. Not the unique ones (id, x_id, email_1): a
# code per row would cost more than the row.
ORDERED_CODES: Final = (
    "first_name",
    "middle_name",
    "last_name",
    "date_of_birth",
    "state",
    "city",
    "zip",
)
CODED_COLUMNS: Final = FILTERED_CODES + ORDERED_CODES
COLUMNS: Final = INSTANT_COLUMNS + CODED_COLUMNS
# The instants read together (one index of schema.sql holds these three), and apart.
_PACKED: Final = (("created_at", "updated_at", "last_seen"), ("change_seq",))
_HEX: Final = "%016x"  # a 64-bit integer (two's complement) as 16 hex digits
_MISSING: Final = -1  # the code of a value no row holds
# Seeking a page's first matches in the order's rows: the first chunk of rows, and how
# many times the rows an even spread of the matches needs are stepped through before
# gathering every match instead.
_STEP_FIRST: Final = 1024
_STEP_SPREAD: Final = 8
# A page's matches that SQLite reads by rowid and sorts rather than find through an
# index: 1-3 us a row read, where a range of a nullable key (its NULLs, a tenth of the
# rows) read through the key's index held 100,000 rows at 1,000,000 (~350 ms), and where
# collecting 4,600 matches of a property through its index took 32-38 ms (15-18 ms by
# rowid), walking the order ~17 ms: up to where a walk costs less.
_CANDIDATES_MOST: Final = 8192
_CANDIDATES_LOOKED_AT: Final = 1 << 18  # rows of a range tested for them, at most

# A broad filter the copy cannot answer would silently be counted wrong: fail at import.
for _spec in FILTERS:
    if _spec.broad and _spec.column not in COLUMNS:
        raise RuntimeError(f"broad filter {_spec.name} tests {_spec.column}, not in COLUMNS")


# Rows read from the database: column -> (rowids, values), codes already assigned.
_Rows = dict[str, tuple[Array, Array]]


KeyValue = int | str | None  # None: SQL NULL, in a nullable coded column


class Seek(NamedTuple):
    """What the copy tells a page's plan (`MatchCounter.seek`)."""

    matches: int
    ranges: tuple[tuple[str, KeyValue, KeyValue], ...]  # (column, low, high), leading keys
    stepped: int | None  # rows a walk of the lead key's range steps over; None without one
    # The rowids of every match within the ranges (of every match, without ranges) when
    # they are few (`_CANDIDATES_MOST`): the page is those rows, sorted. None: too many.
    candidates: Array | None = None


class _Order:
    """A column's sort keys: its values as they are (instants)."""

    def keys(self, values: Array) -> Array:
        return values

    def value(self, key: Any) -> KeyValue:
        return int(key)

    def stored(self, key: Any) -> Any:
        """What the copy holds for a sort key."""
        return key


_INSTANT_ORDER: Final = _Order()


class _CodeOrder(_Order):
    """A coded column's sort keys: each code's rank among the values, sorted."""

    def __init__(self, codes: dict[str | None, int]) -> None:
        self.codes = codes
        # A snapshot (a read may number new values meanwhile), NULL first as in SQLite.
        self.ordered = sorted(codes, key=lambda value: (value is not None, value or ""))
        self.ranks = np.zeros(len(self.ordered), np.int32)
        for rank, value in enumerate(self.ordered):
            self.ranks[codes[value]] = rank

    def keys(self, values: Array) -> Array:
        return self.ranks[values]

    def value(self, key: Any) -> KeyValue:
        return self.ordered[int(key)]

    def stored(self, key: Any) -> Any:
        return self.codes[self.ordered[int(key)]]


class _Codes:
    """Each distinct value of a text column numbered as first seen."""

    def __init__(self) -> None:
        self._codes: dict[str | None, int] = {}
        self._order = _CodeOrder({})

    def code(self, value: str | None) -> int:
        """The value's code, numbered now if it is new."""
        return self._codes.setdefault(value, len(self._codes))

    def order(self) -> _CodeOrder:
        """The values' order, sorted again once values have been added since."""
        if len(self._order.ordered) != len(self._codes):
            self._order = _CodeOrder(self._codes)
        return self._order

    def of(self, value: str) -> int:
        return self._codes.get(value, _MISSING)


class MatchCounter:
    """A columnar copy of the broad filters' columns at one data version, and its counts.

    Counting and updating run on the event loop (a count is ~1 ms at 1,000,000 rows);
    reading the changed rows runs on a thread, one read at a time.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._version: int | None = None  # None: not read yet
        self._file: tuple[int, int] | None = None  # (device, inode) the copy was read from
        self._present: Array
        self._columns: dict[str, Array]
        self._rows: int
        # column -> (the order it was sorted by, its rows' rowids and sort keys in that
        # order), for `_in_order`; dropped whenever the copy changes.
        self._sorted: dict[str, tuple[_Order, Array, Array]]
        # "group/instant" -> every row's (code, instant), sorted: for `_count_range`.
        self._grouped: dict[str, tuple[Array, Array]]
        self._reset()
        self._codes = {column: _Codes() for column in CODED_COLUMNS}
        self._reading: asyncio.Future[int] | None = None  # the read under way, if any

    @staticmethod
    def covers(query: ApplicantQuery) -> bool:
        """Whether the copy answers this query's count: every filter is a broad one."""
        return all(FILTERS_BY_NAME[name].broad for name, _ in query.filters)

    @property
    def version(self) -> int | None:
        """The data version the copy holds, None before the first read."""
        return self._version

    @property
    def rows(self) -> int:
        """Every applicant at the copy's version."""
        return self._rows

    async def catch_up(self) -> int:
        """Bring the copy to the database's data version; returns that version.

        Callers meanwhile share the read under way (after a write, every request finds
        the copy behind): it may end a write short of what a late caller saw, who then
        reads its page again and calls again (`storage.ApplicantReader._read_page`).
        """
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read_and_write())
        reading = self._reading
        try:
            return await asyncio.shield(reading)
        finally:
            if reading.done() and self._reading is reading:
                self._reading = None

    async def _read_and_write(self) -> int:
        version, changed, whole = await asyncio.to_thread(self._read_changes)
        if whole:
            self._reset()
        if changed is not None:
            self._write(changed)
        self._version = version
        return version

    def count(self, query: ApplicantQuery, scope: Scope) -> int:
        """The number of applicants at the copy's version that match the query's filters,
        its sync position and the scope (`covers(query)` must hold).

        The common shapes, a range of one instant (date bounds, or the sync position)
        alone or within one group (an equality filter, or the token's integrations), are
        counted by binary searches in that instant's rows sorted once per data version
        (by group, then instant): O(log n). Any other combination by one comparison per
        filter over the copy: O(n), ~1 ns a row.
        """
        shape = _ranged_shape(query, scope)
        if shape is not None:
            return self._count_range(*shape)
        return int(np.count_nonzero(self._matches(query, scope)))

    def _count_range(
        self, instant: str, low: int, high: int, group: str | None, values: frozenset[str]
    ) -> int:
        """Rows whose `instant` is within [low, high], of those whose `group` column holds
        one of `values` (every row without a group)."""
        if group is None:
            keys = self._in_order(instant, _INSTANT_ORDER)[1]
            return _between(keys, low, high)
        starts, keys = self._by_group(group, instant)
        counted = 0
        for value in values:
            code = self._codes[group].of(value)
            if 0 <= code < len(starts) - 1:
                counted += _between(keys[starts[code] : starts[code + 1]], low, high)
        return counted

    def _by_group(self, group: str, instant: str) -> tuple[Array, Array]:
        """(where each code's rows start, every row's instant) with the rows sorted by
        code, then instant: once per change of the copy and (group, instant) counted,
        ~0.2 s and 8 bytes a row at 1,000,000 rows."""
        key = f"{group}/{instant}"
        cached = self._grouped.get(key)
        if cached is None:
            present = np.flatnonzero(self._present)
            codes = self._columns[group].take(present)
            instants = self._columns[instant].take(present)
            by_both = np.lexsort((instants, codes))
            codes = codes.take(by_both)
            starts = np.searchsorted(codes, np.arange(int(codes.max(initial=-1)) + 2))
            cached = self._grouped[key] = (starts, instants.take(by_both))
        return cached

    def kept_by_each(self, query: ApplicantQuery, scope: Scope) -> dict[str, int]:
        """For each column the query tests (its filters', the scope's `integration_id`,
        the sync position's `change_seq`), the rows its conditions alone keep: the one
        keeping fewest has the index to collect the matches through."""
        masks: dict[str, Array] = {}

        def narrow(column: str, mask: Array) -> None:
            masks[column] = masks[column] & mask if column in masks else mask

        for name, value in query.filters:
            spec = FILTERS_BY_NAME[name]
            narrow(spec.column, self._present & self._filter_mask(spec.column, name, value))
        if query.changed_since is not None:
            narrow(
                "change_seq", self._present & (self._columns["change_seq"] > query.changed_since)
            )
        if scope is not None:
            narrow("integration_id", self._present & self._any_of("integration_id", scope))
        return {column: int(np.count_nonzero(mask)) for column, mask in masks.items()}

    def seek(
        self, query: ApplicantQuery, scope: Scope, order: tuple[SortKey, ...], wanted: int
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
        matches = self._matches(query, scope)
        found = int(np.count_nonzero(matches))
        ranges: list[tuple[str, KeyValue, KeyValue]] = []
        stepped: int | None = None
        within, count = matches, found
        candidates = np.flatnonzero(matches) if found <= _CANDIDATES_MOST else None
        for number, key in enumerate(order):
            if key.field not in COLUMNS or not count:
                break
            order_of = self._order_of(key.field)
            first = self._first_in_order(key, order_of, within, count, wanted)
            if first is None:
                first = self._first_gathered(key, order_of, within, wanted)
            low, high, level_stepped = first
            ranges.append((key.field, order_of.value(low), order_of.value(high)))
            if stepped is None:
                stepped = level_stepped
            following = order[number + 1].field if number + 1 < len(order) else None
            if low != high or following not in COLUMNS:
                candidates = self._matches_between(key.field, order_of, within, count, low, high)
                break
            within = within & (self._columns[key.field] == order_of.stored(low))
            count = int(np.count_nonzero(within))
        return Seek(found, tuple(ranges), stepped, candidates)

    def _matches_between(
        self, column: str, order_of: _Order, within: Array, count: int, low: int, high: int
    ) -> Array | None:
        """The rowids of the `count` matches (`within`) whose key in `column`'s order is
        within [low, high], when there are at most `_CANDIDATES_MOST` of them: from the
        matches when they are that few, else from the rows in that range of the order."""
        if count <= _CANDIDATES_MOST:
            matched = np.flatnonzero(within)
            keys_of = order_of.keys(self._columns[column].take(matched))
            return matched[(keys_of >= low) & (keys_of <= high)]
        rowids, keys = self._in_order(column, order_of)
        start = np.searchsorted(keys, keys.dtype.type(low), "left")
        end = np.searchsorted(keys, keys.dtype.type(high), "right")
        if end - start > _CANDIDATES_LOOKED_AT:
            return None
        in_range = rowids[start:end]
        kept = within[in_range]
        if np.count_nonzero(kept) > _CANDIDATES_MOST:
            return None
        return in_range[kept]

    def _first_in_order(
        self, key: SortKey, order_of: _Order, within: Array, count: int, wanted: int
    ) -> tuple[int, int, int] | None:
        """(low, high, stepped) of the first `wanted` matches in `key`'s order, found by
        stepping through the rows in that order (`_in_order`) in growing chunks: when
        matches are many, they are met within a few times wanted * rows / matches rows,
        where gathering every match's key costs a pass over all of them (~10 ms at
        1,000,000 rows half of which match). None when the first chunks hold too few of
        them (matches bunched late in the order): gathered instead."""
        rowids, keys = self._in_order(key.field, order_of)
        rows = len(rowids)
        take = min(wanted, count)
        budget = min(rows, max(_STEP_FIRST, _STEP_SPREAD * take * rows // count))
        reached, hits = 0, np.empty(0, np.int64)
        size = _STEP_FIRST
        while len(hits) < take and reached < budget:
            span = np.arange(reached, min(rows, reached + size))
            positions = span if key.direction == "asc" else rows - 1 - span
            hits = np.concatenate((hits, positions[within[rowids[positions]]]))
            reached, size = reached + len(span), size * 2
        if len(hits) < take:
            return None
        hits = hits[:take]
        first, last = keys[hits[0]], keys[hits[-1]]
        low, high = (first, last) if key.direction == "asc" else (last, first)
        # Rows in [low, high] before the last key's group, then that group's share: ties
        # follow the id, which no filter follows, so its matches are spread evenly in it.
        group = np.searchsorted(keys, last, "left"), np.searchsorted(keys, last, "right")
        whole = int(np.searchsorted(keys, high, "right") - np.searchsorted(keys, low, "left"))
        tied = int(group[1] - group[0])
        tied_matches = int(np.count_nonzero(within[rowids[group[0] : group[1]]]))
        needed = take - int(np.count_nonzero(keys[hits] != last))
        stepped = whole - tied + -(-needed * tied // max(tied_matches, 1))
        return int(low), int(high), stepped

    def _first_gathered(
        self, key: SortKey, order_of: _Order, within: Array, wanted: int
    ) -> tuple[int, int, int]:
        """(low, high, stepped) of the first `wanted` matches in `key`'s order, from
        every match's key: for few matches, or matches the order meets late."""
        # Gathered by position: a boolean mask branches on every row (~8x slower).
        keys = order_of.keys(self._columns[key.field].take(np.flatnonzero(within)))
        take = min(wanted, len(keys))
        if key.direction == "asc":
            low, high = keys.min(), np.partition(keys, take - 1)[take - 1]
        else:
            low, high = np.partition(keys, len(keys) - take)[len(keys) - take], keys.max()
        stepped = self._stepped(key, order_of, keys, int(low), int(high), take)
        return int(low), int(high), stepped

    def _stepped(
        self, key: SortKey, order_of: _Order, keys: Array, low: int, high: int, take: int
    ) -> int:
        """The rows a walk of `key`'s order confined to [low, high] steps over to reach
        its `take`-th match: every row before the last value it reaches, then as many of
        that value's rows as its share of matches needs (ties follow the id, which no
        filter follows)."""
        last = high if key.direction == "asc" else low
        whole = self._rows_between(key.field, order_of, low, high)
        tied = self._rows_between(key.field, order_of, last, last)
        tied_matches = int(np.count_nonzero(keys == keys.dtype.type(last)))
        if key.direction == "asc":
            matches_before = int(np.count_nonzero(keys < keys.dtype.type(last)))
        else:
            matches_before = int(np.count_nonzero(keys > keys.dtype.type(last)))
        needed = take - matches_before
        return whole - tied + -(-needed * tied // max(tied_matches, 1))

    def _order_of(self, column: str) -> _Order:
        """How `column` sorts: by the instant itself, or by its code's rank among the
        column's values (SQLite's BINARY order of text is code-point order, as Python's),
        taken once for a whole plan, so values read meanwhile cannot shift it."""
        if column in self._codes:
            return self._codes[column].order()
        return _INSTANT_ORDER

    def _rows_between(self, column: str, order_of: _Order, low: int, high: int) -> int:
        """Rows whose key in `column`'s order is within [low, high]: two binary searches
        in the rows' keys, sorted once per change of the copy (and of the ranks)."""
        keys = self._in_order(column, order_of)[1]
        # In the keys' own type: another would have numpy convert the whole array first.
        low, high = keys.dtype.type(low), keys.dtype.type(high)
        return int(np.searchsorted(keys, high, "right") - np.searchsorted(keys, low, "left"))

    def _in_order(self, column: str, order_of: _Order) -> tuple[Array, Array]:
        """(rowids, their keys) of every row in `column`'s order: sorted once per change
        of the copy (and of the ranks), ~0.1 s at 1,000,000 rows."""
        cached = self._sorted.get(column)
        if cached is None or cached[0] is not order_of:
            present = np.flatnonzero(self._present)
            keys = order_of.keys(self._columns[column].take(present))
            by_key = np.argsort(keys, kind="stable")
            # Rowids in 32 bits where they fit: half the memory, for every lead column.
            rowid_type = np.int32 if len(self._present) < 2**31 else np.int64
            cached = (order_of, present.take(by_key).astype(rowid_type), keys.take(by_key))
            self._sorted[column] = cached
        return cached[1], cached[2]

    def _matches(self, query: ApplicantQuery, scope: Scope) -> Array:
        matches = self._present.copy()
        for name, value in query.filters:
            matches &= self._filter_mask(FILTERS_BY_NAME[name].column, name, value)
        if query.changed_since is not None:
            matches &= self._columns["change_seq"] > query.changed_since
        if scope is not None:
            matches &= self._any_of("integration_id", scope)
        return matches

    def _filter_mask(self, column: str, name: str, value: Any) -> Array:
        """The rows one broad filter keeps (rows no longer present included)."""
        values = self._columns[column]
        spec = FILTERS_BY_NAME[name]
        kept: Array
        if isinstance(spec, InstantBound):
            kept = (values >= value) if spec.name.endswith("_gte") else (values <= value)
        else:
            kept = values == self._codes[column].of(str(value))
        return kept

    def _any_of(self, column: str, values: Iterable[str]) -> Array:
        codes = self._columns[column]
        found = np.zeros(len(codes), np.bool_)
        for value in values:
            code = self._codes[column].of(value)
            if code != _MISSING:
                found |= codes == code
        return found

    def _read_changes(self) -> tuple[int, _Rows | None, bool]:
        """(data version, the rows changed since the copy's version or every row, whether
        they replace the whole copy), read in one snapshot on a connection of its own.

        A new connection each time: it costs well under a millisecond, against a change
        of at least one row, and always opens the file now at the path.
        """
        file = _identity(self._path)
        whole = self._version is None or file != self._file
        connection = sqlite3.connect(read_uri(self._path), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            connection.execute("BEGIN")  # one snapshot for the version and the rows
            (version,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
            rows: _Rows | None = None
            if whole:
                rows = self._read(connection, "", ())
            elif version != self._version:
                rows = self._read(connection, "WHERE change_seq > ?", (self._version,))
        finally:
            connection.close()
        # Replaced while it was read: which file was read is unknown, so read it whole
        # next time.
        self._file = file if _identity(self._path) == file else None
        return int(version), rows, whole

    def _read(
        self, connection: sqlite3.Connection, where: str, params: tuple[object, ...]
    ) -> _Rows:
        """The rows `where` selects, column by column, as (rowids, values).

        SQLite packs each column as fixed-width hex in one string, which numpy reads in C:
        fetching a million rows as Python tuples took 10 s, this ~1 s. Without a WHERE,
        each statement reads the smallest index holding its columns, not the table; with
        one, the change sequence's index, never the grouped column's (`+column`: SQLite
        would walk all of that index to group without sorting, 1.6 s at 100,000 rows for
        a change of one row).
        """
        rows: _Rows = {}
        packed_sql, grouped_sql = read_statements(where)
        for columns, sql in zip(_PACKED, packed_sql, strict=True):
            (packed,) = connection.execute(sql, params).fetchone()
            table = _unhex(packed).reshape(-1, 1 + len(columns))
            for number, column in enumerate(columns, 1):
                rows[column] = (table[:, 0], table[:, number])
        for column, sql in zip(CODED_COLUMNS, grouped_sql, strict=True):
            rowids: list[Array] = []
            codes: list[Array] = []
            for value, packed in connection.execute(sql, params):
                rowids.append(_unhex(packed))
                codes.append(np.full(len(rowids[-1]), self._codes[column].code(value), np.int32))
            rows[column] = (_joined(rowids, np.int64), _joined(codes, np.int32))
        return rows

    def _reset(self) -> None:
        self._sorted = {}
        self._grouped = {}
        self._present = np.zeros(0, np.bool_)
        self._columns = {column: np.zeros(0, _dtype(column)) for column in COLUMNS}
        self._rows = 0

    def _write(self, changed: _Rows) -> None:
        """Write the changed rows over their rowids (on the loop: no count sees half)."""
        rowids = changed["change_seq"][0]
        if not len(rowids):
            return
        self._reserve(int(rowids.max()) + 1)
        self._rows += int(len(rowids) - np.count_nonzero(self._present[rowids]))
        self._present[rowids] = True
        for column, (where, values) in changed.items():
            self._columns[column][where] = values
        self._sorted.clear()
        self._grouped.clear()

    def _reserve(self, size: int) -> None:
        """Room for rowids below `size`, grown by half again so appends stay amortized."""
        if size <= len(self._present):
            return
        grown = max(size, len(self._present) * 3 // 2)
        self._present = _grown(self._present, grown)
        for column in COLUMNS:
            self._columns[column] = _grown(self._columns[column], grown)


def _ranged_shape(
    query: ApplicantQuery, scope: Scope
) -> tuple[str, int, int, str | None, frozenset[str]] | None:
    """(instant, low, high, group column or None, its values) when the query is a range
    of one instant (its bounds, or the sync position on `change_seq`), alone or within
    one group: one equality filter, or the scope; None for any other combination."""
    instant: str | None = None
    low, high = -(2**63), 2**63 - 1
    group: str | None = None
    values: frozenset[str] = frozenset()
    for name, value in query.filters:
        spec = FILTERS_BY_NAME[name]
        if isinstance(spec, InstantBound):
            if instant not in (None, spec.column):
                return None
            instant = spec.column
            if spec.name.endswith("_gte"):
                low = max(low, int(value))
            else:
                high = min(high, int(value))
        elif group is None:
            group, values = spec.column, frozenset({str(value)})
        else:
            return None
    if query.changed_since is not None:
        if instant not in (None, "change_seq"):
            return None
        instant, low = "change_seq", max(low, query.changed_since + 1)
    if scope is not None:
        if group is not None:
            return None
        group, values = "integration_id", scope
    if instant is None:
        return None
    return instant, low, high, group, values


def _between(keys: Array, low: int, high: int) -> int:
    """Sorted `keys` within [low, high]: two binary searches, in the keys' own type."""
    if low > high:
        return 0
    return int(
        np.searchsorted(keys, keys.dtype.type(high), "right")
        - np.searchsorted(keys, keys.dtype.type(low), "left")
    )


def read_statements(where: str) -> tuple[list[str], list[str]]:
    """The statements that read the copy's columns (`MatchCounter._read`): the instants
    packed per row, then per coded column its rowids packed per value."""
    packed = [
        f"SELECT group_concat(printf('{_HEX * (1 + len(columns))}', "
        f"{', '.join(('rowid', *columns))}), '') FROM applicants {where}"
        for columns in _PACKED
    ]
    grouped = [
        f"SELECT {column}, group_concat(printf('{_HEX}', rowid), '') "
        f"FROM applicants {where} GROUP BY {'+' if where else ''}{column}"
        for column in CODED_COLUMNS
    ]
    return packed, grouped


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`: another when the file is replaced."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _dtype(column: str) -> type:
    return np.int32 if column in CODED_COLUMNS else np.int64


def _unhex(packed: str | None) -> Array:
    """The integers of `_HEX` digits run together (None: no rows)."""
    return np.frombuffer(bytes.fromhex(packed or ""), ">i8").astype(np.int64)


def _joined(parts: list[Array], dtype: type) -> Array:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _grown(array: Array, size: int) -> Array:
    grown = np.zeros(size, array.dtype)
    grown[: len(array)] = array
    return grown
