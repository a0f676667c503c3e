"""Reading applicants: a page or one record, as pre-encoded JSON straight from SQLite.

A page is one SQL statement: SQLite joins the stored bodies of the page's rows with
commas (`group_concat` over the ordered, limited subquery), so Python handles one
string per request whatever the page size. The same statement reads the data version,
which keys a cache of `meta.total`: a count is computed once per (filters, scope,
data version) and served from memory until a write moves the version. Because the
count, when it is needed, is a subquery of that same statement, page, total and
version always come from one snapshot.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

import msgspec

from leasestar.applicants.cursors import KeyValue, last_record_start
from leasestar.applicants.query import (
    FILTER_ORDER_INDEXES,
    ApplicantQuery,
    SqlFragment,
    build_order_by,
    build_page_select,
    build_where,
    order_columns,
    total_order,
)
from leasestar.database import ReadPool

COUNT_CACHE_SIZE: Final = 4096
# Deep offsets seek to the nearest checkpoint (every CHECKPOINT_EVERY-th match of a
# query's filters in its order) instead of stepping over every skipped row.
CHECKPOINT_EVERY: Final = 1000
DEEP_OFFSET: Final = 10 * CHECKPOINT_EVERY
CHECKPOINT_CACHE_SIZE: Final = 64
_EVERYTHING: Final = SqlFragment("")
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


class CountCache:
    """`meta.total` per (WHERE clause, its values), valid for one data version."""

    def __init__(self, size: int = COUNT_CACHE_SIZE) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[str, tuple[Any, ...]], tuple[int, int]] = OrderedDict()

    def get(self, where: SqlFragment, version: int) -> int | None:
        entry = self._entries.get((where.sql, where.params))
        if entry is None or entry[0] != version:
            return None
        return entry[1]

    def latest(self, where: SqlFragment) -> int | None:
        """The last count known, of whatever version: good enough to choose a plan."""
        entry = self._entries.get((where.sql, where.params))
        return None if entry is None else entry[1]

    def put(self, where: SqlFragment, version: int, total: int) -> None:
        key = (where.sql, where.params)
        self._entries[key] = (version, total)
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)


Anchors = tuple[tuple[KeyValue, ...], ...]


class Checkpoints:
    """Per (filters, order): the sort-key values of matches number 0, K, 2K, ... and the
    data version they were read at. Built with one pass over the order's index."""

    def __init__(self, size: int = CHECKPOINT_CACHE_SIZE) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[Any, ...], tuple[int, Anchors]] = OrderedDict()

    def get(self, key: tuple[Any, ...]) -> tuple[int, Anchors] | None:
        return self._entries.get(key)

    def put(self, key: tuple[Any, ...], version: int, anchors: Anchors) -> None:
        self._entries[key] = (version, anchors)
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def drop(self, key: tuple[Any, ...]) -> None:
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
    """Queries the read pool; knows SQL, knows nothing of HTTP."""

    def __init__(self, pool: ReadPool) -> None:
        self._pool = pool
        self._counts = CountCache()
        self._checkpoints = Checkpoints()
        self._single_flight = SingleFlight()

    async def data_version(self) -> int:
        """The change sequence high-water mark: moves on every write."""
        rows = await self._pool.fetchall("SELECT change_seq FROM sync_state")
        return int(rows[0][0])

    async def total_rows(self) -> int:
        """Every applicant in the database, counted once per data version."""
        everything = _EVERYTHING
        total = self._counts.get(everything, await self.data_version())
        if total is None:
            rows = await self._pool.fetchall_on_pool(
                "SELECT (SELECT change_seq FROM sync_state), count(*) FROM applicants"
            )
            version, total = rows[0]
            self._counts.put(everything, version, total)
        return int(total)

    async def cursor_key(self) -> bytes:
        """The database's key for signing cursors."""
        rows = await self._pool.fetchall("SELECT cursor_key FROM sync_state")
        return bytes(rows[0][0])

    async def fetch_page(
        self, query: ApplicantQuery, scope: frozenset[str] | None
    ) -> ApplicantPage:
        """One page of matching records in the requested order, with the exact total."""
        # A cursor page's total counts the whole walk, not what is left after the cursor.
        count_where = build_where(query, scope)
        walk_order = await self._walk_order(query, scope, count_where)
        start: tuple[KeyValue, ...] | None = None  # a checkpoint's key values
        skip = query.sql_offset
        checkpoint_key = (count_where.sql, count_where.params, query.order_by)
        checkpoint_version = None
        if (
            query.after is None
            and query.changed_since is None
            and (walk_order or query.offset >= DEEP_OFFSET)
        ):
            checkpoint_version, anchors = await self._anchors(query, scope, walk_order)
            if anchors:
                index = min(query.offset // CHECKPOINT_EVERY, len(anchors) - 1)
                start = anchors[index]
                skip = query.offset - index * CHECKPOINT_EVERY
        page = await self._read_page(query, scope, count_where, walk_order, start, skip)
        if checkpoint_version is not None and page.data_version != checkpoint_version:
            # A write landed since the checkpoints were read: their positions may have
            # moved. Serve this page by plain offset and rebuild them next time.
            self._checkpoints.drop(checkpoint_key)
            page = await self._read_page(
                query, scope, count_where, walk_order, None, query.sql_offset
            )
        return page

    async def _anchors(
        self, query: ApplicantQuery, scope: frozenset[str] | None, walk_order: bool
    ) -> tuple[int | None, Anchors]:
        """The checkpoints of this query's filters and order (read once per data version)."""
        plain = msgspec.structs.replace(query, after=None)
        count_where = build_where(plain, scope)
        key = (count_where.sql, count_where.params, query.order_by)
        cached = self._checkpoints.get(key)
        if cached is not None:
            return cached
        return await self._single_flight.run(
            ("checkpoints", key), lambda: self._read_anchors(plain, scope, walk_order, key)
        )

    async def _read_anchors(
        self,
        plain: ApplicantQuery,
        scope: frozenset[str] | None,
        walk_order: bool,
        key: tuple[Any, ...],
    ) -> tuple[int | None, Anchors]:
        where = build_where(plain, scope, walk_order=walk_order)
        columns = ", ".join(order_columns(plain.order_by))
        # One pass over every match: on the pool, off the event loop.
        found = await self._pool.fetchall_on_pool(
            f"SELECT (SELECT change_seq FROM sync_state), {columns} FROM ("
            f"SELECT {columns}, row_number() OVER ({build_order_by(plain.order_by)}) "
            f"AS position FROM applicants {where.sql}) "
            f"WHERE (position - 1) % {CHECKPOINT_EVERY} = 0",
            where.params,
        )
        if not found:
            return None, ()
        anchors: Anchors = tuple(tuple(row[1:]) for row in found)
        version = int(found[0][0])
        self._checkpoints.put(key, version, anchors)
        return version, anchors

    async def _read_page(
        self,
        query: ApplicantQuery,
        scope: frozenset[str] | None,
        count_where: SqlFragment,
        walk_order: bool,
        start: tuple[KeyValue, ...] | None,
        skip: int,
    ) -> ApplicantPage:
        # A cursor page reads one record more, to know whether another follows it.
        peek = 1 if query.after is not None else 0
        statement = build_page_select(
            query, scope, limit=query.limit + peek, skip=skip, walk_order=walk_order, start=start
        )
        page_sql, page_params = statement.sql, statement.params
        # CAST AS BLOB hands Python the UTF-8 bytes as stored: no decoding of the page
        # into a str and encoding it back. Only the sync feed needs the records' change
        # sequence numbers (its position and its cursor are the last one).
        sequences = (
            "coalesce(group_concat(change_seq), '')" if query.changed_since is not None else "''"
        )
        page_columns = f"count(*), CAST(coalesce(group_concat(body, ','), '') AS BLOB), {sequences}"
        # First try with a cached total: the statement only reads the page and version.
        rows = await self._pool.fetchall(
            f"SELECT (SELECT change_seq FROM sync_state), {page_columns} FROM ({page_sql})",
            page_params,
        )
        version, returned, results_json, seqs = rows[0]
        total = self._counts.get(count_where, version)
        for _ in range(3):
            if total is not None:
                break
            # Counting may read every matching row: on the pool, once for all the
            # requests that need it. The count is exact for the version it was read at;
            # if a write landed since the page was read, read the page again.
            counted_version, counted = await self._count(count_where)
            if counted_version == version:
                total = counted
                break
            rows = await self._pool.fetchall(
                f"SELECT (SELECT change_seq FROM sync_state), {page_columns} FROM ({page_sql})",
                page_params,
            )
            version, returned, results_json, seqs = rows[0]
            total = self._counts.get(count_where, version)
        if total is None:
            # Writes keep landing between page and count: both in one statement.
            rows = await self._pool.fetchall_on_pool(
                "SELECT (SELECT change_seq FROM sync_state), "
                f"(SELECT count(*) FROM applicants {count_where.sql}), {page_columns} "
                f"FROM ({page_sql})",
                (*count_where.params, *page_params),
            )
            version, total, returned, results_json, seqs = rows[0]
            self._counts.put(count_where, version, total)
        more = None
        if peek:
            more = returned > query.limit
            if more:  # cut the peeked record off
                returned -= 1
                results_json = results_json[: max(last_record_start(results_json) - 1, 0)]
                seqs = seqs.rpartition(",")[0]
        last_seq = int(seqs.rpartition(",")[2]) if seqs else None
        return ApplicantPage(results_json, returned, total, last_seq, version, more)

    async def _count(self, where: SqlFragment) -> tuple[int, int]:
        """(data version, matches of `where` at that version), counted once at a time."""

        async def count() -> tuple[int, int]:
            rows = await self._pool.fetchall_on_pool(
                "SELECT (SELECT change_seq FROM sync_state), "
                f"(SELECT count(*) FROM applicants {where.sql})",
                where.params,
            )
            version, total = rows[0]
            self._counts.put(where, version, total)
            return int(version), int(total)

        return await self._single_flight.run(("count", where.sql, where.params), count)

    async def _walk_order(
        self, query: ApplicantQuery, scope: frozenset[str] | None, count_where: SqlFragment
    ) -> bool:
        """Should the page walk the ordering's index (filtering as it goes) rather than let
        SQLite collect every match through a filter's index and sort them?

        Walking reads about (skipped + limit) * N / M rows for M matches of N; collecting
        reads and sorts M. So walk when M * M > (skipped + limit) * N. The counts come from
        the count cache (of any version: a plan needs only the rough size), counted once
        when unknown.
        """
        broad = (
            query.updated_at_gte,
            query.updated_at_lte,
            query.last_seen_gte,
            query.last_seen_lte,
            query.integration_id,
            query.integration_vendor,
            query.property_id,
            query.x_property_id,
        )
        if all(value is None for value in broad) and scope is None:
            return False
        if query.x_id is not None or query.email_1 is not None or query.phone_1 is not None:
            return False  # near-unique filters: their index always wins
        lead = total_order(query.order_by)[0].field
        single = [
            column
            for column, value in (
                ("property_id", query.property_id),
                ("integration_id", query.integration_id),
            )
            if value is not None
        ]
        if scope is not None and len(scope) == 1 and query.integration_id is None:
            single.append("integration_id")
        dates = broad[:4]
        if (
            all(value is None for value in dates)
            and query.integration_vendor is None
            and query.x_property_id is None
            and len(single) == 1
            and (single[0], lead) in FILTER_ORDER_INDEXES
        ):
            return False  # one composite index serves both the filter and the order
        matches = self._counts.latest(count_where)
        everything = self._counts.latest(_EVERYTHING)
        if matches is None or everything is None:
            rows = await self._pool.fetchall_on_pool(
                "SELECT (SELECT change_seq FROM sync_state), "
                f"(SELECT count(*) FROM applicants {count_where.sql}), "
                "(SELECT count(*) FROM applicants)",
                count_where.params,
            )
            version, matches, everything = rows[0]
            self._counts.put(count_where, version, matches)
            self._counts.put(_EVERYTHING, version, everything)
        return matches * matches > (query.sql_offset + query.limit) * everything

    async def fetch_one(
        self, applicant_id: str, query: ApplicantQuery, scope: frozenset[str] | None
    ) -> tuple[bytes | None, int]:
        """The record's JSON (None when unknown, out of scope or outside the bounds), and
        the data version it was read at."""
        where = build_where(query, scope)
        condition = f"{where.sql} AND id = ?" if where.sql else "WHERE id = ?"
        rows = await self._pool.fetchall(
            "SELECT (SELECT change_seq FROM sync_state), "
            f"(SELECT CAST(body AS BLOB) FROM applicants {condition})",
            (*where.params, applicant_id),
        )
        version, body = rows[0]
        return (bytes(body) if body is not None else None), int(version)
