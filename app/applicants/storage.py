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

from app.applicants.query import ApplicantQuery, SqlFragment, build_order_by, build_where
from app.database import ReadPool

COUNT_CACHE_SIZE: Final = 4096


@dataclass(frozen=True, slots=True)
class ApplicantPage:
    """The rows of one page, already JSON, and what meta needs."""

    results_json: str  # the page's records joined with commas (no brackets)
    returned: int
    total: int


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

    async def fetch_page(
        self, query: ApplicantQuery, scope: frozenset[str] | None
    ) -> ApplicantPage:
        """One page of matching records in the requested order, with the exact total."""
        where = build_where(query, scope)
        page_sql = (
            f"SELECT body FROM applicants {where.sql} {build_order_by(query.order_by)} "
            "LIMIT ? OFFSET ?"
        )
        page_params = (*where.params, query.limit, query.offset)
        # First try with a cached total: the statement only reads the page and version.
        async with self._pool.connection() as connection:
            rows = await connection.execute_fetchall(
                "SELECT (SELECT change_seq FROM sync_state), count(*), "
                f"coalesce(group_concat(body, ','), '') FROM ({page_sql})",
                page_params,
            )
            version, returned, results_json = next(iter(rows))
            total = self._counts.get(where, version)
            if total is None:
                rows = await connection.execute_fetchall(
                    "SELECT (SELECT change_seq FROM sync_state), "
                    f"(SELECT count(*) FROM applicants {where.sql}), count(*), "
                    f"coalesce(group_concat(body, ','), '') FROM ({page_sql})",
                    (*where.params, *page_params),
                )
                version, total, returned, results_json = next(iter(rows))
                self._counts.put(where, version, total)
        return ApplicantPage(results_json, returned, total)

    async def fetch_one(
        self, applicant_id: str, query: ApplicantQuery, scope: frozenset[str] | None
    ) -> str | None:
        """The record's JSON, or None when it is unknown, out of scope or outside the bounds."""
        where = build_where(query, scope)
        condition = f"{where.sql} AND id = ?" if where.sql else "WHERE id = ?"
        async with self._pool.connection() as connection:
            rows = await connection.execute_fetchall(
                f"SELECT body FROM applicants {condition}", (*where.params, applicant_id)
            )
        for (body,) in rows:
            return str(body)
        return None
