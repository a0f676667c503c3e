"""The columnar copy's file beside the database, `<db>-columns`: what a start maps.

Read from SQLite, the copy took ~1 s a million rows in every worker at every start, and
each worker held its own (docs/list-planning.md, "The copy beside the database"). Written
once to this file, a start maps it instead (`np.frombuffer` over a copy-on-write
`mmap`), and every worker reads the same pages of the page cache: a worker's own memory
holds only the pages it writes when it follows a change (`columnar_copy.py`).

Layout: a fixed header (`MAGIC`, `FORMAT_VERSION`, where the description lies, its
length and CRC-32), the sections, each on a page boundary: the presence flags, every
copied column by rowid, for each column its rows in key order (rowids and sorted
keys, what `match_counter` seeks in; `orders`), and for each grouping a group column's
rows by code, then instant (where each code's rows start, and their rowids: what a range
of an instant within one group is counted and listed from; `groupings`); then the
description (`Description`,
JSON: which database file and data version the copy is of, its code tables, where each
section lies and its CRC-32). Codes are numbered in the values' sorted order
(NULL first, as in SQLite), so a coded column's codes are its sort keys.

A file is written whole under a temporary name, synced, its magic written last and
synced again, then renamed over the path: a reader sees the old file or the new one, and
a file cut short or written in part has no magic or a section its CRC refuses. Any file
that fails a check is not used (`Unusable`, one line saying why): the copy is built
again from the database. A start checks the description and the presence flags; each
column, order and grouping is checked when first read (`Mapped.unchecked`,
`Mapped.unchecked_columns`), so that a start reads only what it serves.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import mmap
import os
import sqlite3
import stat
import struct
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt
from isal import isal_zlib

Array = npt.NDArray[Any]

MAGIC: Final = b"LSCOLUMN"
# 2: the groupings (before them, a worker sorted each in its own memory: 12 bytes a row,
# 120 MB at ten million, and 0.3-0.4 s of a core the first time it was counted).
FORMAT_VERSION: Final = 2
# magic, format version, where the description lies (after the sections), its length, CRC
_HEADER: Final = struct.Struct("<8sIQII")
_HEADER_BYTES: Final = 32
_ALIGN: Final = mmap.PAGESIZE
_TEMPORARY: Final = ".tmp"  # the suffix of a file being written
_RADIX_CODE_MOST: Final = 2**16 - 1
# CRC-32 by ISA-L (zlib's values at 22 GB/s against 4 on this machine: 0.87 GB of columns
# checked at a start at ten million rows in 0.04 s), 16 MiB at a time, so that a thread
# checking a file holds the GIL for at most ~1 ms at once.
_CRC_CHUNK: Final = 1 << 24


# A copy's file: (device, inode, change time in ns). The inode alone is not enough: a file
# is written under a new name and renamed over the path, and the inode of one removed is
# handed to the next file made (ext4), every other rewrite.
FileIdentity = tuple[int, int, int]


class Unusable(Exception):
    """The file cannot be trusted for this database; the message says why, in one line."""


class Section(msgspec.Struct, array_like=True, frozen=True):
    # "present", a column, "order/<column>", "keys/<column>", or a grouping's
    # "starts/<group>/<instant>" and "grouping/<group>/<instant>"
    name: str
    dtype: str
    offset: int
    count: int
    crc: int


class Identity(msgspec.Struct, array_like=True, frozen=True):
    """Which database, and which state of it, a copy is of."""

    key: str  # the database's cursor key (hex): another database has another
    device: int  # the file it was read from: a file replaced under the path is another
    inode: int
    change_seq: int  # the data version the copy holds
    # (change_seq, rowid) of the row written last at or before that version: a database
    # restored from a backup and written since has another history up to there.
    last_row: tuple[int, int] | None


class Description(msgspec.Struct, frozen=True):
    identity: Identity
    rows: int  # rows present
    codes: dict[str, list[str | None]]  # per coded column, its values in code order
    sections: list[Section]


@dataclass(frozen=True, slots=True)
class Mapped:
    """A copy as the file holds it: its arrays lie in the file's pages."""

    description: Description
    file: FileIdentity | None  # of the file mapped; None: in memory
    present: Array
    columns: dict[str, Array]
    orders: dict[str, tuple[Array, Array]]  # column -> (rowids, keys) in key order
    # "group/instant" -> (where each code's rows start, their rowids: `grouped`)
    groupings: dict[str, tuple[Array, Array]]
    # The orders' and groupings' sections (by the same keys), and each column's, their
    # CRCs checked when one is first used (`intact`): all of the file but the presence
    # flags, which a start then need not read (0.87 GB of columns alone at ten million
    # rows, ~0.9 s of a cold disk), and a worker never reads what it does not serve.
    unchecked: dict[str, tuple[Section, Section]]
    unchecked_columns: dict[str, Section]


