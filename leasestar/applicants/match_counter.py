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
from collections.abc import Iterable
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
# The instants read together (one index of schema.sql holds these three), and apart.
_PACKED: Final = (("created_at", "updated_at", "last_seen"), ("change_seq",))
_HEX: Final = "%016x"  # a 64-bit integer (two's complement) as 16 hex digits
_MISSING: Final = -1  # the code of a value no row holds

# A broad filter the copy cannot answer would silently be counted wrong: fail at import.
for _spec in FILTERS:
    if _spec.broad and _spec.column not in COLUMNS:
        raise RuntimeError(f"broad filter {_spec.name} tests {_spec.column}, not in COLUMNS")


# Rows read from the database: column -> (rowids, values), codes already assigned.
_Rows = dict[str, tuple[Array, Array]]


class _Codes:
    """Each distinct value of a text column numbered as first seen."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def code(self, value: str) -> int:
        """The value's code, numbered now if it is new."""
        return self._codes.setdefault(value, len(self._codes))

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

    def rows_stepped(
        self, query: ApplicantQuery, scope: Scope, lead: SortKey, wanted: int
    ) -> int | None:
        """The rows a walk of `lead`'s order steps over from its start to reach the
        `wanted`-th match (every row when fewer match); None unless the copy holds `lead`.

        Counted, not estimated from the number of matches: dates are not spread evenly
        through another date's order (a record is updated after it is created).
        """
        if lead.field not in INSTANT_COLUMNS:
            return None
        column = self._columns[lead.field]
        values = column[self._matches(query, scope)]
        if len(values) < wanted:
            return self._rows
        if lead.direction == "desc":
            last = np.partition(values, len(values) - wanted)[len(values) - wanted]
            stepped = np.count_nonzero(self._present & (column >= last))
        else:
            last = np.partition(values, wanted - 1)[wanted - 1]
            stepped = np.count_nonzero(self._present & (column <= last))
        return int(stepped)

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
        each statement reads the smallest index holding its columns, not the table.
        """
        rows: _Rows = {}
        for columns in _PACKED:
            fields = ", ".join(("rowid", *columns))
            (packed,) = connection.execute(
                f"SELECT group_concat(printf('{_HEX * (1 + len(columns))}', {fields}), '') "
                f"FROM applicants {where}",
                params,
            ).fetchone()
            table = _unhex(packed).reshape(-1, 1 + len(columns))
            for number, column in enumerate(columns, 1):
                rows[column] = (table[:, 0], table[:, number])
        for column in CODED_COLUMNS:
            rowids: list[Array] = []
            codes: list[Array] = []
            for value, packed in connection.execute(
                f"SELECT {column}, group_concat(printf('{_HEX}', rowid), '') "
                f"FROM applicants {where} GROUP BY {column}",
                params,
            ):
                rowids.append(_unhex(packed))
                codes.append(np.full(len(rowids[-1]), self._codes[column].code(value), np.int32))
            rows[column] = (_joined(rowids, np.int64), _joined(codes, np.int32))
        return rows

    def _reset(self) -> None:
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


def _unhex(packed: str | None) -> Array:
    """The integers of `_HEX` digits run together (None: no rows)."""
    return np.frombuffer(bytes.fromhex(packed or ""), ">i8").astype(np.int64)


def _joined(parts: list[Array], dtype: type) -> Array:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _grown(array: Array, size: int) -> Array:
    grown = np.zeros(size, array.dtype)
    grown[: len(array)] = array
    return grown
