"""The columnar copy's columns read from SQLite (`columnar_copy.py` keeps the copy): every
row, a column at a time, for a build (`CopyReading.built_whole`, or `built` from a file
and the rows changed since it), or the rows changed since a version (`read`).

SQLite packs each column as fixed-width hex in one string, which numpy reads in C rather
than a tuple per row (docs/list-planning.md, "Exact totals from a columnar copy").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import numpy as np

from leasestar.applicants import copy_file
from leasestar.applicants.copy_columns import (
    CODED_COLUMNS,
    COLUMNS,
    Array,
    Codes,
    dtype_of,
    grown,
)
from leasestar.applicants.resource import APPLICANTS
from leasestar.database import BUSY_TIMEOUT_MS, read_uri

# The instants read together (one index of schema.sql holds them), and apart.
_PACKED: Final = APPLICANTS.copy_instant_groups
# The group the change sequence is in first: every row has one, so reading it marks the
# rows present before any other column is asked for.
_PACKED_FIRST: Final = sorted(_PACKED, key=lambda group: "change_seq" not in group)
_HEX: Final = "%016x"  # a 64-bit integer (two's complement) as 16 hex digits
# A rowid below 2^32 as 8 hex digits: what a whole build reads each value's rowids as,
# when every rowid is. Half the text of `_HEX`: the rowids of the value most rows hold
# (middle_name's NULL, 55 %) were one string of 88 MB at ten million rows, in SQLite and
# again in Python, and made the build's peak.
_ROWID_HEX: Final = "%08x"
# Rows a whole build reads in one statement (`_packed_whole`): ~100 MB of text for four
# columns.
_CHUNK_ROWS: Final = 1 << 20
# Rowids a built copy leaves room for beyond the largest (at least, and a share of the
# rows): appended rows are then written into the mapped file's pages, not a new array.
_ROOM_LEAST: Final = 4096
_ROOM_SHARE: Final = 8
# Rows read from the database: column -> (rowids, values), codes already assigned.
Rows = dict[str, tuple[Array, Array]]
# A copy made for its file (`CopyReading.built`): what `copy_file.write` takes.
Built = tuple[copy_file.Identity, Array, Iterator[tuple[str, Array]], dict[str, list[str | None]]]


class CopyReading:
    """Reads the copy's columns from the database at `path`, on a connection of its own
    each time. `stop_if_closing` is called between steps (it raises to stop a build);
    `on_step` is told a whole build's progress, which /health reports."""

    def __init__(
        self, path: Path, stop_if_closing: Callable[[], None], on_step: Callable[[str], None]
    ) -> None:
        self._path = path
        self._stop_if_closing = stop_if_closing
        self._on_step = on_step

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(read_uri(self._path), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)

    def built(self, base: copy_file.Mapped | None = None) -> Built:
        """(identity, presence, the columns one by one, their code tables as they are
        numbered) at the database's version, read in one snapshot: `base` (a file mapped
        afresh) with the rows changed since it, or every row (`built_whole`). Codes are
        numbered in the values' sorted order."""
        if base is None:
            return self.built_whole()
        connection = self.connect()
        try:
            connection.execute("BEGIN")
            identity = copy_file.identity_of(connection, self._path)
            tables = base.description.codes
            codes = {column: Codes.numbered(tables[column]) for column in CODED_COLUMNS}
            since = (base.description.identity.change_seq,)
            rows = self.read(connection, "WHERE change_seq > ?", since, codes)
        finally:
            connection.close()
        rowids = rows["change_seq"][0]
        present = base.present
        size = int(rowids.max(initial=-1)) + 1
        if size > len(present):
            present = grown(present, size + max(_ROOM_LEAST, len(rowids) // _ROOM_SHARE))
        present[rowids] = True
        numbered: dict[str, list[str | None]] = {}

        def columns() -> Iterator[tuple[str, Array]]:
            for column in COLUMNS:
                where, values = rows.pop(column)
                held = base.columns[column]
                if len(held) != len(present):
                    held = grown(held, len(present))
                held[where] = values
                if column in codes:
                    held = _renumbered(column, codes[column], held, numbered)
                yield column, held

        return identity, present, columns(), numbered

    def built_whole(self) -> Built:
        """(As `built`) every row, a column at a time, each held by rowid as it is read:
        the build holds the presence flags and a column or three (and the order of the
        one being written), never every column's rows at once (~3 GB estimated at ten million
        applicants). The columns are read when `copy_file.write` asks for them, in the
        snapshot the presence flags were read in; the connection closes with the last."""
        connection = self.connect()
        try:
            connection.execute("BEGIN")
            identity = copy_file.identity_of(connection, self._path)
            (top,) = connection.execute(
                f"SELECT coalesce(max(rowid), 0) FROM {APPLICANTS.table}"
            ).fetchone()
            # Records are never deleted: the rows are about the largest rowid.
            present = np.zeros(top + 1 + max(_ROOM_LEAST, top // _ROOM_SHARE), np.bool_)
            first, *others = _PACKED_FIRST
            steps = len(_PACKED) + len(CODED_COLUMNS)
            self._reading_step(0, steps, None)
            read_first = self._packed_whole(connection, first, len(present), present)
        except BaseException:
            connection.close()
            raise
        rows = int(np.count_nonzero(present))
        numbered: dict[str, list[str | None]] = {}
        narrow = top < 2**32
        _, grouped_sql = read_statements("", narrow_rowids=narrow)

        def columns() -> Iterator[tuple[str, Array]]:
            try:
                yield from _handed_over(read_first)
                for step, group in enumerate(others, 1):
                    self._reading_step(step, steps, rows)
                    # A column at a time, each read by its own pass: a group's columns
                    # held together while the first is sorted were 240 MB at ten million
                    # rows, a pass more ~5 s.
                    for column in group:
                        read = self._packed_whole(connection, (column,), len(present))
                        yield from _handed_over(read)
                for step, (column, sql) in enumerate(
                    zip(CODED_COLUMNS, grouped_sql, strict=True), 1
                ):
                    self._reading_step(len(_PACKED) + step, steps, rows)
                    codes = Codes()
                    held = np.zeros(len(present), np.int32)
                    for value, packed in connection.execute(sql):
                        held[_unhex(packed, narrow=narrow)] = codes.code(value)
                    yield column, _renumbered(column, codes, held, numbered)
            finally:
                connection.close()

        return identity, present, columns(), numbered

    def _packed_whole(
        self,
        connection: sqlite3.Connection,
        columns: tuple[str, ...],
        size: int,
        present: Array | None = None,
    ) -> dict[str, Array]:
        """`columns` of every row, each by rowid in an array of `size` (and the rows
        marked in `present`), read from the smallest index holding them `_CHUNK_ROWS`
        rows at a time: a statement's text is 16 bytes a value, and all of ten million
        rows' at once would be gigabytes. (Each chunk's OFFSET steps over the index
        entries before it: ~4 s in all at ten million.)"""
        held: dict[str, Array] = {column: np.zeros(size, dtype_of(column)) for column in columns}
        listed = ", ".join(columns)
        sql = (
            f"SELECT group_concat(printf('{_HEX * (1 + len(columns))}', r, {listed}), '') "
            f"FROM (SELECT rowid AS r, {listed} FROM {APPLICANTS.table} LIMIT ? OFFSET ?)"
        )
        offset = 0
        while True:
            self._stop_if_closing()
            (packed,) = connection.execute(sql, (_CHUNK_ROWS, offset)).fetchone()
            table = _unhex(packed).reshape(-1, 1 + len(columns))
            rowids = table[:, 0]
            if present is not None:
                present[rowids] = True
            for number, column in enumerate(columns, 1):
                held[column][rowids] = table[:, number]
            offset += len(table)
            if len(table) < _CHUNK_ROWS:
                return held

    def read(
        self,
        connection: sqlite3.Connection,
        where: str,
        params: tuple[object, ...],
        codes: dict[str, Codes],
    ) -> Rows:
        """The rows `where` selects (the rows changed since a version), column by column,
        as (rowids, values).

        SQLite packs each column as fixed-width hex in one string, which numpy reads in C
        rather than a tuple per row; `where` makes each statement read the change
        sequence's index, never the grouped column's (`+column`). Figures:
        docs/list-planning.md, "Exact totals from a columnar copy".
        """
        rows: Rows = {}
        packed_sql, grouped_sql = read_statements(where)
        for columns, sql in zip(_PACKED, packed_sql, strict=True):
            self._stop_if_closing()
            (packed,) = connection.execute(sql, params).fetchone()
            table = _unhex(packed).reshape(-1, 1 + len(columns))
            for number, column in enumerate(columns, 1):
                rows[column] = (table[:, 0], table[:, number])
        for column, sql in zip(CODED_COLUMNS, grouped_sql, strict=True):
            self._stop_if_closing()
            rowids: list[Array] = []
            values: list[Array] = []
            for value, packed in connection.execute(sql, params):
                rowids.append(_unhex(packed))
                values.append(np.full(len(rowids[-1]), codes[column].code(value), np.int32))
            rows[column] = (_joined(rowids, np.int64), _joined(values, np.int32))
        return rows

    def _reading_step(self, step: int, steps: int, rows: int | None) -> None:
        """A whole build's progress, which /health reports (and a stop, if closing)."""
        self._stop_if_closing()
        read = f" ({rows:,} rows)" if rows is not None else ""
        self._on_step(
            f"the columnar copy is being built from the database: {step} of {steps} "
            f"column groups read{read}"
        )


def _renumbered(
    column: str, codes: Codes, held: Array, numbered: dict[str, list[str | None]]
) -> Array:
    """`held`'s codes as the values' sorted order numbers them, that order noted."""
    order = codes.order()
    numbered[column] = list(order.ordered)
    return held if order.keys_are_values else order.ranks.take(held)


def read_statements(where: str, *, narrow_rowids: bool = False) -> tuple[list[str], list[str]]:
    """The statements that read the copy's columns (`CopyReading.read`): the instants
    packed per row, then per coded column its rowids packed per value (as `_ROWID_HEX`
    if `narrow_rowids`: every rowid is below 2^32)."""
    rowid = _ROWID_HEX if narrow_rowids else _HEX
    packed = [
        f"SELECT group_concat(printf('{_HEX * (1 + len(columns))}', "
        f"{', '.join(('rowid', *columns))}), '') FROM {APPLICANTS.table} {where}"
        for columns in _PACKED
    ]
    grouped = [
        f"SELECT {column}, group_concat(printf('{rowid}', rowid), '') "
        f"FROM {APPLICANTS.table} {where} GROUP BY {'+' if where else ''}{column}"
        for column in CODED_COLUMNS
    ]
    return packed, grouped


def _handed_over(arrays: dict[str, Array]) -> Iterator[tuple[str, Array]]:
    """`arrays`' items in order, each dropped from it as it is handed over: the taker
    holds the only reference, and frees it once done with it."""
    while arrays:
        column = next(iter(arrays))
        yield column, arrays.pop(column)


def _unhex(packed: str | None, *, narrow: bool = False) -> Array:
    """The integers of `_HEX` digits (`_ROWID_HEX` if `narrow`) run together (None: no
    rows)."""
    return np.frombuffer(bytes.fromhex(packed or ""), ">u4" if narrow else ">i8").astype(np.int64)


def _joined(parts: list[Array], dtype: type) -> Array:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)
