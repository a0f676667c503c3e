"""Exact `meta.total` for any combination of the broad filters, without SQLite counting.

SQLite counts a date range by stepping over every matching index entry (tens of ms at
1,000,000 rows), and a date range through a token's scope, or a vendor with a date
bound, by reading every matching row (hundreds of ms, seconds at 1,000,000). Each
process keeps instead a columnar copy of what the broad filters test (`COLUMNS`: the
change sequence, the three instants, and the four equality columns as small
integer codes; 45 bytes a row), indexed by rowid, and counts a combination with one
vectorized comparison per filter over it: about a nanosecond a row, ~1 ms at 1,000,000,
whatever the filters, their values, the scope and the sync position. Order statistics
kept per (column, group) would count in O(log n), but need a sorted copy per
combination of equality filter, scope and date column, each re-sorted after a write;
this one structure answers every combination and follows a write in O(rows written).

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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

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
CODED_COLUMNS: Final = ("integration_id", "integration_vendor", "property_id", "x_property_id")
COLUMNS: Final = INSTANT_COLUMNS + CODED_COLUMNS
_SELECT: Final = f"SELECT rowid, {', '.join(COLUMNS)} FROM applicants"
_BATCH: Final = 65_536  # rows decoded at a time: bounds the memory of reading a large change
_MISSING: Final = -1  # the code of a value no row holds

# A broad filter the copy cannot answer would silently be counted wrong: fail at import.
for _spec in FILTERS:
    if _spec.broad and _spec.column not in COLUMNS:
        raise RuntimeError(f"broad filter {_spec.name} tests {_spec.column}, not in COLUMNS")


@dataclass(slots=True)
class _Rows:
    """Rows read from the database, column by column (codes already assigned)."""

    rowids: Array
    columns: dict[str, Array]


class _Codes:
    """Each distinct value of a text column numbered as first seen."""

    def __init__(self) -> None:
        # defaultdict numbers a new value by the count so far, in C, in one lookup.
        self._codes: defaultdict[str, int] = defaultdict()
        self._codes.default_factory = self._codes.__len__

    def assign(self, values: Sequence[str]) -> Array:
        return np.fromiter(map(self._codes.__getitem__, values), np.int32, len(values))

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
        its sync position and the scope (`covers(query)` must hold)."""
        return int(np.count_nonzero(self._matches(query, scope)))

    def sizes(
        self, query: ApplicantQuery, scope: Scope, lead: SortKey, wanted: int
    ) -> tuple[int, int | None]:
        """(matches, rows a walk of `lead`'s order steps over from its start to reach the
        `wanted`-th match; None unless `lead` is a column of the copy), for the plan.

        The walk's length is counted, not estimated from the matches: dates are not spread
        evenly through another date's order (a record is updated after it is created).
        """
        matches = self._matches(query, scope)
        found = int(np.count_nonzero(matches))
        if lead.field not in INSTANT_COLUMNS or found < wanted:
            return found, None if lead.field not in INSTANT_COLUMNS else self._rows
        column = self._columns[lead.field]
        values = column[matches]
        if lead.direction == "desc":
            last = np.partition(values, found - wanted)[found - wanted]
            stepped = np.count_nonzero(self._present & (column >= last))
        else:
            last = np.partition(values, wanted - 1)[wanted - 1]
            stepped = np.count_nonzero(self._present & (column <= last))
        return found, int(stepped)

    def _matches(self, query: ApplicantQuery, scope: Scope) -> Array:
        matches = self._present.copy()
        for name, value in query.filters:
            spec = FILTERS_BY_NAME[name]
            column = self._columns[spec.column]
            if isinstance(spec, InstantBound):
                matches &= (column >= value) if spec.name.endswith("_gte") else (column <= value)
            else:
                matches &= column == self._codes[spec.column].of(str(value))
        if query.changed_since is not None:
            matches &= self._columns["change_seq"] > query.changed_since
        if scope is not None:
            matches &= self._any_of("integration_id", scope)
        return matches

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
            if whole:
                rows: _Rows | None = self._decode(connection.execute(_SELECT))
            elif version != self._version:
                changed = connection.execute(f"{_SELECT} WHERE change_seq > ?", (self._version,))
                rows = self._decode(changed)
            else:
                rows = None
        finally:
            connection.close()
        # Replaced while it was read: which file was read is unknown, so read it whole
        # next time.
        self._file = file if _identity(self._path) == file else None
        return int(version), rows, whole

    def _decode(self, cursor: sqlite3.Cursor) -> _Rows:
        rowids: list[Array] = []
        columns: dict[str, list[Array]] = {column: [] for column in COLUMNS}
        while batch := cursor.fetchmany(_BATCH):
            values = list(zip(*batch, strict=True))
            rowids.append(np.array(values[0], np.int64))
            for column, raw in zip(COLUMNS, values[1:], strict=True):
                if column in self._codes:
                    columns[column].append(self._codes[column].assign(raw))
                else:
                    columns[column].append(np.array(raw, np.int64))
        return _Rows(
            _joined(rowids, np.int64),
            {column: _joined(parts, _dtype(column)) for column, parts in columns.items()},
        )

    def _reset(self) -> None:
        self._present = np.zeros(0, np.bool_)
        self._columns = {column: np.zeros(0, _dtype(column)) for column in COLUMNS}
        self._rows = 0

    def _write(self, changed: _Rows) -> None:
        """Write the changed rows over their rowids (on the loop: no count sees half)."""
        if not len(changed.rowids):
            return
        self._reserve(int(changed.rowids.max()) + 1)
        self._rows += int(len(changed.rowids) - np.count_nonzero(self._present[changed.rowids]))
        self._present[changed.rowids] = True
        for column, values in changed.columns.items():
            self._columns[column][changed.rowids] = values

    def _reserve(self, size: int) -> None:
        """Room for rowids below `size`, grown by half again so appends stay amortized."""
        if size <= len(self._present):
            return
        grown = max(size, len(self._present) * 3 // 2)
        self._present = _grown(self._present, grown)
        for column in COLUMNS:
            self._columns[column] = _grown(self._columns[column], grown)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`: another when the file is replaced."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _dtype(column: str) -> type:
    return np.int32 if column in CODED_COLUMNS else np.int64


def _joined(parts: list[Array], dtype: type) -> Array:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _grown(array: Array, size: int) -> Array:
    grown = np.zeros(size, array.dtype)
    grown[: len(array)] = array
    return grown
