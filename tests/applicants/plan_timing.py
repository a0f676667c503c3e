"""How long the list reader takes a page, its statements run on one direct connection.

Not a test: with `plan_snapshot.py` (same database file), the check that a planner
change loses no speed where the planner itself costs something: the same pages asked
again (the hot path: the choice, the statement and the total all cached), and a cursor
walk (every page a new cursor). Run it on the code before and after, alternately:

    PYTHONPATH=$PWD python -m tests.applicants.plan_timing /tmp/snap.db
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from leasestar.applicants.ordering import build_order_by, order_columns
from leasestar.applicants.query import ApplicantQuery, parse_order_by
from leasestar.applicants.records import SortKey
from leasestar.applicants.storage import LRU, ApplicantReader
from leasestar.database import ReadPool, read_uri
from tests.applicants.plan_snapshot import RecordingPool

HOT = (
    ApplicantQuery(limit=1),
    ApplicantQuery(limit=1, filters=(("updated_at_gte", 0),)),
    ApplicantQuery(
        limit=1, order_by=parse_order_by("last_name"), filters=(("integration_vendor", "YARDI"),)
    ),
    ApplicantQuery(limit=1, order_by=parse_order_by("state,city,zip")),
    ApplicantQuery(
        limit=1,
        offset=50,
        order_by=parse_order_by("date_of_birth:desc"),
        filters=(("last_seen_lte", 2**62),),
    ),
)
ROUNDS = 5


def _label(order_by: tuple[SortKey, ...]) -> str:
    return ",".join(f"{key.field}:{key.direction}" for key in order_by)


async def _best(run: Callable[[], Awaitable[None]], pages: int) -> float:
    """The fastest of ROUNDS runs, in microseconds a page."""
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        await run()
        best = min(best, (time.perf_counter() - started) / pages * 1e6)
    return best


async def _timed(path: Path) -> None:
    connection = sqlite3.connect(read_uri(path), uri=True, check_same_thread=False)
    pool = RecordingPool(connection, path)
    reader = ApplicantReader(cast(ReadPool, pool))
    for query in HOT:

        async def again(query: ApplicantQuery = query) -> None:
            for _ in range(1000):
                await reader.fetch_page(query, None)
            pool.statements.clear()

        await again()  # the copy read, the caches filled
        label = f"{_label(query.order_by)} {dict(query.filters)} offset={query.offset}"
        print(f"same page again, {label}: {await _best(again, 1000):.1f} us a page")
    (bound,) = connection.execute(
        "SELECT updated_at FROM applicants ORDER BY updated_at LIMIT 1 OFFSET ?",
        (connection.execute("SELECT count(*) / 2 FROM applicants").fetchone()[0],),
    ).fetchone()
    for order_by in (ApplicantQuery().order_by, parse_order_by("last_name")):
        filters = (("updated_at_gte", bound),)
        rows = connection.execute(
            f"SELECT {', '.join(order_columns(order_by))} FROM applicants "
            f"WHERE updated_at >= ? {build_order_by(order_by)}",
            (bound,),
        ).fetchall()
        walk = [
            ApplicantQuery(
                limit=20, offset=at, order_by=order_by, filters=filters, after=tuple(rows[at - 1])
            )
            for at in range(20, min(len(rows), 5000), 20)
        ]

        async def cursor_walk(walk: list[ApplicantQuery] = walk) -> None:
            reader._choices = LRU(4096)  # a walk chooses afresh, whatever came before
            for query in walk:
                await reader.fetch_page(query, None)
            pool.statements.clear()

        label = f"{_label(order_by)}, half the rows match"
        print(f"cursor walk, {label}: {await _best(cursor_walk, len(walk)):.1f} us a page")
    await reader.close()
    connection.close()


if __name__ == "__main__":
    asyncio.run(_timed(Path(sys.argv[1])))
