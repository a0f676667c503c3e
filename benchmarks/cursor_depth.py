"""Cursor walks at depth (issue 7), run by `make bench` on its 1,000,000-row server.

Cursors at 10%, 50% and 90% depth of each ordering of `ORDERINGS` are made without
walking there (the position's key values as SQL stores them, and the app's own
`cursor_state`, signed with the database's key), each page checked against the SQL page
at that position, then measured in interleaved slices. Target: per ordering, p50 at 90%
within 1.5x of its first page.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import databases
import harness
import provenance
from harness import CLIENT_CORE, CONNECTIONS, SERVER_CORE, WrkTarget, say
from provenance import section, table, text

from leasestar.applicants.cursors import CursorCodec
from leasestar.applicants.ordering import order_columns
from leasestar.applicants.query import ApplicantQuery, cursor_state, parse_order_by

DEPTHS = (0.1, 0.5, 0.9)
LIMIT = 100  # the default page size
TARGET = 1.5
# The default ordering, as SQL, written here from the contract (created_at desc + id).
DEFAULT_ORDER_SQL = "ORDER BY created_at DESC, id DESC"


@dataclass(frozen=True)
class Ordering:
    """An ordering walked: its `order-by` (None: the default) and its SQL, written here
    from the contract (nulls first ascending, last descending: SQLite's own placement;
    the hidden id key in the direction of the last key)."""

    order_by: str | None
    sql: str

    @property
    def name(self) -> str:
        return self.order_by or "created_at:desc (default)"

    @property
    def prefix(self) -> str:
        """Of its cases' keys: none for the default ordering, whose keys predate the rest."""
        return "" if self.order_by is None else self.order_by.replace(":", "_") + "_"


ORDERINGS = (
    Ordering(None, DEFAULT_ORDER_SQL),
    # Nullable keys, whose cursors once made SQLite scan the index from its far end: a
    # descending walk runs into the trailing null block (about 10% of the seed's emails
    # are null, so 90% is inside it), an ascending one starts inside the leading block
    # (about 55% of middle names, so 10% and 50% are inside it and 90% is past it).
    Ordering("email_1:desc", "ORDER BY email_1 DESC, id DESC"),
    Ordering("middle_name:asc", "ORDER BY middle_name ASC, id ASC"),
)


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    ordering: Ordering
    kind: str  # first, cursor_10, cursor_50, cursor_90 or offset_90
    label: str
    path: str  # path and query string
    position: int
    expected_ids: list[str]
    body_bytes: int = 0
    target: WrkTarget | None = None  # its slices, once measured
    measured: harness.Measured | None = None  # ...merged

    @property
    def key(self) -> str:
        return self.ordering.prefix + self.kind

    def latency(self, percentile: float) -> float:
        """The median of the slices' latencies at `percentile`, in ms."""
        assert self.target is not None
        return statistics.median(self.target.per_slice(percentile))

    @property
    def p50(self) -> float:
        return self.latency(50)


def build_cases(db: Path, rows: int, with_offset: bool) -> list[Case]:
    """Per ordering, the first page and a cursor page at each depth; and offset=90% of
    the default ordering for contrast."""
    with contextlib.closing(databases.read_only(db)) as conn:
        key = bytes(conn.execute("SELECT cursor_key FROM sync_state").fetchone()[0])
        # As the server signs for an unscoped token, which the benchmark uses.
        codec = CursorCodec(key).for_scope(None)
        cases = []
        for ordering in ORDERINGS:
            if ordering.order_by is None:
                query = ApplicantQuery(limit=LIMIT)  # the defaults: created_at desc
                first_path = "/v1/applicants"
            else:
                query = ApplicantQuery(limit=LIMIT, order_by=parse_order_by(ordering.order_by))
                first_path = "/v1/applicants?" + urllib.parse.urlencode(
                    {"order-by": ordering.order_by}
                )

            def page_ids(offset: int, order_sql: str = ordering.sql) -> list[str]:
                return [
                    row[0]
                    for row in conn.execute(
                        f"SELECT id FROM applicants {order_sql} LIMIT ? OFFSET ?",
                        (LIMIT, offset),
                    )
                ]

            cases.append(
                Case(ordering, "first", "first page (no cursor)", first_path, 0, page_ids(0))
            )
            for depth in DEPTHS:
                position = int(rows * depth)
                say(f"making the cursor at {depth:.0%} of {ordering.name} (position {position:,})")
                # The total order's key values of the record before, as SQL stores them.
                after = conn.execute(
                    f"SELECT {', '.join(order_columns(query.order_by))} FROM applicants "
                    f"{ordering.sql} LIMIT 1 OFFSET ?",
                    (position - 1,),
                ).fetchone()
                cursor = codec.encode(cursor_state(query, position, after))
                cases.append(
                    Case(
                        ordering,
                        f"cursor_{round(depth * 100)}",
                        f"cursor at {depth:.0%}",
                        "/v1/applicants?" + urllib.parse.urlencode({"cursor": cursor}),
                        position,
                        page_ids(position),
                    )
                )
            if with_offset and ordering.order_by is None:
                position = int(rows * DEPTHS[-1])
                cases.append(
                    Case(
                        ordering,
                        "offset_90",
                        f"offset={position:,} (offset pagination, for contrast)",
                        f"/v1/applicants?offset={position}",
                        position,
                        page_ids(position),
                    )
                )
    return cases


# --------------------------------------------------------------------------- measuring


