"""A whole list as one streamed NDJSON answer, for clients that copy every record.

A client 50 ms away walking 100,000 applicants page by page waits out 400 round trips;
with `Accept: application/x-ndjson` it gets every match of the same filters, ordering
and scope in one answer, one record per line, each line exactly the bytes the JSON list
puts in `results`.

The stream reads one snapshot: one read transaction on a connection of its own (not one
of the pool's, which a long stream would take from every other request), fetched in
batches on a thread of its own. Memory stays at about one batch (and the connection's
page cache, `STREAM_CACHE_KIB`) whatever the size: the server's `send` waits while the
client's socket is full, and the next batch is read only after the last one was handed
over. In WAL mode an open reader never blocks a writer's commit; it only keeps
checkpoints from going past its snapshot until it ends, so the WAL grows by the size of
the writes made during the stream and is checkpointed after.

A sync stream (`changed_since`) is resumable: after each batch and at its end it sends
one line of its own, `{"changeSeq":N}`, meaning every record up to change sequence N has
been sent. A client cut off in the middle asks again with `changed_since=N` (the last N
it saw) and receives only what it does not hold yet.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from leasestar.applicants import plan
from leasestar.applicants.bodies import BodyDecoder
from leasestar.applicants.fields import from_columns, project_record
from leasestar.applicants.query import ApplicantQuery
from leasestar.database import BUSY_TIMEOUT_MS, read_uri
from leasestar.errors import InvalidParameter
from leasestar.openapi import NDJSON

# Rows read per fetch: ~2 MB of records, a chunk large enough that the per-chunk cost of
# the server (one `send`, one compression flush) does not show, small enough to bound memory.
STREAM_BATCH: Final = 1000
# Page cache of a stream's connection, in KiB. The rows of a list come in its order,
# which is not the order they are stored in (a random one for id), so each record is
# looked up in the table b-tree from its root: SQLite's default 2 MiB cache (125 pages
# of 16 KiB, the page size when this was measured) is smaller than the root, interior
# and index pages those lookups share (~100 pages at 1M applicants) plus the leaves
# passing through, and half of the lookups read an interior page again. 8 MiB keeps them
# cached (to some 2-3M applicants): the first 200,000 records in id order took 296,000
# reads of a page with 2 MiB, 202,500 with 8 MiB, 199,500 with 16 MiB (strace); a whole
# 1M stream, 1.0M reads instead of 1.48M and ~1 s less of the server's CPU (of ~8). 16
# MiB would spend 8 MB more of a stream's 50 MB memory budget on 1.5% fewer reads.
STREAM_CACHE_KIB: Final = 8 * 1024
# Parameters that page a list: a stream is the whole list, so they make no sense with it.
PAGING_PARAMETERS: Final = ("limit", "offset", "cursor", "wait")


def _quality(media_range: str) -> tuple[str, float]:
    """(media type, q) of one element of an Accept header."""
    media_type, _, parameters = media_range.partition(";")
    quality = 1.0
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                quality = float(value.strip())
            except ValueError:
                quality = 0.0
    return media_type.strip().lower(), quality


def wants_ndjson(accept: str | None) -> bool:
    """Whether the client prefers NDJSON: it lists `application/x-ndjson` with a
    non-zero q, at least as high as any it gives `application/json`."""
    if not accept or "ndjson" not in accept:
        return False
    qualities: dict[str, float] = {}
    for media_range in accept.split(","):
        media_type, quality = _quality(media_range)
        qualities[media_type] = max(quality, qualities.get(media_type, 0.0))
    ndjson = qualities.get(NDJSON, 0.0)
    return ndjson > 0 and ndjson >= qualities.get("application/json", 0.0)


def refuse_paging(pairs: Iterable[tuple[str, str]]) -> None:
    """A stream is the whole list: a paging parameter with it is a 400 that says so."""
    for name, value in pairs:
        if name in PAGING_PARAMETERS and value != "":
            raise InvalidParameter(
                name,
                value,
                f"{name} cannot be combined with Accept: {NDJSON}: the stream is every "
                "matching record (a sync stream resumes with changed_since)",
            )


class RecordStream:
    """The matches of a query, in its order, as NDJSON chunks from one snapshot."""

    def __init__(self, path: Path, query: ApplicantQuery, scope: frozenset[str] | None) -> None:
        statement = plan.stream(query, scope)
        self._sql, self._params = statement.sql, statement.params
        self._path = path
        self._sync_from = query.changed_since  # None: not a sync stream
        # Fields only the bodies hold, projected from each (those of columns are read
        # narrowed: `plan.stream`).
        self._projected = None if from_columns(query.fields) else query.fields

    def _open(
        self, made: list[sqlite3.Connection | sqlite3.Cursor]
    ) -> tuple[sqlite3.Cursor, BodyDecoder]:
        """The stream's snapshot: its rows and their dictionaries. The connection and the
        cursor go into `made` as soon as each exists, for `_close`."""
        connection = sqlite3.connect(
            read_uri(self._path),
            uri=True,
            timeout=BUSY_TIMEOUT_MS / 1000,
            check_same_thread=False,
            isolation_level=None,
        )
        made.append(connection)
        connection.execute("PRAGMA query_only = 1")
        connection.execute(f"PRAGMA cache_size = -{STREAM_CACHE_KIB}")
        connection.execute("BEGIN")  # one snapshot for the whole stream
        rows = connection.execute(self._sql, self._params)
        made.append(rows)
        # The dictionaries of that snapshot: every body the stream reads names one of them.
        return rows, BodyDecoder.of(connection)

    @staticmethod
    def _close(made: list[sqlite3.Connection | sqlite3.Cursor]) -> None:
        """End the snapshot, so the WAL can be checkpointed past it. The cursor first: a
        connection closed while a cursor still holds its statement stays open, its read
        transaction with it, until that cursor is freed (`sqlite3_close_v2`), and a
        generator ended by an exception may be freed only by the garbage collector."""
        for opened in reversed(made):
            opened.close()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The stream's body, a batch of lines at a time."""
        loop = asyncio.get_running_loop()
        # The stream reads on a thread of its own, ended with it, rather than on the
        # default executor's: glibc gives each thread its own heap, and memory freed there
        # stays with the thread; on the shared threads each stream left ~20 MB behind (a
        # server's RSS peak during a stream went from 21 MB over idle to 35 MB after a
        # few streams, 55 MB in one benchmark run), on its own thread it returns (19-21
        # MB at the peak of every stream, 1-4 MB after). One thread also serializes the
        # connection's use: `close` waits for a fetch still running when a client leaves.
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leasestar-stream")
        made: list[sqlite3.Connection | sqlite3.Cursor] = []
        try:
            cursor, bodies = await loop.run_in_executor(reader, self._open, made)

            def batch() -> list[tuple[bytes, int]]:
                # Decompressed (and projected) on the stream's thread, with the read.
                decode, fields = bodies.decode, self._projected
                rows = cursor.fetchmany(STREAM_BATCH)
                if fields is not None:
                    return [(project_record(decode(stored), fields), seq) for stored, seq in rows]
                return [(decode(stored), seq) for stored, seq in rows]

            position = self._sync_from
            while rows := await loop.run_in_executor(reader, batch):
                # One join, whose last empty element ends the chunk with its newline:
                # `join(...) + b"\n"` copied each batch again, and two batch-sized
                # buffers alive at once made glibc grow and trim its heap every batch
                # (290,000 page faults in a stream of 1M records, an eighth of the
                # server's CPU).
                lines = [body for body, _ in rows]
                if position is not None:
                    position = rows[-1][1]
                    lines.append(b'{"changeSeq":%d}' % position)
                lines.append(b"")
                yield b"\n".join(lines)
            if position is not None and position == self._sync_from:
                yield b'{"changeSeq":%d}\n' % position  # nothing new: say where it stands
        finally:
            # However the stream ends: sent, or the client gone (this generator closed,
            # or cancelled in the middle of a read). Handed to the stream's thread, not
            # awaited: a cancelled generator's awaits are cancelled too (an awaited close
            # could leave the queue before it ran), and the thread runs it after a fetch
            # or an `_open` still in progress, which may be what was cancelled.
            reader.submit(self._close, made)
            reader.shutdown(wait=False)
