"""The columnar copy of the broad filters' columns, following the database's data version.

Each process serves from a copy of what the broad filters test and the orders seek,
column by column and indexed by rowid (`COLUMNS`: four 8-byte instants, eleven 4-byte
codes and a presence flag, 77 bytes a row): `match_counter.MatchCounter` counts and seeks
over it, where SQLite would step over every matching index entry or read every matching
row (docs/list-planning.md, "Exact totals from a columnar copy"). The copy lives in a
file beside the database (`copy_file.py`), which every worker maps: a start maps it
instead of reading the columns from SQLite, and the workers share its pages. The first
to find it missing, damaged or of another database builds it, under a lock the others
wait on.

It follows the data version: every write gives each row it touches a change sequence
above every earlier one, so the rows with `change_seq` above the copy's version are
exactly what changed since; they are read in one snapshot and written over their rowids
(the writer updates a row in place, a replica copies the primary's rowid, and records
are never deleted). Those rows are written into this process's pages of the file
(mapped copy-on-write), so the file itself only changes whole. A database file replaced
under the path (a replica's first copy) is opened again, its copy built again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from leasestar.allocator import release_freed_memory
from leasestar.applicants import copy_file
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
COLUMN_TYPES: Final = {
    column: np.int32 if column in CODED_COLUMNS else np.int64 for column in COLUMNS
}
# The (group, instant) pairs whose rows the file holds grouped (`copy_file.grouped`).
GROUPINGS: Final = APPLICANTS.copy_groupings
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
MISSING: Final = -1  # the code of a value no row holds
# Rowids a built copy leaves room for beyond the largest (at least, and a share of the
# rows): appended rows are then written into the mapped file's pages, not a new array.
_ROOM_LEAST: Final = 4096
_ROOM_SHARE: Final = 8
_LOCK_POLL_SECONDS: Final = 0.05  # how often a process waiting for another's build looks
_OPENINGS: Final = 3  # opens of a database file replaced under the path, at most
# The copy's file is written again once the rows written over it are a sixteenth of all
# (and at least _REWRITE_LEAST), or any have waited _REWRITE_AFTER_SECONDS: a build
# costs ~1 s of a core a million rows, so not after every write.
_REWRITE_SHARE: Final = 16
_REWRITE_LEAST: Final = 4096
_REWRITE_AFTER_SECONDS: Final = 600.0
# Rows written over a sorted order (the file's, or one sorted here) that are moved to
# where they now sort, at most; past that, the order is sorted again. Moving them costs
# two copies of the order and a search per row: at ten million rows the first list after
# a 100-row write took 247-407 ms with the rows moved, 1,374-2,738 ms sorted again.
WRITTEN_MERGED_MOST: Final = 1 << 16
logger = logging.getLogger("leasestar.columnar_copy")

# Rows read from the database: column -> (rowids, values), codes already assigned.
Rows = dict[str, tuple[Array, Array]]
# A copy made for its file (`ColumnarCopy._built`): what `copy_file.write` takes.
Built = tuple[copy_file.Identity, Array, Iterator[tuple[str, Array]], dict[str, list[str | None]]]


class Order:
    """A column's sort keys: its values as they are (instants)."""

    keys_are_values = True  # whether a column's values are its sort keys

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
        # Codes numbered in sorted order (the file's, `copy_file.py`) and none added since.
        self.keys_are_values = bool(np.array_equal(self.ranks, np.arange(len(self.ranks))))

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

    @classmethod
    def numbered(cls, values: list[str | None]) -> Codes:
        """The codes of a table that lists each value at its code."""
        codes = cls()
        codes._codes = {value: code for code, value in enumerate(values)}
        return codes


class DamagedColumn(Exception):
    """A column of the copy's file failed its CRC when first read (`_column`)."""


class Closing(Exception):
    """The server stopped while the copy was being built (nothing was written)."""


