"""Stored bodies: each applicant's JSON compressed on its own, with a dictionary trained on them.

The JSON an applicant is served as (canonical, `records.py`) took 2,026 of the 3,546
bytes the database held per applicant at 100,000 seeded ones, while the export of the
same records is 2,027 bytes each: only compressing the bodies brings the file under its
export (issue 15.4). Each body is compressed alone, so that a page of any order, a
record by id and the stream read just what they serve. Alone, 2 KB of JSON compresses
~2.3x; with a zstd dictionary trained on the records (their keys, enums and common
values) 6.5x, to ~310 bytes. Measured per 100-record page on the seeded bodies
(benchmarks/RESULTS.md, "Stored bodies"): zstd with a trained dictionary decodes a
record in ~1.7-2 us (~4 us on a loaded machine); LZ4 with a dictionary gives a smaller
ratio (5.3x) at no less cost through python-lz4 (~5 us a record); raw deflate blocks,
whose gzip answer is a concatenation, reach only 2.5x and cost more to inflate.

A stored body is one byte, the number of the dictionary, and then a zstd frame:

- 0: no dictionary. A database's first records, until there are TRAIN_AFTER of them to
  train one on; then they are compressed again with it.
- 1 to MAX_DICTIONARIES: a row of `body_dictionaries`. A dictionary is never changed or
  dropped; a write whose records compress much worse than the dictionary's own sample
  did (records of another kind) trains a new one for what it writes from then on.
- `{` (RAW): the JSON itself, as databases of schema version 2 stored it. Their records
  are served as they are and compressed when next written.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Final

import zstandard

LEVEL: Final = 3  # 6.5x with a dictionary at ~8 us a record; level 9: 7.9x at ~60 us
DICTIONARY_BYTES: Final = 64 * 1024
# Records to train the first dictionary on: 1,000 seeded bodies (2 MB) give 6.46x on
# others, 20,000 give 6.6x, in 0.2 s against 2.7 s.
TRAIN_AFTER: Final = 1_000
# A write looks at how its last WINDOW bodies compressed: at less than RETRAIN_BELOW of
# the dictionary's ratio on its own sample, they are another kind of record, and a
# dictionary trained on them takes over.
WINDOW: Final = 4_096
RETRAIN_BELOW: Final = 0.5
NO_DICTIONARY: Final = 0
RAW: Final = ord("{")
MAX_DICTIONARIES: Final = 100  # below RAW
DICTIONARIES: Final = "SELECT number, dictionary FROM body_dictionaries"
# Bodies compressed without a dictionary; and those not compressed with one (the JSON
# of a database from before is text, which sorts before every blob).
_PLAIN_ROWS: Final = "FROM applicants WHERE body >= x'00' AND body < x'01'"
_UNTRAINED_ROWS: Final = "FROM applicants WHERE body < x'01'"
# A database from before holds its records as JSON: a sample of them trains its first
# dictionary (at its first write), as many as a new database's first write would.
_RAW_SAMPLE: Final = "SELECT CAST(body AS BLOB) FROM applicants WHERE body < x'' LIMIT ?"


class UnknownDictionary(Exception):
    """A body names a dictionary this reader has not loaded (a write since it loaded)."""


def _decompressor(dictionary: bytes | None) -> Callable[[memoryview], bytes]:
    data = None if dictionary is None else zstandard.ZstdCompressionDict(dictionary)
    return zstandard.ZstdDecompressor(dict_data=data).decompress


class BodyDecoder:
    """Turns stored bodies back into the JSON served. Not thread-safe: one per thread."""

    def __init__(self, dictionaries: Iterable[tuple[int, bytes]] = ()) -> None:
        # By a stored body's first byte: a list, the cheapest lookup in the page's loop.
        self._decompress: list[Callable[[memoryview], bytes] | None] = [None] * 256
        self._decompress[NO_DICTIONARY] = _decompressor(None)
        self.add(dictionaries)

    @classmethod
    def of(cls, connection: sqlite3.Connection) -> BodyDecoder:
        """A decoder with every dictionary of the database."""
        return cls(connection.execute(DICTIONARIES))

    def add(self, dictionaries: Iterable[tuple[int, bytes]]) -> None:
        """Learn dictionaries (rows of `DICTIONARIES`)."""
        for number, dictionary in dictionaries:
            if self._decompress[number] is None:
                self._decompress[number] = _decompressor(bytes(dictionary))

    def decode(self, stored: bytes) -> bytes:
        """The JSON of one stored body."""
        kind = stored[0]
        if kind == RAW:
            return stored
        decompress = self._decompress[kind]
        if decompress is None:
            raise UnknownDictionary(kind)
        return decompress(memoryview(stored)[1:])

    def decode_joined(self, joined: bytes, lengths: str) -> bytes:
        """The JSON of stored bodies concatenated (`group_concat(body, '')`), joined with
        commas: a page's results. `lengths` are the stored bodies' byte lengths,
        comma-separated."""
        if not joined:
            return b""
        view = memoryview(joined)
        table = self._decompress
        parts: list[bytes | memoryview] = []
        append = parts.append
        start = 0
        # The one loop a page runs per record (~1 us of Python besides the ~2 us of zstd).
        for length in map(int, lengths.split(",")):
            end = start + length
            kind = joined[start]
            if kind == RAW:
                append(view[start:end])
            else:
                decompress = table[kind]
                if decompress is None:
                    raise UnknownDictionary(kind)
                append(decompress(view[start + 1 : end]))
            start = end
        return b",".join(parts)


def _train(samples: list[bytes | bytearray | memoryview]) -> tuple[bytes, float] | None:
    """A dictionary trained on `samples` and the ratio it gives them; None when zstd
    finds nothing to train on (too few or too small samples)."""
    try:
        dictionary = zstandard.train_dictionary(DICTIONARY_BYTES, list(samples), level=LEVEL)
    except zstandard.ZstdError:
        return None
    compress = _compressor(dictionary).compress
    ratio = sum(map(len, samples)) / max(sum(len(compress(body)) for body in samples), 1)
    return dictionary.as_bytes(), ratio


def _compressor(dictionary: zstandard.ZstdCompressionDict | None) -> zstandard.ZstdCompressor:
    # No checksum (SQLite checks its pages) and no dictionary id (our byte names it).
    return zstandard.ZstdCompressor(
        level=LEVEL, dict_data=dictionary, write_checksum=False, write_dict_id=False
    )


class BodyEncoder:
    """Compresses the bodies of one write transaction, training dictionaries as it goes.

    `encode` is called for each record before its row is written; it trains the first
    dictionary once the database holds TRAIN_AFTER records stored without one (and
    compresses those again), and a new one when a window of records compresses much
    worse than the dictionary's own sample did.
    """

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        latest = connection.execute(
            "SELECT number, dictionary, ratio FROM body_dictionaries ORDER BY number DESC LIMIT 1"
        ).fetchone()
        self._plain = 0  # bodies stored without one, while there is no dictionary
        self._untrainable = False  # zstd could not train on this write's records
        if latest is None:
            self._use(NO_DICTIONARY, None, 0.0)
            (self._plain,) = connection.execute(f"SELECT count(*) {_UNTRAINED_ROWS}").fetchone()
        else:
            self._use(latest[0], bytes(latest[1]), latest[2])
        self._window: list[bytes | bytearray | memoryview] = []
        self._window_stored = 0

    def _use(self, number: int, dictionary: bytes | None, ratio: float) -> None:
        data = None if dictionary is None else zstandard.ZstdCompressionDict(dictionary)
        self._number = number
        self._prefix = bytes([number])
        self._compress = _compressor(data).compress
        self._ratio = ratio

    def encode(self, body: bytes) -> bytes:
        """The stored form of `body`; the rows of earlier calls are written by now."""
        if self._number == NO_DICTIONARY and self._plain >= TRAIN_AFTER and not self._untrainable:
            self._train_first()
        stored = self._prefix + self._compress(body)
        if self._number == NO_DICTIONARY:
            self._plain += 1
            return stored
        self._window.append(body)
        self._window_stored += len(stored)
        if len(self._window) == WINDOW:
            self._check_window()
        return stored

    def _train_first(self) -> None:
        """The first dictionary, from every body compressed without one (fewer than
        TRAIN_AFTER plus one write's worth of rows), which are compressed again with it,
        and from stored JSON (of a database from before), which stays as it is."""
        decode = BodyDecoder().decode
        rows = [
            (rowid, decode(stored))
            for rowid, stored in self._db.execute(f"SELECT rowid, body {_PLAIN_ROWS}")
        ]
        raw = [row[0] for row in self._db.execute(_RAW_SAMPLE, (TRAIN_AFTER * 4,))]
        if not self._add_dictionary([body for _, body in rows] + raw):
            self._untrainable = True
            return
        self._db.executemany(
            "UPDATE applicants SET body = ? WHERE rowid = ?",
            [(self._prefix + self._compress(body), rowid) for rowid, body in rows],
        )

    def _check_window(self) -> None:
        ratio = sum(map(len, self._window)) / max(self._window_stored, 1)
        if ratio < self._ratio * RETRAIN_BELOW and self._number < MAX_DICTIONARIES:
            self._add_dictionary(self._window)
        self._window = []
        self._window_stored = 0

    def _add_dictionary(self, samples: list[bytes | bytearray | memoryview]) -> bool:
        """Train a dictionary on `samples` and use it from now on; False if none could be."""
        trained = _train(samples)
        if trained is None:
            return False
        dictionary, ratio = trained
        number = self._number + 1
        self._db.execute(
            "INSERT INTO body_dictionaries (number, dictionary, ratio) VALUES (?, ?, ?)",
            (number, dictionary, ratio),
        )
        self._use(number, dictionary, ratio)
        return True
