"""Every statement the list reader runs, and what it answers, for a fixed set of queries.

Not a test: a tool for a change to the planner that must change no statement and no
byte of any answer (issue 26). Run it before and after, and diff:

    PYTHONPATH=$PWD python -m tests.applicants.plan_snapshot /tmp/snap.db > before.txt

It seeds 12,000 synthetic applicants (deep offsets take checkpoints) into the file
named, unless it exists (a new database numbers its change sequences from the clock, so
before and after must read the same file), and serves each query through
`ApplicantReader.fetch_page` on one recording connection, twice (the second time from
the caches), writing the statements with their values and a digest of the page; then
all again with the copy never handing over rowids (at 12,000 rows most pages would be
read by rowid), so the walks and collections are planned too.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast
from unittest import mock

from leasestar.applicants import planner
from leasestar.applicants.ordering import (
    CHANGE_ORDER,
    SORTABLE_FIELDS,
    build_order_by,
    order_columns,
)
from leasestar.applicants.pipeline import write_records
from leasestar.applicants.plan import build_where
from leasestar.applicants.query import ApplicantQuery, parse_order_by
from leasestar.applicants.storage import ApplicantReader
from leasestar.database import ReadPool, open_for_write, read_uri
from leasestar.seed.generator import synthetic_applicants

ROWS = 12_000
ORDERS = (
    "",
    *(f"{field}:{direction}" for field in SORTABLE_FIELDS for direction in ("asc", "desc")),
    "middle_name:desc,last_name:asc",
    "email_1:asc,created_at:desc",
    "city:desc,state:desc,zip:asc",
    "state:asc,city:asc,zip:asc",
    "state:asc,middle_name:desc,first_name:asc,zip:desc",
    "zip:desc,id:asc",
    "integration_vendor:asc,last_seen:desc",
    "property_id:desc,created_at:desc",
    "last_name:asc,first_name:asc",
    "date_of_birth:desc,updated_at:asc",
)


class RecordingPool:
    """Runs each statement on one connection and keeps it."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self.connection = connection
        self.path = path
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    async def fetchall(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        self.statements.append((sql, tuple(parameters)))
        return self.connection.execute(sql, parameters).fetchall()

    fetchall_on_pool = fetchall


def _filter_sets(connection: sqlite3.Connection) -> list[tuple[tuple[str, Any], ...]]:
    def common(column: str, rank: int) -> Any:
        return connection.execute(
            f"SELECT {column} FROM applicants GROUP BY {column} ORDER BY count(*) DESC, "
            f"{column} LIMIT 1 OFFSET ?",
            (rank,),
        ).fetchone()[0]

    def instant(column: str, fraction: float) -> int:
        return int(
            connection.execute(
                f"SELECT {column} FROM applicants ORDER BY {column} LIMIT 1 OFFSET ?",
                (int(ROWS * fraction),),
            ).fetchone()[0]
        )

    integration, x_property, x_id = connection.execute(
        "SELECT integration_id, x_property_id, x_id FROM applicants LIMIT 1 OFFSET 77"
    ).fetchone()
    email, phone = connection.execute(
        "SELECT email_1, phone_1_digits FROM applicants WHERE email_1 IS NOT NULL "
        "AND phone_1_digits IS NOT NULL LIMIT 1 OFFSET 5"
    ).fetchone()
    return [
        (),
        (("updated_at_gte", instant("updated_at", 0.5)),),
        (("updated_at_lte", instant("updated_at", 0.001)),),
        (
            ("updated_at_gte", instant("updated_at", 0.2)),
            ("updated_at_lte", instant("updated_at", 0.3)),
        ),
        (("last_seen_gte", instant("last_seen", 0.9)),),
        (("last_seen_lte", instant("last_seen", 0.05)),),
        (("integration_id", common("integration_id", 0)),),
        (("integration_vendor", common("integration_vendor", 0)),),
        (
            ("integration_vendor", common("integration_vendor", 2)),
            ("updated_at_gte", instant("updated_at", 0.7)),
        ),
        (("property_id", common("property_id", 0)),),
        (("property_id", common("property_id", 3)), ("last_seen_lte", instant("last_seen", 0.4))),
        (("x_property_id", common("x_property_id", 1)),),
        (("integration_id", integration), ("integration_vendor", common("integration_vendor", 1))),
        (("email_1", email),),
        (("phone_1", phone[-10:]),),
        (("integration_id", integration), ("x_property_id", x_property), ("x_id", x_id)),
    ]


def _queries(
    connection: sqlite3.Connection,
) -> Iterator[tuple[ApplicantQuery, frozenset[str] | None]]:
    integrations = [
        row[0]
        for row in connection.execute(
            "SELECT integration_id FROM applicants GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 2"
        )
    ]
    scopes = (None, frozenset(integrations[:1]), frozenset(integrations))
    filter_sets = _filter_sets(connection)
    for text, filters, scope in itertools.product(ORDERS, filter_sets, scopes):
        order = parse_order_by(text) if text else None
        base = (
            ApplicantQuery(filters=filters)
            if order is None
            else ApplicantQuery(order_by=order, filters=filters)
        )
        for offset, limit in ((0, 10), (0, 100), (130, 25)):
            yield (
                ApplicantQuery(offset=offset, limit=limit, order_by=base.order_by, filters=filters),
                scope,
            )
        if len(filters) <= 1:
            yield (
                ApplicantQuery(offset=10_500, limit=20, order_by=base.order_by, filters=filters),
                scope,
            )
        # A cursor page after the 40th match in the order.
        where, params = _where(filters, scope)
        after = connection.execute(
            f"SELECT {', '.join(order_columns(base.order_by))} FROM applicants {where} "
            f"{build_order_by(base.order_by)} LIMIT 1 OFFSET 39",
            params,
        ).fetchone()
        if after is not None:
            yield (
                ApplicantQuery(
                    offset=40, limit=20, order_by=base.order_by, filters=filters, after=tuple(after)
                ),
                scope,
            )
    for filters in ((), (("integration_id", integrations[0]),)):
        for since in (0, _sequence(connection, 0.5), _sequence(connection, 0.999)):
            query = ApplicantQuery(
                limit=50, order_by=CHANGE_ORDER, filters=filters, changed_since=since
            )
            yield query, None
            yield query, frozenset(integrations[1:])


def _sequence(connection: sqlite3.Connection, fraction: float) -> int:
    return int(
        connection.execute(
            "SELECT change_seq FROM applicants ORDER BY change_seq LIMIT 1 OFFSET ?",
            (int(ROWS * fraction),),
        ).fetchone()[0]
    )


def _where(
    filters: tuple[tuple[str, Any], ...], scope: frozenset[str] | None
) -> tuple[str, tuple[Any, ...]]:
    where = build_where(ApplicantQuery(filters=filters), scope)
    return where.sql, where.params


async def _snapshot(path: Path, out: Any) -> None:
    await _served(path, out)
    out.write("==== never by rowid\n")
    with mock.patch.object(planner, "ROWID_READ_MOST", -1):
        await _served(path, out)


async def _served(path: Path, out: Any) -> None:
    connection = sqlite3.connect(read_uri(path), uri=True, check_same_thread=False)
    pool = RecordingPool(connection, path)
    reader = ApplicantReader(cast(ReadPool, pool))
    for query, scope in list(_queries(connection)):
        for attempt in (1, 2):
            pool.statements.clear()
            page = await reader.fetch_page(query, scope)
            digest = hashlib.sha256(page.results_json).hexdigest()[:16]
            out.write(f"== {query!r} scope={sorted(scope) if scope else None} #{attempt}\n")
            out.write(
                f"   page {digest} returned={page.returned} total={page.total} "
                f"more={page.more} last_seq={page.last_change_seq}\n"
            )
            for sql, params in pool.statements:
                out.write(f"   {sql}\n      {params!r}\n")
    await reader.close()
    connection.close()


def main() -> None:
    path = Path(sys.argv[1])
    if not path.exists():
        connection = open_for_write(path)
        try:
            write_records(connection, synthetic_applicants(ROWS, seed=7))
        finally:
            connection.close()
    asyncio.run(_snapshot(path, sys.stdout))


if __name__ == "__main__":
    main()
