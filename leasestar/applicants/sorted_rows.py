"""Rows in sorted order, as the columnar copy holds them: each column's rows in (key,
rowid) order (`order/<column>`, `keys/<column>`) and each grouping's rows by code, then
instant (`copy_file.grouped`). Where a key's rows lie in them, and the rows written over
the copy since moved to where they now sort (`moved`, `regrouped`), without sorting
every row again (`columnar_copy.WRITTEN_MERGED_MOST` gives the figures). Used by
`match_counter.MatchCounter`.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from leasestar.applicants.copy_columns import Array, Order

# A range's open side.
LOWEST: Final = -(2**63)
HIGHEST: Final = 2**63 - 1


def rowid_type(present: Array) -> type:
    """Rowids in 32 bits where they fit: half the memory, for every sorted column."""
    return np.int32 if len(present) < 2**31 else np.int64


def _taken_out(rowids: Array, batches: list[Array], size: int) -> tuple[Array, Array]:
    """(the rowids of `batches`, once each and sorted; which of `rowids` they are), every
    rowid below `size` (the copy's length)."""
    written = np.unique(np.concatenate(batches))
    stale = np.zeros(size, np.bool_)
    stale[written] = True
    return written, stale.take(rowids)


def moved(
    rowids: Array, keys: Array, batches: list[Array], values: Array, order_of: Order
) -> tuple[Array, Array]:
    """`rowids` in (key, rowid) order and their `keys`, with the rows of `batches`
    (written over the copy since) taken out and put back where their `values` now sort:
    two copies of the order and a binary search a row, where sorting it again costs
    n log n (`WRITTEN_MERGED_MOST` gives the figures)."""
    written, stale = _taken_out(rowids, batches, len(values))
    rowids, keys = rowids[~stale], keys[~stale]
    now = order_of.keys(values.take(written)).astype(keys.dtype)
    by_key = np.lexsort((written, now))
    written, now = written.take(by_key), now.take(by_key)
    places = np.searchsorted(keys, now, "left")
    last = np.searchsorted(keys, now, "right")
    for at in np.flatnonzero(last > places):  # among equal keys, by rowid
        places[at] += np.searchsorted(rowids[places[at] : last[at]], written[at])
    return np.insert(rowids, places, written.astype(rowids.dtype)), np.insert(keys, places, now)


def regrouped(
    starts: Array,
    instants: Array,
    rowids: Array,
    batches: list[Array],
    groups: Array,
    values: Array,
) -> tuple[Array, Array, Array]:
    """A grouping (`MatchCounter._by_group`) with the rows of `batches` taken out and put
    back under their code (`groups`), where their instant (`values`) now sorts. Within a
    code, rows of one instant may lie in any order: only counts are taken of them."""
    written, dropped = _taken_out(rowids, batches, len(groups))
    # Each code's rows start earlier by the rows taken out of the codes before it.
    in_code = np.searchsorted(starts, np.flatnonzero(dropped), "right") - 1
    removed = np.bincount(in_code, minlength=len(starts) - 1)
    starts = starts - np.concatenate(([0], np.cumsum(removed)))
    rowids, instants = rowids[~dropped], instants[~dropped]
    codes, now = groups.take(written), values.take(written)
    if len(codes) and int(codes.max()) >= len(starts) - 1:  # a code no row held
        starts = np.concatenate((starts, np.full(int(codes.max()) + 2 - len(starts), starts[-1])))
    places = np.empty(len(written), np.int64)
    for code in np.unique(codes):
        these = codes == code
        start, end = int(starts[code]), int(starts[code + 1])
        places[these] = start + np.searchsorted(instants[start:end], now[these])
    # Where a code ends and the next begins, one place takes rows of both: by code, then
    # instant.
    by_place = np.lexsort((now, codes, places))
    places, written, now = places[by_place], written[by_place], now[by_place]
    added = np.bincount(codes, minlength=len(starts) - 1)
    starts = starts + np.concatenate(([0], np.cumsum(added)))
    rowids = np.insert(rowids, places, written.astype(rowids.dtype))
    return starts, np.insert(instants, places, now.astype(instants.dtype)), rowids


def span(keys: Array, low: int, high: int) -> slice:
    """Where sorted `keys` are within [low, high]."""
    if low > high:
        return slice(0, 0)
    start = int(np.searchsorted(keys, keys.dtype.type(low), "left"))
    return slice(start, max(start, int(np.searchsorted(keys, keys.dtype.type(high), "right"))))


def group_span(
    grouping: tuple[Array, Array | None, Array], code: int, low: int, high: int, instants: Array
) -> slice:
    """Where the rows of `code` whose instant is within [low, high] lie in a grouping
    (`MatchCounter._by_group`): a binary search in its instants, or, where it holds none
    (the file's), in the `instants` column through its rowids (a read a step: 2 x 24 at
    ten million rows, never the code's whole rows)."""
    starts, keys, rowids = grouping
    start, end = int(starts[code]), int(starts[code + 1])
    if keys is not None:
        within = span(keys[start:end], low, high)
        return slice(start + within.start, start + within.stop)
    if low > high:
        return slice(start, start)
    # An open side (a bound not given) takes the code's first or last row as it is.
    first = (
        start if low == LOWEST else bisect_through(rowids, instants, start, end, low, after=False)
    )
    last = (
        end if high == HIGHEST else bisect_through(rowids, instants, first, end, high, after=True)
    )
    return slice(first, last)


def bisect_through(
    rowids: Array, instants: Array, low: int, high: int, key: int, *, after: bool
) -> int:
    """The first place in [low, high) of `rowids` whose instant is at least `key` (after:
    above it); the instants of rowids[low:high] are sorted. (`item` reads a Python int
    without a numpy scalar between: half the cost of a step.)"""
    rowid_at, instant_of = rowids.item, instants.item
    while low < high:
        middle = (low + high) // 2
        value = instant_of(rowid_at(middle))
        if value < key or (after and value == key):
            low = middle + 1
        else:
            high = middle
    return low


def between(keys: Array, low: int, high: int) -> int:
    """Sorted `keys` within [low, high]: two binary searches, in the keys' own type."""
    if low > high:
        return 0
    return int(
        np.searchsorted(keys, keys.dtype.type(high), "right")
        - np.searchsorted(keys, keys.dtype.type(low), "left")
    )
