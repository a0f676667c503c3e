"""Reading applicants: runs the statements of a plan (`plan.py`) and keeps their caches.

A page is one statement whose answer is the page's stored bodies concatenated, with
their lengths: Python handles one buffer per request and decompresses each body into
the page (`bodies.py`). Every statement also
reads the data version, which keys the caches: `meta.total` per (filters, scope) and the
checkpoints of deep pages, each valid until a write moves the version. How a page is
planned: docs/list-planning.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final, Generic, NamedTuple, TypeVar, cast

from leasestar.applicants import columnar_copy, plan
from leasestar.applicants.bodies import DICTIONARIES, BodyDecoder, UnknownDictionary
from leasestar.applicants.cursors import KeyValue, last_record_start
from leasestar.applicants.match_counter import MatchCounter
from leasestar.applicants.ordering import SqlFragment, total_order
from leasestar.applicants.plan import Anchors, ListPlan, Scope, SeekRanges, plan_list
from leasestar.applicants.query import ApplicantQuery
from leasestar.database import ReadPool

COUNT_CACHE_SIZE: Final = 4096
CHECKPOINT_CACHE_SIZE: Final = 64
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


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


class _Seek(NamedTuple):
    """Ranges of the leading keys holding the page's matches, and the version they hold at."""

    values: SeekRanges
    version: int
    rowids: str | None = None  # every match the page may hold, when few: a JSON array


class _Choice(NamedTuple):
    """How a page is read: walking the ordering's index or collecting the matches, the
    ranges it seeks to, and the column whose index collects them (None: SQLite's pick)."""

    walk: bool
    seek: _Seek | None = None
    collect_by: str | None = None


class _PageRows(NamedTuple):
    """What `ListPlan.page` reads: the version, then the rows, joined."""

    version: int
    returned: int
    stored: bytes  # the rows' stored bodies, concatenated
    lengths: str  # their byte lengths, comma-separated
    sequences: str  # the rows' change sequences, comma-separated (sync feed only)