def grouping_key(group: str, instant: str) -> str:
    return f"{group}/{instant}"


def radix_codes(codes: Array) -> Array:
    """`codes` as 16-bit numbers where they fit (as they are when they already are)."""
    if codes.max(initial=0) <= _RADIX_CODE_MOST:
        return codes.astype(np.uint16, copy=False)
    return codes


def grouped(by_instant: Array, codes: Array) -> tuple[Array, Array]:
    """(where each code's rows start, the rowids) of the rows in `by_instant` order (an
    instant's order: (instant, rowid)) by their `codes`, then that order: a stable sort of
    the codes keeps each code's rows in it. Codes up to 2^16 - 1 are sorted as 16-bit
    numbers, which numpy sorts by radix: ~15x cheaper than sorting the rows by both
    (1,000,000 rows: 0.26 s -> 0.02 s)."""
    in_order = radix_codes(codes).take(by_instant)
    by_code = np.argsort(in_order, kind="stable")
    # Each code's rows start after those of the codes before it.
    starts = np.concatenate(([0], np.cumsum(np.bincount(in_order))))
    return starts, by_instant.take(by_code)


def path_of(database: Path) -> Path:
    return database.with_name(database.name + "-columns")


def identity_of_file(database: Path) -> FileIdentity | None:
    """Which copy's file lies beside `database` now (None: none)."""
    try:
        return _file_identity(os.stat(path_of(database)))
    except OSError:
        return None


def _file_identity(status: os.stat_result) -> FileIdentity:
    return status.st_dev, status.st_ino, status.st_ctime_ns


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + "-columns.lock")