def check_case(base: str, token: str, case: Case) -> None:
    """The served page is the SQL page at that position, with a next cursor."""
    status, raw = harness.http_get(base + case.path, token)
    if status != 200:
        raise RuntimeError(f"{case.label}: HTTP {status}: {raw[:300]!r}")
    body = json.loads(raw)
    served = [record["id"] for record in body["results"]]
    if served != case.expected_ids:
        raise RuntimeError(f"{case.label}: the served page is not the page at {case.position:,}")
    if body["meta"]["offset"] != case.position or not body["meta"].get("next"):
        raise RuntimeError(f"{case.label}: unexpected meta {body['meta']}")
    case.body_bytes = len(raw)


def measure(
    base: str, token: str, cases: list[Case], slices: int, slice_seconds: int, warmup: int
) -> None:
    """Warm every page up (caches, the count cache, the OS page cache), then measure them
    in turns, slice by slice, starting each slice with the next page."""
    targets = [WrkTarget(case.key, base + case.path, token) for case in cases]
    for case, target in zip(cases, targets, strict=True):
        case.target = target
        target.run(warmup, keep=False)
    for index in range(slices):
        shift = index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            target.run(slice_seconds)
        say(
            f"slice {index + 1}/{slices}: "
            + ", ".join(f"{t.name} {t.per_slice(50)[-1]:.2f} ms" for t in targets)
        )
    for case, target in zip(cases, targets, strict=True):
        case.measured = target.measured()


@dataclass
class Walk:
    """The measured pages of one database, and how they were measured."""

    rows: int
    cases: list[Case]
    slices: int
    slice_seconds: int
    warmup: int
    loads: tuple[str, str]  # load average before, after

    def first_page(self, case: Case) -> Case:
        """The first page of the case's ordering."""
        return next(c for c in self.cases if c.ordering == case.ordering and c.kind == "first")

    def ratios(self) -> dict[str, float]:
        """Per ordering: p50 at the deepest cursor over its first page's."""
        return {
            case.ordering.name: case.p50 / self.first_page(case).p50
            for case in self.cases
            if case.kind == "cursor_90"
        }

    @property
    def ratio(self) -> float:
        """The worst ordering's p50 at the deepest cursor over its first page's."""
        return max(self.ratios().values())

    @property
    def passed(self) -> bool:
        return self.ratio <= TARGET

    def lines(self) -> list[str]:
        """One line a page, for a terminal."""
        out = []
        for case in self.cases:
            assert case.measured is not None
            out.append(
                f"{self.rows:>9,} {case.ordering.name:<26} {case.label:<38} "
                f"{case.measured.rps:7.0f} req/s  p50 {case.p50:7.2f} ms  "
                f"p99 {case.latency(99):7.2f} ms  "
                f"{case.p50 / self.first_page(case).p50:.2f}x the first page"
            )
        return out

    def summary(self) -> dict[str, Any]:
        """The figures, for a JSON file."""
        pages = []
        for case in self.cases:
            assert case.measured is not None
            pages.append(
                {
                    "page": case.key,
                    "ordering": case.ordering.name,
                    "label": case.label,
                    "path": case.path,
                    "position": case.position,
                    "body_bytes": case.body_bytes,
                    "rps": case.measured.rps,
                    "p50_ms": case.p50,
                    "p90_ms": case.latency(90),
                    "p99_ms": case.latency(99),
                    "errors": case.measured.errors,
                }
            )
        return {
            "rows": self.rows,
            "slices": self.slices,
            "slice_seconds": self.slice_seconds,
            "warmup": self.warmup,
            "load_before": self.loads[0],
            "load_after": self.loads[1],
            "pages": pages,
            "p50_deepest_over_first": self.ratio,
            "p50_deepest_over_first_by_ordering": self.ratios(),
            "target": TARGET,
            "passed": self.passed,
        }


def walk(
    db: Path,
    rows: int,
    base: str,
    token: str,
    *,
    slices: int,
    slice_seconds: int,
    warmup: int,
    with_offset: bool = True,
) -> Walk:
    """Make the cursors of `db` (served at `base`), check their pages, and measure them."""
    load_before = provenance.loadavg()
    cases = build_cases(db, rows, with_offset)
    for case in cases:
        check_case(base, token, case)
    measure(base, token, cases, slices, slice_seconds, warmup)
    return Walk(rows, cases, slices, slice_seconds, warmup, (load_before, provenance.loadavg()))


# --------------------------------------------------------------------------- report


def markdown(result: Walk, command: str) -> str:
    errors = sum(case.measured.errors for case in result.cases if case.measured)
    pages = table(
        "| ordering | page | position | req/s | p50 ms | p90 ms | p99 ms | body B "
        "| p50 x first page |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        (
            [f"`{case.ordering.name}`", case.label, f"{case.position:,}",
             f"{case.measured.rps:,.0f}", f"{case.p50:.2f}", f"{case.latency(90):.2f}",
             f"{case.latency(99):.2f}", f"{case.body_bytes:,}",
             f"{case.p50 / result.first_page(case).p50:.2f}"]
            for case in result.cases
            if case.measured is not None
        ),
    )  # fmt: skip
    by_ordering = ", ".join(f"`{name}` {ratio:.2f}x" for name, ratio in result.ratios().items())
    verdict = "PASS" if result.passed else "FAIL"
    target = text(
        "cursors", "target", target=TARGET, verdict=verdict, by_ordering=by_ordering, errors=errors
    )
    return section(
        "cursors",
        pages,
        target,
        when=provenance.now(),
        commit=provenance.git_commit(),
        command=command,
        rows=result.rows,
        limit=LIMIT,
        orderings=", ".join(f"`{o.name}`" for o in ORDERINGS),
        seconds=result.slices * result.slice_seconds,
        slices=result.slices,
        warmup=result.warmup,
        load_before=result.loads[0],
        load_after=result.loads[1],
        machine=provenance.describe_machine("python", "sqlite", "wrk"),
        server_core=SERVER_CORE,
        client_core=CLIENT_CORE,
        connections=CONNECTIONS,
    )