class LRU(Generic[K, V]):
    """A bounded map that forgets the entry written longest ago first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)


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

    def __init__(self, pool: ReadPool) -> None:
        self._pool = pool
        self._bodies = BodyDecoder()  # dictionaries loaded when a body first names one
        # Counts of the broad filters, from a columnar copy (match_counter.py); read
        # first in the background, SQLite counting until it is there.
        self._counter = MatchCounter(pool.path)
        self._first_read: asyncio.Task[None] | None = None
        # (WHERE clause, its values) -> (data version, count)
        self._counts: LRU[tuple[str, tuple[Any, ...]], tuple[int, int]] = LRU(COUNT_CACHE_SIZE)
        # ListPlan.checkpoint_key -> (data version, checkpoints)
        self._checkpoints: LRU[tuple[object, ...], tuple[int, Anchors]] = LRU(CHECKPOINT_CACHE_SIZE)
        self._single_flight = SingleFlight()
        # (plan, copy version) -> the walk and seek chosen (`_walk_by_copy`)
        self._choices: LRU[tuple[ListPlan, int | None], _Choice] = LRU(COUNT_CACHE_SIZE)

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
            return self._bodies.decode(stored), int(version)
        except UnknownDictionary:
            return await self._decoded(lambda: self._bodies.decode(stored)), int(version)

    async def _decoded(self, decode: Callable[[], bytes]) -> bytes:
        """`decode()`, after loading the dictionaries when a body names one not loaded."""
        try:
            return decode()
        except UnknownDictionary:
            self._bodies.add(await self._pool.fetchall(DICTIONARIES))
            return decode()

    async def fetch_page(self, query: ApplicantQuery, scope: Scope) -> ApplicantPage:
        """One page of matching records in the requested order, with the exact total."""
        page_plan = plan_list(query, scope)
        walk, seek, collect_by = await self._walk(page_plan)
        if seek is not None and not page_plan.uses_checkpoints:
            page = await self._read_page(
                page_plan, walk, None, None, seek.values, rowids=seek.rowids
            )
            if page.data_version == seek.version:
                return page
            # The copy was a write behind the page: a record that write moved into the
            # page may lie outside the range. Served as if there were none.
        version: int | None = None
        anchors: Anchors = ()
        if page_plan.uses_checkpoints:
            version, anchors = await self._anchors(page_plan, walk)
        start, skip = page_plan.start(anchors)
        page = await self._read_page(page_plan, walk, start, skip, collect_by=collect_by)
        if version is not None and page.data_version != version:
            # A write landed since the checkpoints were read: their positions may have
            # moved. Serve this page by plain offset and rebuild them next time.
            self._checkpoints.drop(page_plan.checkpoint_key)
            page = await self._read_page(page_plan, walk, None, None, collect_by=collect_by)
        return page

    async def _walk(self, page_plan: ListPlan) -> _Choice:
        """The plan's choice of walk, from the sizes when it depends on them, and where
        the page's matches lie in the order when the columnar copy can tell.

        The sizes come from the columnar copy, or from the count cache, of any version
        (a plan needs only the rough size), and are counted once when unknown.
        """
        if page_plan.walk is not None and not (
            _sorts_without_index(page_plan.query) and await self._counts_by_copy(page_plan)
        ):
            return _Choice(page_plan.walk)
        if await self._counts_by_copy(page_plan):
            # At the copy's version, which may be a write behind: a plan needs only the
            # rough sizes, and a range found at that version is used only for a page
            # read at it.
            return self._walk_by_copy(page_plan)
        matches = self._latest_total(page_plan.matches)
        everything = self._latest_total(plan.EVERYTHING)
        if matches is None or everything is None:
            version, matches, everything = await self._row(page_plan.sizes, on_pool=True)
            self._remember_total(page_plan.matches, version, matches)
            self._remember_total(plan.EVERYTHING, version, everything)
        return _Choice(page_plan.walks(matches, everything))

    def _walk_by_copy(self, page_plan: ListPlan) -> _Choice:
        """`_walk` from the columnar copy, once per plan and copy version: a page asked
        again (the hot path) plans nothing."""
        key = (page_plan, self._counter.version)
        choice = self._choices.get(key)
        if choice is None:
            choice = self._choose_by_copy(page_plan)
            self._choices.put(key, choice)
        return choice

    def _choose_by_copy(self, page_plan: ListPlan) -> _Choice:
        """A first page whose lead key the copy holds seeks to the range its matches lie
        in, and walks it when that steps over fewer rows than collecting the matches.

        Matches collected are found through the index of the filter that keeps the
        fewest rows, counted by the copy: SQLite, without statistics, took a token's two
        integrations (250,000 rows at 1,000,000) over a date bound that 12,000 met, 3.5 s
        a page instead of ~40 ms."""
        query, scope, everything = page_plan.query, page_plan.scope, self._counter.rows
        if query.after is None and not page_plan.uses_checkpoints:
            order = total_order(query.order_by)
            found = self._counter.seek(query, scope, order, page_plan.wanted)
            # The page's total, at the copy's version: not counted a second time.
            self._remember_total(
                page_plan.matches, cast("int", self._counter.version), found.matches
            )
            # A walk of several ranges that no one index serves tests the keys before
            # the last on every row of it, for a length not estimated: few matches
            # within them are read by rowid.
            several = tuple(column for column, _, _ in found.ranges[:2])
            if found.candidates is not None and (
                (len(several) > 1 and several not in plan.ORDER_INDEXES)
                or page_plan.reads_by_rowid(
                    len(found.candidates), found.matches, everything, found.stepped
                )
            ):
                # Few enough to read by rowid and sort, whatever index could find them.
                rowids = "[" + ",".join(map(str, found.candidates.tolist())) + "]"
                version = cast("int", self._counter.version)
                return _Choice(False, _Seek((), version, rowids))
            if found.ranges:
                seek = _Seek(found.ranges, cast("int", self._counter.version))
                if len(found.ranges) > 1:
                    # The last range is sought (`plan.build_page_select`), every filter
                    # tested.
                    return _Choice(True, seek)
                collect_by, collected = self._collected_by(page_plan)
                if page_plan.walks(found.matches, everything, found.stepped, collected):
                    return _Choice(True, seek)
                # Collected as if there were no range: through the fewest rows.
                return _Choice(False, None, collect_by)
            matches = found.matches  # counted by the seek: not counted again
        else:
            matches = self._counter.count(query, scope)
        collect_by, collected = self._collected_by(page_plan)
        clear = page_plan.walks_whatever_the_spread(matches, everything, collected)
        if page_plan.walks(matches, everything, collected=collected) if clear is None else clear:
            return _Choice(True)
        return _Choice(False, None, collect_by)

    def _collected_by(self, page_plan: ListPlan) -> tuple[str | None, int | None]:
        """The column whose index collects the matches, the one whose conditions keep
        fewest rows (None: one column only, or none: SQLite's pick), and those rows."""
        kept = self._counter.kept_by_each(page_plan.query, page_plan.scope)
        if not kept:
            return None, None
        fewest = min(kept, key=kept.__getitem__)
        return (fewest if len(kept) > 1 else None), kept[fewest]

    async def _anchors(self, page_plan: ListPlan, walk: bool) -> tuple[int | None, Anchors]:
        """The checkpoints of this query's filters and order (read once per data version)."""
        cached = self._checkpoints.get(page_plan.checkpoint_key)
        if cached is not None:
            return cached
        return await self._single_flight.run(
            ("checkpoints", page_plan.checkpoint_key),
            lambda: self._read_anchors(page_plan, walk),
        )

    async def _read_anchors(self, page_plan: ListPlan, walk: bool) -> tuple[int | None, Anchors]:
        statement = page_plan.anchors(walk)
        # One pass over every match: on the pool, off the event loop.
        found = await self._pool.fetchall_on_pool(statement.sql, statement.params)
        if not found:
            return None, ()
        anchors: Anchors = tuple(tuple(row[1:]) for row in found)
        version = int(found[0][0])
        self._checkpoints.put(page_plan.checkpoint_key, (version, anchors))
        return version, anchors

    async def _read_page(
        self,
        page_plan: ListPlan,
        walk: bool,
        start: tuple[KeyValue, ...] | None,
        skip: int | None,
        seek: SeekRanges = (),
        collect_by: str | None = None,
        rowids: str | None = None,
    ) -> ApplicantPage:
        """The page and its exact total, both at the data version the page was read at."""
        statement = page_plan.page(walk, start, skip, seek, collect_by, rowids)
        rows = _PageRows(*await self._row(statement))
        total = self._cached_total(page_plan.matches, rows.version)
        for _ in range(3):
            if total is not None:
                break
            # Counting may read every matching row: on the pool, once for all the
            # requests that need it. If a write landed since the page was read, read the
            # page again.
            counted_version, counted = await self._count_matches(page_plan, rows.version)
            if counted_version == rows.version:
                total = counted
                break
            rows = _PageRows(*await self._row(statement))
            total = self._cached_total(page_plan.matches, rows.version)
        if total is None:
            # Writes keep landing between page and count: both in one statement.
            both = await self._row(
                page_plan.page_and_count(walk, start, skip, collect_by), on_pool=True
            )
            rows, total = _PageRows(both[0], *both[2:]), both[1]
            self._remember_total(page_plan.matches, rows.version, total)
        results = await self._decoded(lambda: self._bodies.decode_joined(rows.stored, rows.lengths))
        return _served(page_plan, rows, results, total)

    async def _counts_by_copy(self, page_plan: ListPlan) -> bool:
        """Whether the columnar copy answers this plan's counts.

        While the copy's first read (started with the server) runs, a request that needs
        it waits for it: seconds once at 1,000,000 rows, where counting the same
        combinations with SQLite took seconds each. A failed read is tried again by the
        next request, which meanwhile counts with SQLite.
        """
        if not MatchCounter.covers(page_plan.query):
            return False
        if self._counter.version is None:
            if self._first_read is None or self._first_read.done():
                self._first_read = asyncio.create_task(self._read_copy())
                return False
            await asyncio.shield(self._first_read)
        return self._counter.version is not None

    async def _count_matches(self, page_plan: ListPlan, version: int) -> tuple[int, int]:
        """(data version, matches of the plan's filters at that version): from the
        columnar copy, brought to `version` (the page's) if it is behind; else counted."""
        if not await self._counts_by_copy(page_plan):
            return await self._count(page_plan.matches)
        if self._counter.version != version:
            await self._counter.catch_up()
        counted = self._counter.count(page_plan.query, page_plan.scope)
        counted_version = cast("int", self._counter.version)
        self._remember_total(page_plan.matches, counted_version, counted)
        return counted_version, counted

    def start(self) -> None:
        """Begin reading the columnar copy now, before the first request needs it."""
        if self._first_read is None:
            self._first_read = asyncio.create_task(self._read_copy())

    async def _read_copy(self) -> None:
        with contextlib.suppress(sqlite3.Error, OSError):
            await self._counter.catch_up()

    async def close(self) -> None:
        """Wait for the copy's first read, if it is still running (it cannot be stopped)."""
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


def _sorts_without_index(query: ApplicantQuery) -> bool:
    """An order of several keys led by a column of the columnar copy that no index of
    schema.sql serves: SQLite sorts every match unless told where the page lies."""
    keys = total_order(query.order_by)
    if len(keys) <= 2 or keys[0].field not in columnar_copy.COLUMNS:
        return False
    served = tuple(key.field for key in keys[:-1]) in plan.ORDER_INDEXES
    return not (served and len({key.direction for key in keys}) == 1)


def _served(page_plan: ListPlan, rows: _PageRows, results_json: bytes, total: int) -> ApplicantPage:
    """The page to serve: a cursor page's peeked record cut off, and its `more` known."""
    version, returned, _, _, sequences = rows
    more = None
    if page_plan.peek:
        more = returned > page_plan.query.limit
        if more:
            returned -= 1
            results_json = results_json[: max(last_record_start(results_json) - 1, 0)]
            sequences = sequences.rpartition(",")[0]
    last_seq = int(sequences.rpartition(",")[2]) if sequences else None
    return ApplicantPage(results_json, returned, total, last_seq, version, more)