@contextlib.contextmanager
def locked(database: Path) -> Iterator[None]:
    """Held by the one process building or writing the copy's file; BlockingIOError
    while another holds it (a waiter polls, so that a server stopping stops waiting)."""
    descriptor = os.open(lock_path(database), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(descriptor)


def identity_of(connection: sqlite3.Connection, database: Path) -> Identity:
    """The identity of the database in `connection`'s open transaction."""
    status = os.stat(database)
    key, version = connection.execute("SELECT cursor_key, change_seq FROM sync_state").fetchone()
    return Identity(
        bytes(key).hex(), status.st_dev, status.st_ino, int(version), _last_row(connection, version)
    )


def _last_row(connection: sqlite3.Connection, version: int) -> tuple[int, int] | None:
    found = connection.execute(
        "SELECT change_seq, rowid FROM applicants WHERE change_seq <= ? "
        "ORDER BY change_seq DESC LIMIT 1",
        (version,),
    ).fetchone()
    return None if found is None else (int(found[0]), int(found[1]))


def check_identity(copy: Identity, connection: sqlite3.Connection, database: Path) -> None:
    """Raise `Unusable` unless the copy is of this database file, at its version or
    before it, with the same history up to there (in `connection`'s transaction)."""
    now = identity_of(connection, database)
    if copy.key != now.key:
        raise Unusable("it is of another database")
    if (copy.device, copy.inode) != (now.device, now.inode):
        raise Unusable("the database file was replaced since it was written")
    if copy.change_seq > now.change_seq:
        raise Unusable(f"it holds version {copy.change_seq}, after the database's {now.change_seq}")
    if _last_row(connection, copy.change_seq) != copy.last_row:
        raise Unusable("the database's history up to its version is not the one it copied")


def write(
    database: Path,
    identity: Identity,
    present: Array,
    columns: Iterable[tuple[str, Array]],
    codes: dict[str, list[str | None]],
    groupings: Iterable[tuple[str, str]],
) -> None:
    """Write the copy's file whole, with every column's order and the (group, instant)
    `groupings`, and rename it over the path (under `locked`: a temporary file left beside
    it is a killed writer's, removed here). `columns` is taken one at a time; `codes`
    (numbered in sorted order) is read once they all have been."""
    target = path_of(database)
    for left in target.parent.glob(f"{glob.escape(target.name)}.*{_TEMPORARY}"):
        left.unlink(missing_ok=True)
    # As the orders hold them (4 bytes a row below 2^31 rows): taken in that type, an
    # order needs no second array to convert it (80 MB at ten million rows).
    rowid_type = np.int32 if len(present) < 2**31 else np.int64
    rowids: Array = np.flatnonzero(present).astype(rowid_type)
    descriptor, temporary = tempfile.mkstemp(_TEMPORARY, target.name + ".", target.parent)
    try:
        # Readable by whoever may read the database: it holds its columns.
        os.fchmod(descriptor, stat.S_IMODE(os.stat(database).st_mode))
        with os.fdopen(descriptor, "wb") as out:
            sections: list[Section] = []
            offset = _ALIGN

            def put(name: str, array: Array) -> None:
                nonlocal offset
                array = np.ascontiguousarray(array)
                data = array.data.cast("B")  # the bytes as they are, no copy
                out.seek(offset)
                out.write(data)
                crc = _crc(data)
                sections.append(Section(name, array.dtype.str, offset, len(array), crc))
                offset = _aligned(offset + array.nbytes)

            put("present", present.astype(np.uint8))
            for column, values in columns:
                put(column, values)
                keys = values.take(rowids)
                del values  # (the build hands each column over alone: freed here)
                for name, array in _in_key_order(keys, rowids):
                    put(f"{name}/{column}", array)
                    del array  # before the next is made
                del keys
            out.flush()
            # From what was written (read back through the page cache: every column has
            # been handed over and freed), each group's codes and each instant's order
            # read once: at ten million rows 20 MB of 16-bit codes and 40 MB an order.
            written = {section.name: section for section in sections}
            orders: dict[str, Array] = {}
            group_codes: tuple[str, Array] | None = None
            for group, instant in groupings:
                if group_codes is None or group_codes[0] != group:
                    group_codes = group, radix_codes(_written(temporary, written[group]))
                if instant not in orders:
                    orders[instant] = _written(temporary, written[f"order/{instant}"])
                starts, grouped_rowids = grouped(orders[instant], group_codes[1])
                key = grouping_key(group, instant)
                put(f"starts/{key}", starts)
                put(f"grouping/{key}", grouped_rowids)
                del grouped_rowids
            del orders, group_codes
            description = msgspec.json.encode(Description(identity, len(rowids), codes, sections))
            out.seek(offset)
            out.write(description)
            out.seek(0)
            crc = _crc(memoryview(description))
            out.write(
                _HEADER.pack(bytes(len(MAGIC)), FORMAT_VERSION, offset, len(description), crc)
            )
            out.flush()
            os.fsync(out.fileno())
            out.seek(0)
            out.write(MAGIC)  # last: a file without it was never finished
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
        _sync_directory(target.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _in_key_order(keys: Array, rowids: Array) -> Iterator[tuple[str, Array]]:
    """("order", the rowids in (key, rowid) order), then ("keys", their keys), from the
    rows' `keys` (sorted where they are) and their ascending `rowids`.

    Codes (4 bytes) and rowids below 2^32 are sorted together as one 8-byte integer a row,
    the code above: no index array, whose 8 bytes a row (and its sort's buffer) made the
    peak of a build at ten million rows; the instants as an argsort (stable: ties stay in
    rowid order)."""
    if keys.dtype.itemsize == 4 and (not len(keys) or (keys.min() >= 0 and rowids[-1] < 2**32)):
        paired = keys.astype(np.uint64)
        paired <<= np.uint64(32)
        paired |= rowids.astype(np.uint32)
        paired.sort()
        halves = paired.view(np.uint32).reshape(-1, 2)  # each row's low and high half
        low, high = (0, 1) if sys.byteorder == "little" else (1, 0)
        yield "order", halves[:, low].astype(rowids.dtype)
        yield "keys", halves[:, high].view(keys.dtype)
        return
    by_key = np.argsort(keys, kind="stable")
    yield "order", rowids.take(by_key)
    del by_key
    # The keys in key order, sorted where they are: the same values as taken through
    # `by_key`, without a third array of the column's size.
    keys.sort()
    yield "keys", keys


def _written(path: str, section: Section) -> Array:
    """A section already written to the file at `path`, read back."""
    return np.fromfile(path, section.dtype, section.count, offset=section.offset)


def load(
    database: Path, expected: Mapping[str, type], groupings: Iterable[tuple[str, str]]
) -> Mapped:
    """The copy's file mapped copy-on-write, if it holds the `expected` columns (of
    those types) and `groupings`, the CRC of its description and presence flags checked
    (the columns', orders' and groupings' are checked when first used: `Mapped.unchecked`,
    `checked`). Raises `Unusable`; OSError when it cannot be opened at all."""
    path = path_of(database)
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        status = os.fstat(descriptor)
        size = status.st_size
        if size < _HEADER_BYTES:
            raise Unusable(f"it is {size} bytes, shorter than its header")
        mapped = mmap.mmap(descriptor, 0, access=mmap.ACCESS_COPY)
    finally:
        os.close(descriptor)
    magic, version, at, length, crc = _HEADER.unpack_from(mapped, 0)
    if magic != MAGIC:
        raise Unusable("it is not a finished copy (no magic at its start)")
    if version != FORMAT_VERSION:
        raise Unusable(f"it is of format {version}, not {FORMAT_VERSION}")
    if at + length > size:
        raise Unusable(f"it is cut short ({size} of the {at + length} bytes its header records)")
    raw = mapped[at : at + length]
    if _crc(memoryview(raw)) != crc:
        raise Unusable("its description is damaged")
    try:
        description = msgspec.json.decode(raw, type=Description)
    except msgspec.MsgspecError as error:
        raise Unusable(f"its description is damaged ({error})") from None
    arrays: dict[str, Array] = {}
    sections: dict[str, Section] = {}
    view = memoryview(mapped)
    for section in description.sections:
        dtype = np.dtype(section.dtype)
        end = section.offset + section.count * dtype.itemsize
        if section.offset < _HEADER_BYTES or end > at:
            raise Unusable(f"its section {section.name} lies outside its sections")
        if section.name == "present" and _crc(view[section.offset : end]) != section.crc:
            raise Unusable(f"its section {section.name} is damaged")
        arrays[section.name] = np.frombuffer(mapped, dtype, section.count, section.offset)
        sections[section.name] = section
    keys = [grouping_key(group, instant) for group, instant in groupings]
    _check_shapes(description, arrays, expected, keys)
    columns = {column: arrays[column] for column in expected}
    parts = {c: (f"order/{c}", f"keys/{c}") for c in columns}
    parts |= {k: (f"starts/{k}", f"grouping/{k}") for k in keys}
    held = {key: (arrays[first], arrays[second]) for key, (first, second) in parts.items()}
    for first, second in held.values():
        first.flags.writeable = second.flags.writeable = False
    unchecked = {key: (sections[first], sections[second]) for key, (first, second) in parts.items()}
    file = _file_identity(status)
    present = arrays["present"].view(np.bool_)
    orders = {column: held[column] for column in columns}
    grouping_arrays = {key: held[key] for key in keys}
    unchecked_columns = {column: sections[column] for column in columns}
    return Mapped(
        description, file, present, columns, orders, grouping_arrays, unchecked, unchecked_columns
    )


def intact(held: Sequence[Array], sections: Sequence[Section]) -> bool:
    """Whether a column, a column's order or a grouping, mapped unchecked
    (`Mapped.unchecked`, `Mapped.unchecked_columns`), holds what its file's CRCs say."""
    return all(_crc(a.data.cast("B")) == s.crc for a, s in zip(held, sections, strict=True))


def failing_columns(pending: Mapping[str, tuple[Array, Section]]) -> list[str]:
    """Which columns, each given as (its array, its section) mapped unchecked, fail their
    CRC. It reads only what it is given: on the loop or a thread."""
    return [
        column for column, (array, section) in pending.items() if not intact((array,), (section,))
    ]


def checked(mapped: Mapped) -> Mapped:
    """`mapped`, every column's CRC checked (what is copied from it into another file);
    `Unusable` naming the first damaged column."""
    unchecked = mapped.unchecked_columns
    damaged = failing_columns({c: (mapped.columns[c], s) for c, s in unchecked.items()})
    if damaged:
        raise Unusable(f"its column {damaged[0]} is damaged")
    mapped.unchecked_columns.clear()
    return mapped


def _check_shapes(
    description: Description,
    arrays: dict[str, Array],
    expected: Mapping[str, type],
    groupings: list[str],
) -> None:
    """Raise `Unusable` unless the file holds exactly the expected columns, each as long
    as the presence flags, and their orders and the groupings as many rows as are
    present."""
    names = {"present", *expected, *(f"{k}/{c}" for c in expected for k in ("order", "keys"))}
    names |= {f"{k}/{g}" for g in groupings for k in ("starts", "grouping")}
    if set(arrays) != names:
        raise Unusable("it holds other columns or groupings than this version copies")
    for key in groupings:
        if len(arrays[f"grouping/{key}"]) != description.rows:
            raise Unusable(f"its grouping {key} does not hold every row")
    size = len(arrays["present"])
    for column, dtype in expected.items():
        if arrays[column].dtype != np.dtype(dtype) or len(arrays[column]) != size:
            raise Unusable(f"its column {column} is not of this version's type or length")
        if not len(arrays[f"order/{column}"]) == len(arrays[f"keys/{column}"]) == description.rows:
            raise Unusable(f"its order of {column} does not hold every row")


def _crc(data: memoryview) -> int:
    crc = 0
    for start in range(0, len(data), _CRC_CHUNK):
        crc = isal_zlib.crc32(data[start : start + _CRC_CHUNK], crc)
    return crc


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
