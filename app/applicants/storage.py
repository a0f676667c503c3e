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

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from app.applicants.query import ApplicantQuery, SqlFragment, build_order_by, build_where
from app.database import ReadPool

COUNT_CACHE_SIZE: Final = 4096


@dataclass(frozen=True, slots=True)
class ApplicantPage:
    """The rows of one page, already JSON, and what meta needs."""

    results_json: bytes  # the page's records joined with commas (no brackets)
    returned: int
    total: int
    last_record_length: int  # bytes of the page's last record (0 when empty)
    last_change_seq: int | None  # change sequence of the last record (sync feed only)
    data_version: int  # the snapshot the page was read from

    @property
    def last_record(self) -> bytes:
        return self.results_json[len(self.results_json) - self.last_record_length :]


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

    def put(self, where: SqlFragment, version: int, total: int) -> None:
        key = (where.sql, where.params)
        self._entries[key] = (version, total)
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)


class ApplicantReader:
    """Queries the read pool; knows SQL, knows nothing of HTTP."""

    def __init__(self, pool: ReadPool) -> None:
        self._pool = pool
        self._counts = CountCache()

    async def data_version(self) -> int:
        """The change sequence high-water mark: moves on every write."""
        async with self._pool.connection() as connection:
            rows = await connection.execute_fetchall("SELECT change_seq FROM sync_state")
        return int(next(iter(rows))[0])

    async def total_rows(self) -> int:
        """Every applicant in the database, counted once per data version."""
        everything = SqlFragment("")
        async with self._pool.connection() as connection:
            rows = await connection.execute_fetchall("SELECT change_seq FROM sync_state")
            version = int(next(iter(rows))[0])
            total = self._counts.get(everything, version)
            if total is None:
                rows = await connection.execute_fetchall(
                    "SELECT (SELECT change_seq FROM sync_state), count(*) FROM applicants"
                )
                version, total = next(iter(rows))
                self._counts.put(everything, version, total)
        return int(total)

    async def cursor_key(self) -> bytes:
        """The database's key for signing cursors."""
        async with self._pool.connection() as connection:
            rows = await connection.execute_fetchall("SELECT cursor_key FROM sync_state")
        return bytes(next(iter(rows))[0])

    async def fetch_page(
        self, query: ApplicantQuery, scope: frozenset[str] | None
    ) -> ApplicantPage:
        """One page of matching records in the requested order, with the exact total."""
        where = build_where(query, scope)
        page_sql = (
            f"SELECT body, change_seq FROM applicants {where.sql} "
            f"{build_order_by(query.order_by)} LIMIT ? OFFSET ?"
        )
        page_params = (*where.params, query.limit, query.sql_offset)
        # A cursor page's total counts the whole walk, not what is left after the cursor.
        count_where = build_where(msgspec.structs.replace(query, after=None), scope)
        # The last record's length lets the caller cut it out for the next cursor; in
        # the sync feed (change_seq ascending) the last record has the largest change_seq.
        # CAST AS BLOB hands Python the UTF-8 bytes as stored: no decoding of the page
        # into a str and encoding it back. length() of a BLOB is its stored size, O(1).
        page_columns = (
            "count(*), CAST(coalesce(group_concat(body, ','), '') AS BLOB), "
            "coalesce(group_concat(length(CAST(body AS BLOB))), ''), max(change_seq)"
        )
        # First try with a cached total: the statement only reads the page and version.
        async with self._pool.connection() as connection:
            rows = await connection.execute_fetchall(
                f"SELECT (SELECT change_seq FROM sync_state), {page_columns} FROM ({page_sql})",
                page_params,
            )
            version, returned, results_json, lengths, last_seq = next(iter(rows))
            total = self._counts.get(count_where, version)
            if total is None:
                rows = await connection.execute_fetchall(
                    "SELECT (SELECT change_seq FROM sync_state), "
                    f"(SELECT count(*) FROM applicants {count_where.sql}), {page_columns} "
                    f"FROM ({page_sql})",
                    (*count_where.params, *page_params),
                )
                version, total, returned, results_json, lengths, last_seq = next(iter(rows))
                self._counts.put(count_where, version, total)
        last_length = int(lengths.rpartition(",")[2] or 0)
        return ApplicantPage(results_json, returned, total, last_length, last_seq, version)

    async def fetch_one(
        self, applicant_id: str, query: ApplicantQuery, scope: frozenset[str] | None
    ) -> tuple[bytes | None, int]:
        """The record's JSON (None when unknown, out of scope or outside the bounds), and
        the data version it was read at."""
        where = build_where(query, scope)
        condition = f"{where.sql} AND id = ?" if where.sql else "WHERE id = ?"
        async with self._pool.connection() as connection:
            rows = await connection.execute_fetchall(
                "SELECT (SELECT change_seq FROM sync_state), "
                f"(SELECT CAST(body AS BLOB) FROM applicants {condition})",
                (*where.params, applicant_id),
            )
        version, body = next(iter(rows))
        return (bytes(body) if body is not None else None), int(version)
