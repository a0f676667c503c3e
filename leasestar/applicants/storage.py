"""Reading applicants: runs the statements of a page and keeps their caches.

A list page is chosen (`planner.choose`), then read (the statements of `plan.py`), then
counted, then decoded: this module executes and caches, and decides nothing. A page is
one statement whose answer is the page's stored bodies concatenated, with
their lengths: Python handles one buffer per request and decompresses each body into
the page (`bodies.py`). Every statement also
reads the data version, which keys the caches: `meta.total` per (filters, scope), the
checkpoints of deep pages and the pages asked for again (`caches.py`), each valid until
a write moves the version. How a page is planned: docs/list-planning.md.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any, Final, NamedTuple, TypeVar, cast

import msgspec

from leasestar.applicants import plan, planner
from leasestar.applicants.bodies import DICTIONARIES, BodyDecoder, UnknownDictionary
from leasestar.applicants.caches import LRU, RecentPages
from leasestar.applicants.columnar_copy import Closing, DamagedColumn
from leasestar.applicants.cursors import KeyValue, last_record, last_record_start, sort_key_values
from leasestar.applicants.fields import from_columns, project, project_record
from leasestar.applicants.match_counter import MatchCounter
from leasestar.applicants.ordering import SqlFragment, total_order
from leasestar.applicants.plan import Anchors, Start
from leasestar.applicants.planner import How, Needed, Read, ReadPlan, Scope, Sizes, Stats
from leasestar.applicants.query import ApplicantQuery
from leasestar.database import ReadPool

COUNT_CACHE_SIZE: Final = 4096
CHECKPOINT_CACHE_SIZE: Final = 64
# Choices of how a query shape is read, per copy version; a rowid read's holds up to
# planner.ROWID_READ_MOST rowids (64 KB): those are kept within a budget of bytes (a
# count of 64 made every round of the query matrix choose again, 1.7-3.5 ms at 1,000,000).
CHOICE_CACHE_SIZE: Final = 4096
ROWID_CHOICE_BYTES: Final = 16 * 1024 * 1024
_READS_THE_COPY: Final = (Needed.COPY, Needed.COPY_OR_SIZES)
# A narrowed page's last key values (`_served_from_columns`).
_key_values = msgspec.json.Decoder(list[KeyValue])
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ApplicantPage:
    """The rows of one page, already JSON, and what meta needs."""

    results_json: bytes  # the page's records joined with commas (no brackets)
    returned: int
    total: int
    last_change_seq: int | None  # change sequence of the last record (sync feed only)
    data_version: int  # the snapshot the page was read from
    # Cursor pages: whether any record follows the page in that snapshot. Under writes a
    # walk's position says nothing of what is left after its cursor, so hasMore is this.
    more: bool | None = None
    # Narrowed records (`fields=`), which need not hold the order's keys: the total-order
    # key values of the last one (None: the page is empty or its records are whole).
    last_keys: tuple[KeyValue, ...] | None = None


class _PageRows(NamedTuple):
    """What `plan.page` reads: the version, then the rows, joined."""

    version: int
    returned: int
    stored: bytes  # the rows' stored bodies, concatenated
    lengths: str  # their byte lengths, comma-separated
    sequences: str  # the rows' change sequences, comma-separated (sync feed only)
    # Records narrowed to columns: each row's total-order key values, a JSON array a line
    keys: str = ""


class SingleFlight:
    """Concurrent requests for the same slow read share one statement.

    After a write, every list shape needs its total counted again, and until the count
    is back every request of that shape would start a count of its own: all of them
    queue on the few pooled connections and the tail latency explodes. Here the first
    request runs the statement and the others await its answer.
    """

    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[Any]] = {}

    async def run(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        running = self._running.get(key)
        if running is not None:
            await asyncio.wait([running])  # never raises; our own cancellation does
            if not running.cancelled():
                return cast("T", running.result())
            # The first request failed or went away: read it ourselves.
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            result = await read()
        except BaseException:
            future.cancel()  # waiters read it themselves (and meet the error, if any)
            raise
        finally:
            if self._running.get(key) is future:
                del self._running[key]
        future.set_result(result)
        return result


class ApplicantReader:
    """Runs the statements of plans on the read pool; knows nothing of HTTP."""

    def __init__(self, pool: ReadPool, recent_pages_bytes: int = 0) -> None:
        self._pool = pool
        self._bodies = BodyDecoder()  # dictionaries loaded when a body first names one
        self._recent: RecentPages[tuple[ApplicantQuery, Scope], ApplicantPage] = RecentPages(
            recent_pages_bytes, weigh=_page_weight
        )
        # Counts of the broad filters, from a columnar copy (match_counter.py); read
        # first in the background, SQLite counting until it is there.
        self._counter = MatchCounter(pool.path)
        self._first_read: asyncio.Task[None] | None = None
        # (WHERE clause, its values) -> (data version, count)
        self._counts: LRU[tuple[str, tuple[Any, ...]], tuple[int, int]] = LRU(COUNT_CACHE_SIZE)
        # plan.checkpoint_key -> (data version, checkpoints)
        self._checkpoints: LRU[tuple[object, ...], tuple[int, Anchors]] = LRU(CHECKPOINT_CACHE_SIZE)
        self._single_flight = SingleFlight()
        # (query shape, scope, copy version) -> how its pages are read, chosen by the copy
        self._choices: LRU[tuple[object, ...], How] = LRU(CHOICE_CACHE_SIZE)
        self._rowid_choices: LRU[tuple[object, ...], How] = LRU(
            ROWID_CHOICE_BYTES, weigh=lambda how: len(how.rowids or "")
        )

    async def _row(self, statement: SqlFragment, *, on_pool: bool = False) -> Any:
        """The first row of a statement: on the loop within its budget, or on the pool."""
        fetch = self._pool.fetchall_on_pool if on_pool else self._pool.fetchall
        return (await fetch(statement.sql, statement.params))[0]

    async def data_version(self) -> int:
        """The change sequence high-water mark: moves on every write."""
        (version,) = await self._row(plan.DATA_VERSION)
        return int(version)

    async def scope_version(self, scope: Scope) -> int:
        """The version of what `scope` sees: for a scoped token, moved only by writes to
        its integrations' applicants (another tenant's writes leave it); for an unscoped
        one, the data version."""
        if scope is None:
            return await self.data_version()
        (version,) = await self._row(plan.scope_version(scope))
        return int(version)

    async def total_rows(self) -> int:
        """Every applicant in the database, counted once per data version."""
        total = self._cached_total(plan.EVERYTHING, await self.data_version())
        if total is None:
            _, total = await self._count(plan.EVERYTHING)
        return total

    async def cursor_key(self) -> bytes:
        """The database's key for signing cursors."""
        (key,) = await self._row(plan.CURSOR_KEY)
        return bytes(key)

    async def fetch_one(
        self, applicant_id: str, query: ApplicantQuery, scope: Scope
    ) -> tuple[bytes | None, int]:
        """The record's JSON (None when unknown, out of scope or outside the bounds), and
        the data version it was read at."""
        version, stored = await self._row(plan.record(applicant_id, query, scope))
        if stored is None:
            return None, int(version)
        try:  # no coroutine for the common case, a dictionary already loaded
            record = self._bodies.decode(stored)
        except UnknownDictionary:
            record = await self._decoded(lambda: self._bodies.decode(stored))
        if query.fields is not None and not from_columns(query.fields):
            record = project_record(record, query.fields)
        return record, int(version)

    async def _decoded(self, decode: Callable[[], bytes]) -> bytes:
        """`decode()`, after loading the dictionaries when a body names one not loaded."""
        try:
            return decode()
        except UnknownDictionary:
            self._bodies.add(await self._pool.fetchall(DICTIONARIES))
            return decode()

    async def fetch_page(self, query: ApplicantQuery, scope: Scope) -> ApplicantPage:
        """One page of matching records in the requested order, with the exact total."""
        asked = (query, scope)
        if not self._recent.asked_before(asked):
            return await self._fetch_page(query, scope)
        # Asked for before: kept if nothing was written since it was read.
        page = self._recent.get(asked, await self.data_version())
        if page is None:
            page = await self._fetch_page(query, scope)
            self._recent.put(asked, page.data_version, page)
        return page

    async def _fetch_page(self, query: ApplicantQuery, scope: Scope) -> ApplicantPage:
        read_plan = await self._choose(query, scope)
        how = read_plan.how
        if how.version is not None:
            page = await self._read_page(read_plan)
            if page.data_version == how.version:
                return page
            # The copy was a write behind the page: a record that write moved into the
            # page may lie outside the range. Served as if there were none.
            read_plan = ReadPlan(query, scope, how.unsought)
        version: int | None = None
        anchors: Anchors = ()
        if read_plan.uses_checkpoints:
            version, anchors = await self._anchors(read_plan)
        page = await self._read_page(read_plan, plan.start(read_plan, anchors))
        if version is not None and page.data_version != version:
            # A write landed since the checkpoints were read: their positions may have
            # moved. Serve this page by plain offset and rebuild them next time.
            self._checkpoints.drop(plan.checkpoint_key(read_plan))
            page = await self._read_page(read_plan)
        return page

    async def _choose(self, query: ApplicantQuery, scope: Scope) -> ReadPlan:
        """How the page is read (`planner.choose`), with the statistics its choice reads.

        The columnar copy's are at its version, which may be a write behind: a choice
        needs only the rough sizes, and a range found at that version is used only for
        a page read at it. Its choices are kept per query shape and copy version: a
        page asked again (the hot path) chooses nothing. Without the copy, the sizes
        come from the count cache, of any version, and are counted once when unknown.
        """
        needed = planner.stats_needed(query, scope)
        if needed in _READS_THE_COPY and await self._copy_read():
            key = (planner.shape(query), scope, self._counter.version)
            how = self._choices.get(key) or self._rowid_choices.get(key)
            if how is None:
                try:
                    read_plan = planner.choose(query, scope, self._counter)
                except DamagedColumn:  # no longer ready (built again): chosen without it
                    return await self._choose(query, scope)
                how = read_plan.how
                choices = self._rowid_choices if how.read is Read.ROWIDS else self._choices
                choices.put(key, how)
                if how.counted is not None and how.counted_at is not None:
                    # The page's total, at the copy's version: not counted a second time.
                    matches = plan.matches(query, scope)
                    self._remember_total(matches, how.counted_at, how.counted)
                return read_plan
            return ReadPlan(query, scope, how)
        stats: Stats | None = None
        if needed is Needed.COPY_OR_SIZES:
            stats = await self._sizes(query, scope)
        return planner.choose(query, scope, stats)

    async def _sizes(self, query: ApplicantQuery, scope: Scope) -> Sizes:
        where = plan.matches(query, scope)
        matches = self._latest_total(where)
        everything = self._latest_total(plan.EVERYTHING)
        if matches is None or everything is None:
            version, matches, everything = await self._row(plan.sizes(query, scope), on_pool=True)
            self._remember_total(where, version, matches)
            self._remember_total(plan.EVERYTHING, version, everything)
        return Sizes(matches, everything)

    async def _anchors(self, read_plan: ReadPlan) -> tuple[int | None, Anchors]:
        """The checkpoints of this query's filters and order (read once per data version)."""
        key = plan.checkpoint_key(read_plan)
        cached = self._checkpoints.get(key)
        if cached is not None:
            return cached
        return await self._single_flight.run(
            ("checkpoints", key), lambda: self._read_anchors(read_plan, key)
        )

    async def _read_anchors(
        self, read_plan: ReadPlan, key: tuple[object, ...]
    ) -> tuple[int | None, Anchors]:
        statement = plan.anchors(read_plan)
        # One pass over every match: on the pool, off the event loop.
        found = await self._pool.fetchall_on_pool(statement.sql, statement.params)
        if not found:
            return None, ()
        anchors: Anchors = tuple(tuple(row[1:]) for row in found)
        version = int(found[0][0])
        self._checkpoints.put(key, (version, anchors))
        return version, anchors

    async def _read_page(self, read_plan: ReadPlan, at: Start | None = None) -> ApplicantPage:
        """The page and its exact total, both at the data version the page was read at."""
        statement = plan.page(read_plan, at)
        matches = plan.matches(read_plan.query, read_plan.scope)
        rows = _PageRows(*await self._row(statement))
        total = self._cached_total(matches, rows.version)
        for _ in range(3):
            if total is not None:
                break
            # Counting may read every matching row: on the pool, once for all the
            # requests that need it. If a write landed since the page was read, read the
            # page again.
            counted_version, counted = await self._count_matches(read_plan, rows.version)
            if counted_version == rows.version:
                total = counted
                break
            rows = _PageRows(*await self._row(statement))
            total = self._cached_total(matches, rows.version)
        if total is None:
            # Writes keep landing between page and count: both in one statement.
            both = await self._row(plan.page_and_count(read_plan, at), on_pool=True)
            rows, total = _PageRows(both[0], *both[2:]), both[1]
            self._remember_total(matches, rows.version, total)
        if from_columns(read_plan.query.fields):
            return _served_from_columns(read_plan, rows, total)
        results = await self._decoded(lambda: self._bodies.decode_joined(rows.stored, rows.lengths))
        page = _served(read_plan, rows, results, total)
        return page if read_plan.query.fields is None else _projected(read_plan, page)

    async def _counts_by_copy(self, query: ApplicantQuery) -> bool:
        """Whether the columnar copy answers this query's counts."""
        return MatchCounter.covers(query) and await self._copy_read()

    async def _copy_read(self) -> bool:
        """Whether the columnar copy is ready.

        Until then (its file mapped, or built when missing: seconds a million rows), a
        request counts with SQLite rather than wait, and `/health` says why it is not
        ready (`copy_unready`). A failed open is tried again by the next request.
        """
        if not self._counter.ready:
            self._open_copy()
            return False
        return True

    def copy_unready(self) -> str | None:
        """Why the columnar copy is not ready yet (None: it is); opened again if its
        last try failed."""
        if self._counter.ready:
            return None
        self._open_copy()
        return self._counter.progress

    async def copy_ready_within(self, seconds: float) -> None:
        """Wait up to `seconds` for the copy (a small database's is ready in
        milliseconds: its server then never says it is not)."""
        self._open_copy()
        if self._first_read is not None:
            await asyncio.wait([self._first_read], timeout=seconds)

    async def _count_matches(self, read_plan: ReadPlan, version: int) -> tuple[int, int]:
        """(data version, matches of the query at that version): from the columnar
        copy, brought to `version` (the page's) if it is behind; else counted."""
        query, scope = read_plan.query, read_plan.scope
        matches = plan.matches(query, scope)
        if not await self._counts_by_copy(query):
            return await self._count(matches)
        try:
            if self._counter.version != version:
                await self._counter.catch_up()
            counted = self._counter.count(query, scope)
        except DamagedColumn:  # no longer ready (built again): counted without it
            return await self._count(matches)
        counted_version = cast("int", self._counter.version)
        self._remember_total(matches, counted_version, counted)
        return counted_version, counted

    def _open_copy(self) -> None:
        """Begin opening the columnar copy (unless it is ready, or being opened)."""
        if not self._counter.ready and (self._first_read is None or self._first_read.done()):
            self._first_read = asyncio.create_task(self._read_copy())

    async def _read_copy(self) -> None:
        try:
            try:
                await self._counter.catch_up()
            except DamagedColumn:  # found as a write was copied: now built again
                await self._counter.catch_up()
        except (sqlite3.Error, OSError) as error:
            self._counter.progress = f"the columnar copy could not be opened ({error})"
        except Closing:
            pass

    async def close(self) -> None:
        """Stop the copy's build, if one runs (at its next step), and wait for it."""
        await self._counter.close()
        if self._first_read is not None:
            await asyncio.wait([self._first_read])

    async def _count(self, where: SqlFragment) -> tuple[int, int]:
        """(data version, matches of `where` at that version), counted once at a time."""

        async def count() -> tuple[int, int]:
            version, total = await self._row(plan.count(where), on_pool=True)
            self._remember_total(where, version, total)
            return int(version), int(total)

        return await self._single_flight.run(("count", where.sql, where.params), count)

    def _cached_total(self, where: SqlFragment, version: int) -> int | None:
        """The count of `where` at this data version, if known."""
        entry = self._counts.get((where.sql, where.params))
        return entry[1] if entry is not None and entry[0] == version else None

    def _latest_total(self, where: SqlFragment) -> int | None:
        """The last count of `where` known, of whatever version: enough to choose a plan."""
        entry = self._counts.get((where.sql, where.params))
        return None if entry is None else entry[1]

    def _remember_total(self, where: SqlFragment, version: int, total: int) -> None:
        self._counts.put((where.sql, where.params), (version, total))