class ColumnarCopy:
    """The broad filters' columns of every applicant at one data version, by rowid.

    Opened from the file beside the database (`copy_file.py`, built there first when it
    is missing or not of this database), then brought to the database's version.
    Updating runs on the event loop (no reader of the copy sees half a write); reading
    the changed rows runs on a thread, one read at a time. What a subclass derives from
    the copy it drops in `_changed`.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._version: int | None = None  # None: not opened yet
        self._ready = False  # opened and brought to the database's version once
        self._file: tuple[int, int] | None = None  # (device, inode) of the database it is of
        self._present: Array
        self._columns: dict[str, Array]
        self._rows: int
        # Each column's rows in key order, as the file holds them, and the rowids written
        # over the copy since it was installed (in batches): an order is the file's with
        # those rows moved to where they now sort (`match_counter._in_order`), until they
        # are more than `WRITTEN_MERGED_MOST` (then every order is sorted again).
        self._orders: dict[str, tuple[Array, Array]] = {}
        # The file's groupings ("group/instant" -> (starts, rowids)), under the same rule.
        self._groupings: dict[str, tuple[Array, Array]] = {}
        self._written_since_file: list[Array] = []
        self._unchecked: dict[str, tuple[copy_file.Section, copy_file.Section]] = {}
        # The file's columns not read yet (their CRCs checked at the first read:
        # `_column`), and the file a damaged column was found in, with why (not mapped
        # again: built again from the database).
        self._unchecked_columns: dict[str, copy_file.Section] = {}
        self._damaged: tuple[copy_file.FileIdentity | None, str] | None = None
        self._reset()
        self._codes = {column: Codes() for column in CODED_COLUMNS}
        self._reading: asyncio.Future[int] | None = None  # the read under way, if any
        # The copy's file installed ((device, inode); None: kept in memory), when, and
        # the rows written over it since: when they are many, or old, it is written again
        # (`_rewrite_if_due`), and every worker maps the new one at its next change.
        self._columns_file: copy_file.FileIdentity | None = None
        self._installed_at = 0.0
        self._since_file = 0
        self._rewriting: asyncio.Task[None] | None = None
        # A file written again, being mapped and checked apart from the copy served
        # (`_remap`), then mapped and checked, to be installed with the next change; and
        # a file found unusable, not tried again.
        self._remapping: asyncio.Task[None] | None = None
        self._remapped: copy_file.Mapped | None = None
        self._refused: copy_file.FileIdentity | None = None
        self._closing = False  # a build stops at its next step (`close`)
        self.progress = "the columnar copy is being opened"  # what it is doing, until ready

    @property
    def version(self) -> int | None:
        """The data version the copy holds, None before it is opened."""
        return self._version

    @property
    def ready(self) -> bool:
        """Whether the copy has been opened and brought to the database's version: a
        request that needs it then waits for a change at most, never for the whole."""
        return self._ready

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
        if self._reading is None or self._reading.done():  # (a done one is of the past)
            self._reading = asyncio.ensure_future(self._read_and_write())
        reading = self._reading
        try:
            return await asyncio.shield(reading)
        finally:
            if reading.done() and self._reading is reading:
                self._reading = None

    async def _read_and_write(self) -> int:
        for _ in range(_OPENINGS):
            replaced = _identity(self._path) != self._file
            if self._version is None or replaced:
                if replaced:  # built again: counted by SQLite meanwhile, /health says so
                    self._ready = False
                self._install(await asyncio.to_thread(self._opened))
            elif self._remapped is not None:
                self._install(self._remapped)
            elif self._file_rewritten() and self._remapping is None:
                self._remapping = asyncio.create_task(self._remap())
            self._remapped = None
            read = await asyncio.to_thread(self._read_changes)
            self._end_if_damaged()
            if read is not None:
                break
        else:
            raise OSError(f"{self._path} was replaced each time the columnar copy opened it")
        version, changed = read
        if changed is not None:
            if self._unchecked_columns:  # written over: checked first, off the loop
                pending = {c: (self._columns[c], s) for c, s in self._unchecked_columns.items()}
                damaged = await asyncio.to_thread(_failing_crc, pending)
                self._end_if_damaged()
                self._checked(list(pending), damaged)
            self._write(changed)
            self._rewrite_if_due()
        self._version = version
        self._ready = True
        return version

    def _file_rewritten(self) -> bool:
        """Whether another copy's file was written since this one was installed (and
        was not found unusable)."""
        now = copy_file.identity_of_file(self._path)
        installed = (self._columns_file, self._refused)
        return self._columns_file is not None and now is not None and now not in installed

    async def _remap(self) -> None:
        """Map the file written again and check it on a thread, apart from the copy
        being served (requests that wait for a change do not wait for this), then
        install it with the next change (`_read_and_write`)."""
        try:
            self._remapped = await asyncio.to_thread(self._mapped)
        except (copy_file.Unusable, OSError, sqlite3.Error) as error:
            self._refused = copy_file.identity_of_file(self._path)
            logger.warning("columnar copy: the file written again is not used: %s", error)
            return
        finally:
            self._remapping = None
        # Installed now rather than at the next change. (A failure is the next one's.)
        with contextlib.suppress(sqlite3.Error, OSError, Closing, DamagedColumn):
            await self.catch_up()

    def _rewrite_if_due(self) -> None:
        """Write the copy's file again when the rows written over it since it was
        installed are a share of all (each worker's own pages, and each order it sorts
        again, grow with them) or have waited long: on a thread, by whichever process
        takes the lock first."""
        if self._rewriting is not None and not self._rewriting.done():
            return
        old = time.monotonic() - self._installed_at >= _REWRITE_AFTER_SECONDS
        if _many_since(self._since_file, self._rows) or (old and self._since_file):
            self._rewriting = asyncio.create_task(self._rewrite())

    async def _rewrite(self) -> None:
        try:
            await asyncio.to_thread(self._rewritten)
        except (sqlite3.Error, OSError) as error:
            logger.warning("columnar copy: not written again: %s", error)
        except Closing:
            return
        if self._file_rewritten() and self._remapping is None:
            # This worker's pages and orders are the file's again, shared.
            self._remapping = asyncio.create_task(self._remap())
            await self._remapping

    def _rewritten(self) -> None:
        """(On a thread.) The copy's file written again (`write_file`)."""
        self.write_file(only_if_due=False)

    def write_file(self, *, only_if_due: bool) -> bool:
        """Write the copy's file again, from the file as it is (mapped afresh, apart from
        any copy being served) and the rows changed since, or from every row when there
        is no usable file of this database; True when written. Skipped while another
        process holds its lock (it is writing it).

        `only_if_due`: only when a start would have to build it (no usable file) or the
        rows written since it are due a rewrite (`_REWRITE_SHARE`): what `import` and
        `seed` do after writing, so that the next start maps a file rather than builds
        one, while a small write leaves a large file to the servers' own schedule.
        """
        with contextlib.suppress(BlockingIOError), copy_file.locked(self._path):
            base: copy_file.Mapped | None = None
            with contextlib.suppress(copy_file.Unusable, OSError):
                base = copy_file.checked(self._mapped())  # (copied from: checked whole)
            if only_if_due and base is not None and not self._file_due(base):
                return False
            copy_file.write(self._path, *self._built(base), GROUPINGS)
            del base
            release_freed_memory()
            return True
        return False

    def _file_due(self, mapped: copy_file.Mapped) -> bool:
        """Whether the rows written since `mapped` call for writing the file again."""
        connection = self._connect()
        try:
            (since,) = connection.execute(
                f"SELECT count(*) FROM {APPLICANTS.table} WHERE change_seq > ?",
                (mapped.description.identity.change_seq,),
            ).fetchone()
        finally:
            connection.close()
        return _many_since(since, mapped.description.rows)

    def _opened(self) -> copy_file.Mapped:
        """The copy's file mapped, after building it if it is missing, unusable or not
        of this database. One process builds it (under the file's lock); the others
        wait for the lock and map what it wrote."""
        with contextlib.suppress(copy_file.Unusable, OSError):
            return self._mapped()
        while True:
            try:
                with copy_file.locked(self._path):
                    return self._mapped_or_built()
            except BlockingIOError:
                self.progress = "the columnar copy is being built by another process"
                self._stop_if_closing()
                time.sleep(_LOCK_POLL_SECONDS)
            except OSError as error:  # no lock to take (a read-only directory): built alone
                logger.warning("columnar copy: cannot lock %s (%s)", self._path, error)
                return self._built_only()

    def _mapped_or_built(self) -> copy_file.Mapped:
        """(Under the lock.) The file as another process may just have written it, else
        built now and written; kept in this process alone when it cannot be written."""
        columns_file = copy_file.path_of(self._path)
        try:
            return self._mapped()
        except FileNotFoundError:
            logger.info("columnar copy: building %s (none yet)", columns_file)
        except (copy_file.Unusable, OSError) as error:
            logger.warning("columnar copy: %s not used: %s; building it again", columns_file, error)
        try:
            copy_file.write(self._path, *self._built(), GROUPINGS)
            release_freed_memory()
        except OSError as error:
            logger.warning(
                "columnar copy: cannot write %s (%s); kept in memory", columns_file, error
            )
            return self._built_only()
        return self._mapped()

    def _built_only(self) -> copy_file.Mapped:
        """Built and kept in this process alone (no file to share it through)."""
        identity, present, columns, codes = self._built()
        return _in_memory(identity, present, dict(columns), codes)

    def _mapped(self) -> copy_file.Mapped:
        """The file mapped, if it is of this database (at its version or before)."""
        self.progress = "the columnar copy is being mapped"
        mapped = copy_file.load(self._path, COLUMN_TYPES, GROUPINGS)
        if self._damaged is not None and mapped.file == self._damaged[0]:
            raise copy_file.Unusable(self._damaged[1])
        if set(mapped.description.codes) != set(CODED_COLUMNS):
            raise copy_file.Unusable("its code tables are not of the columns this version codes")
        connection = self._connect()
        try:
            connection.execute("BEGIN")
            copy_file.check_identity(mapped.description.identity, connection, self._path)
        finally:
            connection.close()
        return mapped

    def _built(self, base: copy_file.Mapped | None = None) -> Built:
        """(identity, presence, the columns one by one, their code tables as they are
        numbered) at the database's version, read in one snapshot: `base` (a file mapped
        afresh) with the rows changed since it, or every row (`_built_whole`). Codes are
        numbered in the values' sorted order."""
        if base is None:
            return self._built_whole()
        connection = self._connect()
        try:
            connection.execute("BEGIN")
            identity = copy_file.identity_of(connection, self._path)
            tables = base.description.codes
            codes = {column: Codes.numbered(tables[column]) for column in CODED_COLUMNS}
            since = (base.description.identity.change_seq,)
            rows = self._read(connection, "WHERE change_seq > ?", since, codes)
        finally:
            connection.close()
        rowids = rows["change_seq"][0]
        present = base.present
        size = int(rowids.max(initial=-1)) + 1
        if size > len(present):
            present = _grown(present, size + max(_ROOM_LEAST, len(rowids) // _ROOM_SHARE))
        present[rowids] = True
        numbered: dict[str, list[str | None]] = {}

        def columns() -> Iterator[tuple[str, Array]]:
            for column in COLUMNS:
                where, values = rows.pop(column)
                held = base.columns[column]
                if len(held) != len(present):
                    held = _grown(held, len(present))
                held[where] = values
                if column in codes:
                    held = _renumbered(column, codes[column], held, numbered)
                yield column, held

        return identity, present, columns(), numbered

    def _built_whole(self) -> Built:
        """(As `_built`) every row, a column at a time, each held by rowid as it is read:
        the build holds the presence flags and a column or three (and the order of the
        one being written), never every column's rows at once (~3 GB estimated at ten million
        applicants). The columns are read when `copy_file.write` asks for them, in the
        snapshot the presence flags were read in; the connection closes with the last."""
        connection = self._connect()
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
        held: dict[str, Array] = {column: np.zeros(size, _dtype(column)) for column in columns}
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

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(read_uri(self._path), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)

    def _install(self, mapped: copy_file.Mapped) -> None:
        """Serve from `mapped` (on the loop: no count sees half of it)."""
        description = mapped.description
        self._present = mapped.present
        self._columns = dict(mapped.columns)
        self._rows = description.rows
        self._codes = {
            column: Codes.numbered(description.codes[column]) for column in CODED_COLUMNS
        }
        self._version = description.identity.change_seq
        self._file = (description.identity.device, description.identity.inode)
        self._changed()
        self._orders = dict(mapped.orders)
        self._groupings = dict(mapped.groupings)
        self._written_since_file = []
        self._unchecked = dict(mapped.unchecked)
        self._unchecked_columns = dict(mapped.unchecked_columns)
        self._columns_file = mapped.file
        self._installed_at = time.monotonic()
        self._since_file = 0

    def _read_changes(self) -> tuple[int, Rows | None] | None:
        """(data version, the rows changed since the copy's version), read in one
        snapshot on a connection of its own; None when the database file is no longer
        the one the copy is of (it is opened again).

        A new connection each time: it costs well under a millisecond, against a change
        of at least one row, and always opens the file now at the path.
        """
        file = _identity(self._path)
        if file != self._file:
            return None
        connection = self._connect()
        try:
            connection.execute("BEGIN")  # one snapshot for the version and the rows
            (version,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
            rows: Rows | None = None
            if version != self._version:
                where = "WHERE change_seq > ?"
                rows = self._read(connection, where, (self._version,), self._codes)
        finally:
            connection.close()
        # Replaced while it was read: which file was read is unknown.
        return (int(version), rows) if _identity(self._path) == file else None

    def _read(
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
        self.progress = (
            f"the columnar copy is being built from the database: {step} of {steps} "
            f"column groups read{read}"
        )

    def _column(self, column: str) -> Array:
        """`column` by rowid, its CRC checked when first read (on the loop: ~4 ms and
        what the disk takes at ten million rows, once); `DamagedColumn` when it fails:
        the copy is then built again from the database, and the request reading it is
        counted by SQLite meanwhile."""
        section = self._unchecked_columns.get(column)
        if section is not None:
            self._checked([column], _failing_crc({column: (self._columns[column], section)}))
        return self._columns[column]

    def _checked(self, columns: list[str], damaged: list[str]) -> None:
        """(On the loop.) `columns` checked, of which `damaged` failed: then the copy is
        no longer ready, and its file is not mapped again (`_mapped`)."""
        if damaged:
            self._damaged = (self._columns_file, f"its column {damaged[0]} is damaged")
            self._version, self._ready = None, False
            raise DamagedColumn(damaged[0])
        for column in columns:  # (one may have been checked on the loop meanwhile)
            self._unchecked_columns.pop(column, None)

    def _end_if_damaged(self) -> None:
        """(After an await of a catch-up.) A column found damaged meanwhile, by a request
        on the loop (`_checked`): this catch-up ends too, rather than make the copy of
        that file ready again; the next builds it again."""
        if self._version is None and self._damaged is not None:
            raise DamagedColumn(self._damaged[1])

    def _file_order(self, column: str) -> tuple[Array, Array] | None:
        """`column`'s order as the file holds it, its CRCs checked the first time (on the
        loop: ~15 ms at 1,000,000 rows, once); None when more rows were written over the
        copy since than are moved in an order (`WRITTEN_MERGED_MOST`), or the order is
        damaged (then sorted in this process, one line). The rows written since are
        `_written_since_file`."""
        return self._file_held(self._orders, column, f"order of {column}")

    def _file_grouping(self, group: str, instant: str) -> tuple[Array, Array] | None:
        """(starts, rowids) of the grouping as the file holds it, as `_file_order`."""
        key = copy_file.grouping_key(group, instant)
        return self._file_held(self._groupings, key, f"grouping {key}")

    def _file_held(
        self, held: dict[str, tuple[Array, Array]], key: str, what: str
    ) -> tuple[Array, Array] | None:
        found = held.get(key)
        sections = self._unchecked.pop(key, None)
        if found is not None and sections is not None and not copy_file.intact(found, sections):
            logger.warning(
                "columnar copy: %s: its %s is damaged; sorted here instead",
                copy_file.path_of(self._path),
                what,
            )
            del held[key]
            return None
        return found

    async def close(self) -> None:
        """Stop a build or a wait for another's at its next step, and wait for it."""
        self._closing = True
        for running in (self._reading, self._rewriting, self._remapping):
            if running is not None:
                await asyncio.wait([running])

    def _stop_if_closing(self) -> None:
        if self._closing:
            raise Closing("the server is stopping")

    def _reset(self) -> None:
        self._present = np.zeros(0, np.bool_)
        self._columns = {column: np.zeros(0, _dtype(column)) for column in COLUMNS}
        self._unchecked_columns = {}
        self._rows = 0
        self._changed()

    def _write(self, changed: Rows) -> None:
        """Write the changed rows over their rowids (on the loop: no count sees half).

        The file's pages are mapped copy-on-write: those written become this process's
        own, the others stay shared with every process that maps the file."""
        rowids = changed["change_seq"][0]
        if not len(rowids):
            return
        self._reserve(int(rowids.max()) + 1)
        self._rows += int(len(rowids) - np.count_nonzero(self._present[rowids]))
        self._since_file += len(rowids)
        self._present[rowids] = True
        for column, (where, values) in changed.items():
            self._columns[column][where] = values
        self._written_since_file.append(rowids)
        if sum(len(written) for written in self._written_since_file) > WRITTEN_MERGED_MOST:
            self._orders, self._groupings, self._written_since_file = {}, {}, []
        self._written(rowids)

    def _written(self, rowids: Array) -> None:
        """These rows were written over the copy: what a subclass derives from it is
        stale for them (by default, all of it: `_changed`)."""
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
        """The copy changed (opened, or rows written): what was derived from it is
        stale."""


def _renumbered(
    column: str, codes: Codes, held: Array, numbered: dict[str, list[str | None]]
) -> Array:
    """`held`'s codes as the values' sorted order numbers them, that order noted."""
    order = codes.order()
    numbered[column] = list(order.ordered)
    return held if order.keys_are_values else order.ranks.take(held)


def _many_since(written: int, rows: int) -> bool:
    """Whether `written` rows since the copy's file are enough to write it again."""
    return written >= max(_REWRITE_LEAST, rows // _REWRITE_SHARE)


def read_statements(where: str, *, narrow_rowids: bool = False) -> tuple[list[str], list[str]]:
    """The statements that read the copy's columns (`ColumnarCopy._read`): the instants
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


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`: another when the file is replaced."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _dtype(column: str) -> type:
    return COLUMN_TYPES[column]


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


def _in_memory(
    identity: copy_file.Identity,
    present: Array,
    columns: dict[str, Array],
    codes: dict[str, list[str | None]],
) -> copy_file.Mapped:
    """A built copy kept in this process (its file could not be written)."""
    rows = int(np.count_nonzero(present))
    description = copy_file.Description(identity, rows, codes, [])
    return copy_file.Mapped(description, None, present, columns, {}, {}, {}, {})


def _failing_crc(pending: dict[str, tuple[Array, copy_file.Section]]) -> list[str]:
    """(On the loop or a thread: it reads only what it is given.) Which of the columns,
    mapped unchecked, fail their CRC."""
    return [
        column
        for column, (array, section) in pending.items()
        if not copy_file.intact((array,), (section,))
    ]


def _joined(parts: list[Array], dtype: type) -> Array:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _grown(array: Array, size: int) -> Array:
    grown = np.zeros(size, array.dtype)
    grown[: len(array)] = array
    return grown
