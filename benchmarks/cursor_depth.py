"""Cursor walks at depth (issue 7): is the page at a deep cursor as fast as the first page?

Part of `make bench` (on its 1,000,000-row database and servers); on its own:

    .venv/bin/python benchmarks/cursor_depth.py [--rows N] [--seconds S] [--no-results]

Cursors at 10%, 50% and 90% depth of each ordering of `ORDERINGS` are made without
walking there: the record just before each depth is read with SQL, and the app's own
`key_values` and `cursor_state` are signed with the database's key. Each cursor page is
checked against the same page read by SQL with LIMIT/OFFSET, then every ordering's first
page, its three cursor pages and offset=90% of the default ordering are measured in
interleaved slices (wrk pinned to core 1, `leasestar serve` to core 0); a case's p50 is
the median of its slices' p50s. Writes the cursors section of RESULTS.md. Target: for
every ordering, p50 at 90% within 1.5x of its first page.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import databases
import harness
import provenance
from harness import CLIENT_CORE, CONNECTIONS, SERVER_CORE, WrkTarget, say

from leasestar.applicants.bodies import register_json_body
from leasestar.applicants.cursors import CursorCodec, key_values
from leasestar.applicants.ordering import total_order
from leasestar.applicants.query import ApplicantQuery, cursor_state, parse_order_by

BEGIN, END = "<!-- BEGIN cursors -->", "<!-- END cursors -->"
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
        register_json_body(conn)
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
                body, change_seq = conn.execute(
                    f"SELECT json_body(body), change_seq FROM applicants {ordering.sql} "
                    "LIMIT 1 OFFSET ?",
                    (position - 1,),
                ).fetchone()
                after = key_values(total_order(query.order_by), body, change_seq)
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
    cases = result.cases
    verdict = "PASS" if result.passed else "FAIL"
    orderings = ", ".join(f"`{o.name}`" for o in ORDERINGS)
    seconds = result.slices * result.slice_seconds
    lines = [
        BEGIN,
        "## Cursor walks at depth (issue 7)",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on commit `{provenance.git_commit()}` with "
        f"`{command}`: {result.rows:,} applicants, pages of {LIMIT} in the orderings "
        f"{orderings}; {seconds} measured seconds per case in {result.slices} "
        f"interleaved slices after a {result.warmup} s warm-up; load average "
        f"{result.loads[0]} before, {result.loads[1]} after.",
        "",
        f"**Machine**: {provenance.describe_machine('python', 'sqlite', 'wrk')}. The machine is "
        "shared with other work: absolute figures move with it, the interleaved ratios much "
        "less.",
        "",
        "**Method**: `leasestar serve` (uvicorn, one worker, `LEASESTAR_RATE_LIMIT=off`) "
        f"pinned to core {SERVER_CORE}; wrk (`-t1 -c{CONNECTIONS}`) pinned to core "
        f"{CLIENT_CORE}. Each cursor is the app's own (`cursor_state` signed by "
        "`CursorCodec` with the database's key) for the record just before the depth, "
        "so no walk is needed to get there; before measuring, each page is checked to be "
        "the SQL page at that position (the ordering written out from the contract, e.g. "
        "`ORDER BY created_at DESC, id DESC LIMIT/OFFSET`). The nullable orderings are the "
        "ones whose cursors cross a null block (the trailing nulls of a descending walk, "
        "the leading ones of an ascending walk). p50 is the median of the slices' p50s.",
        "",
        "| ordering | page | position | req/s | p50 ms | p90 ms | p99 ms | body B "
        "| p50 x first page |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors = 0
    for case in cases:
        assert case.measured is not None
        errors += case.measured.errors
        lines.append(
            f"| `{case.ordering.name}` | {case.label} | {case.position:,} | "
            f"{case.measured.rps:,.0f} | {case.p50:.2f} | "
            f"{case.latency(90):.2f} | {case.latency(99):.2f} | "
            f"{case.body_bytes:,} | {case.p50 / result.first_page(case).p50:.2f} |"
        )
    by_ordering = ", ".join(f"`{name}` {ratio:.2f}x" for name, ratio in result.ratios().items())
    lines += [
        "",
        f"**Target** (issue 7 item 3): for every ordering, p50 at 90% depth within {TARGET}x "
        f"of its first page: **{verdict}** ({by_ordering}). Non-2xx or socket errors during "
        f"the run: {errors}.",
        "",
        "The offset row is for contrast only: this reader serves deep offsets from "
        "checkpoints of the ordering (kept per data version), so they are fast too at "
        "steady state; but an offset walk skips or repeats records when writes land "
        "between its pages, which a cursor walk never does "
        "(tests/applicants/test_cursor_properties.py).",
        "",
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="database size")
    parser.add_argument("--seconds", type=int, default=9, help="measured seconds per case")
    parser.add_argument("--slices", type=int, default=3, help="interleaved slices per case")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up seconds per case")
    parser.add_argument("--no-offset", action="store_true", help="skip the offset=90%% case")
    parser.add_argument("--no-results", action="store_true", help="do not write RESULTS.md")
    parser.add_argument(
        "--work",
        type=Path,
        default=harness.WORK,
        help="where the database and the server log go (default benchmarks/work)",
    )
    args = parser.parse_args(argv)
    work = args.work.resolve()
    harness.raise_priority()
    harness.ensure_wrk()
    command = ".venv/bin/python benchmarks/cursor_depth.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    db = databases.ensure_database(args.rows, work)
    token = databases.create_token(db, "cursor-depth")
    with harness.leasestar_server("cursor-depth", db, work=work) as served:
        result = walk(
            db,
            args.rows,
            served.base,
            token,
            slices=args.slices,
            slice_seconds=max(1, round(args.seconds / args.slices)),
            warmup=args.warmup,
            with_offset=not args.no_offset,
        )
    section = markdown(result, command)
    print(section)
    if not args.no_results:
        provenance.write_section(section)
        say(f"wrote the cursors section of {provenance.shown(provenance.RESULTS_MD)}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
