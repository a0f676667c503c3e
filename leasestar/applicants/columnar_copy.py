"""The columnar copy of the broad filters' columns, following the database's data version.

Each process keeps a copy of what the broad filters test and the orders seek, column
by column and indexed by rowid (`COLUMNS`: four 8-byte instants, eleven 4-byte codes and
a presence flag, 77 bytes a row): `match_counter.MatchCounter` counts and seeks over
it, where SQLite would step over every matching index entry or read every matching row
(docs/list-planning.md, "Exact totals from a columnar copy").

It follows the data version: every write gives each row it touches a change sequence
above every earlier one, so the rows with `change_seq` above the copy's version are
exactly what changed since; they are read in one snapshot and written over their rowids
(the writer updates a row in place, a replica copies the primary's rowid, and records
are never deleted). A database file replaced under the path (a replica's first copy) is
read again whole.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from leasestar.applicants.resource import APPLICANTS
from leasestar.database import BUSY_TIMEOUT_MS, read_uri

Array = npt.NDArray[Any]
KeyValue = int | str | None  # None: SQL NULL, in a nullable coded column

# The columns copied (`resource.APPLICANTS`): instants and sequences as they are, text
# columns as codes (each distinct value numbered as first seen), those kept for orders
# alone so that the copy can find where a page's matches lie in them (docs/list-planning.md,
# "Seeking to where the matches are"). NULL is the code that sorts first, as in SQLite.
INSTANT_COLUMNS: Final = APPLICANTS.copy_instants
CODED_COLUMNS: Final = APPLICANTS.copy_codes
COLUMNS: Final = APPLICANTS.copy_columns
# The instants read together (one index of schema.sql holds them), and apart.
_PACKED: Final = APPLICANTS.copy_instant_groups
_HEX: Final = "%016x"  # a 64-bit integer (two's complement) as 16 hex digits
MISSING: Final = -1  # the code of a value no row holds

# Rows read from the database: column -> (rowids, values), codes already assigned.
Rows = dict[str, tuple[Array, Array]]


class Order:
    """A column's sort keys: its values as they are (instants)."""

    def keys(self, values: Array) -> Array:
        return values

    def value(self, key: Any) -> KeyValue:
        return int(key)

    def stored(self, key: Any) -> Any:
        """What the copy holds for a sort key."""
        return key


INSTANT_ORDER: Final = Order()


class CodeOrder(Order):
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


class Codes:
    """Each distinct value of a text column numbered as first seen."""

    def __init__(self) -> None:
        self._codes: dict[str | None, int] = {}
        self._order = CodeOrder({})

    def code(self, value: str | None) -> int:
        """The value's code, numbered now if it is new."""
        return self._codes.setdefault(value, len(self._codes))

    def order(self) -> CodeOrder:
        """The values' order, sorted again once values have been added since."""
        if len(self._order.ordered) != len(self._codes):
            self._order = CodeOrder(self._codes)
        return self._order

    def of(self, value: str) -> int:
        return self._codes.get(value, MISSING)


class ColumnarCopy:
    """The broad filters' columns of every applicant at one data version, by rowid.

    Updating runs on the event loop (no reader of the copy sees half a write); reading
    the changed rows runs on a thread, one read at a time. What a subclass derives from
    the copy it drops in `_changed`.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._version: int | None = None  # None: not read yet
        self._file: tuple[int, int] | None = None  # (device, inode) the copy was read from
        self._present: Array
        self._columns: dict[str, Array]
        self._rows: int
        self._reset()
        self._codes = {column: Codes() for column in CODED_COLUMNS}
        self._reading: asyncio.Future[int] | None = None  # the read under way, if any

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

    def _read_changes(self) -> tuple[int, Rows | None, bool]:
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
            rows: Rows | None = None
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

    def _read(self, connection: sqlite3.Connection, where: str, params: tuple[object, ...]) -> Rows:
        """The rows `where` selects, column by column, as (rowids, values).

        SQLite packs each column as fixed-width hex in one string, which numpy reads in C
        rather than a tuple per row. Without a WHERE, each statement reads the smallest
        index holding its columns; with one, the change sequence's index, never the
        grouped column's (`+column`). Figures: docs/list-planning.md, "Exact totals from a
        columnar copy".
        """
        rows: Rows = {}
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
        self._present = np.zeros(0, np.bool_)
        self._columns = {column: np.zeros(0, _dtype(column)) for column in COLUMNS}
        self._rows = 0
        self._changed()

    def _write(self, changed: Rows) -> None:
        """Write the changed rows over their rowids (on the loop: no count sees half)."""
        rowids = changed["change_seq"][0]
        if not len(rowids):
            return
        self._reserve(int(rowids.max()) + 1)
        self._rows += int(len(rowids) - np.count_nonzero(self._present[rowids]))
        self._present[rowids] = True
        for column, (where, values) in changed.items():
            self._columns[column][where] = values
        self._changed()

    def _reserve(self, size: int) -> None:
        """Room for rowids below `size`, grown by half again so appends stay amortized."""
        if size <= len(self._present):
            return
        grown = max(size, len(self._present) * 3 // 2)
        self._present = _grown(self._present, grown)
        for column in COLUMNS:
            self._columns[column] = _grown(self._columns[column], grown)

    def _changed(self) -> None:
        """The copy changed (read again whole, or rows written): what was derived from it
        is stale."""


def read_statements(where: str) -> tuple[list[str], list[str]]:
    """The statements that read the copy's columns (`ColumnarCopy._read`): the instants
    packed per row, then per coded column its rowids packed per value."""
    packed = [
        f"SELECT group_concat(printf('{_HEX * (1 + len(columns))}', "
        f"{', '.join(('rowid', *columns))}), '') FROM {APPLICANTS.table} {where}"
        for columns in _PACKED
    ]
    grouped = [
        f"SELECT {column}, group_concat(printf('{_HEX}', rowid), '') "
        f"FROM {APPLICANTS.table} {where} GROUP BY {'+' if where else ''}{column}"
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