def _page_weight(page: ApplicantPage) -> int:
    # The records' bytes and, roughly, the page object, its key and their slot.
    return len(page.results_json) + 512


def _served(read_plan: ReadPlan, rows: _PageRows, results_json: bytes, total: int) -> ApplicantPage:
    """The page to serve: a cursor page's peeked record cut off, and its `more` known."""
    version, returned, _, _, sequences, _ = rows
    more = None
    if read_plan.query.after is not None:  # a cursor page read one record more
        more = returned > read_plan.query.limit
        if more:
            returned -= 1
            results_json = results_json[: max(last_record_start(results_json) - 1, 0)]
            sequences = sequences.rpartition(",")[0]
    last_seq = int(sequences.rpartition(",")[2]) if sequences else None
    return ApplicantPage(results_json, returned, total, last_seq, version, more)


def _served_from_columns(read_plan: ReadPlan, rows: _PageRows, total: int) -> ApplicantPage:
    """`_served` for records written from the columns (`fields.from_columns`), which
    need not hold the order's keys: those come in `rows.keys`, a JSON array a row."""
    version, returned, results, _, sequences, keys = rows
    query = read_plan.query
    more = None
    if query.after is not None:  # a cursor page read one record more
        more = returned > query.limit
        if more:
            returned -= 1
            # A record's `{"` opens it: within its flat values every `"` is escaped.
            results = results[: max(results.rfind(b',{"'), 0)]
            sequences = sequences.rpartition(",")[0]
            keys = keys.rpartition("\n")[0]
    last_seq = int(sequences.rpartition(",")[2]) if sequences else None
    last_keys = tuple(_key_values.decode(keys.rpartition("\n")[2])) if keys else None
    return ApplicantPage(results, returned, total, last_seq, version, more, last_keys)


def _projected(read_plan: ReadPlan, page: ApplicantPage) -> ApplicantPage:
    """A page of whole records narrowed to the query's fields (`fields.project`), with
    the key values of its last record, read before they are dropped."""
    query = read_plan.query
    assert query.fields is not None
    _, last = last_record(page.results_json)
    keys = None
    if last is not None:
        keys = sort_key_values(total_order(query.order_by), last, page.last_change_seq)
    narrowed = project(page.results_json, query.fields)
    return replace(page, results_json=narrowed, last_keys=keys)
