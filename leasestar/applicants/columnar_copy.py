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
under the path (a replica's first copy) is opened again, its copy built again. What the
copy holds is `copy_columns.py`; its columns are read from SQLite by `copy_reading.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Final

import numpy as np

from leasestar.allocator import release_freed_memory
from leasestar.applicants import copy_file
from leasestar.applicants.copy_columns import (
    CODED_COLUMNS,
    COLUMN_TYPES,
    COLUMNS,
    GROUPINGS,
    Array,
    Codes,
    dtype_of,
    grown,
)
from leasestar.applicants.copy_reading import CopyReading, Rows
from leasestar.applicants.resource import APPLICANTS

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
        self._source = CopyReading(path, self._stop_if_closing, self._said)
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
                damaged = await asyncio.to_thread(copy_file.failing_columns, pending)
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
            copy_file.write(self._path, *self._source.built(base), GROUPINGS)
            del base
            release_freed_memory()
            return True
        return False

    def _file_due(self, mapped: copy_file.Mapped) -> bool:
        """Whether the rows written since `mapped` call for writing the file again."""
        connection = self._source.connect()
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
            copy_file.write(self._path, *self._source.built(), GROUPINGS)
            release_freed_memory()
        except OSError as error:
            logger.warning(
                "columnar copy: cannot write %s (%s); kept in memory", columns_file, error
            )
            return self._built_only()
        return self._mapped()

    def _built_only(self) -> copy_file.Mapped:
        """Built and kept in this process alone (no file to share it through)."""
        identity, present, columns, codes = self._source.built()
        return _in_memory(identity, present, dict(columns), codes)

    def _mapped(self) -> copy_file.Mapped:
        """The file mapped, if it is of this database (at its version or before)."""
        self.progress = "the columnar copy is being mapped"
        mapped = copy_file.load(self._path, COLUMN_TYPES, GROUPINGS)
        if self._damaged is not None and mapped.file == self._damaged[0]:
            raise copy_file.Unusable(self._damaged[1])
        if set(mapped.description.codes) != set(CODED_COLUMNS):
            raise copy_file.Unusable("its code tables are not of the columns this version codes")
        connection = self._source.connect()
        try:
            connection.execute("BEGIN")
            copy_file.check_identity(mapped.description.identity, connection, self._path)
        finally:
            connection.close()
        return mapped

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
        connection = self._source.connect()
        try:
            connection.execute("BEGIN")  # one snapshot for the version and the rows
            (version,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
            rows: Rows | None = None
            if version != self._version:
                where = "WHERE change_seq > ?"
                rows = self._source.read(connection, where, (self._version,), self._codes)
        finally:
            connection.close()
        # Replaced while it was read: which file was read is unknown.
        return (int(version), rows) if _identity(self._path) == file else None

    def _column(self, column: str) -> Array:
        """`column` by rowid, its CRC checked when first read (on the loop: ~4 ms and
        what the disk takes at ten million rows, once); `DamagedColumn` when it fails:
        the copy is then built again from the database, and the request reading it is
        counted by SQLite meanwhile."""
        section = self._unchecked_columns.get(column)
        if section is not None:
            pending = {column: (self._columns[column], section)}
            self._checked([column], copy_file.failing_columns(pending))
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

    def _said(self, progress: str) -> None:
        self.progress = progress

    def _stop_if_closing(self) -> None:
        if self._closing:
            raise Closing("the server is stopping")

    def _reset(self) -> None:
        self._present = np.zeros(0, np.bool_)
        self._columns = {column: np.zeros(0, dtype_of(column)) for column in COLUMNS}
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
        larger = max(size, len(self._present) * 3 // 2)
        self._present = grown(self._present, larger)
        for column in COLUMNS:
            self._columns[column] = grown(self._columns[column], larger)

    def _changed(self) -> None:
        """The copy changed (opened, or rows written): what was derived from it is
        stale."""


def _many_since(written: int, rows: int) -> bool:
    """Whether `written` rows since the copy's file are enough to write it again."""
    return written >= max(_REWRITE_LEAST, rows // _REWRITE_SHARE)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`: another when the file is replaced."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


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
