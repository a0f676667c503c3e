"""Cursor walks at depth (issue 7): cursors at 10/50/90% of each ordering, made without
walking there, each page checked against SQL, measured in turns. Method: sections.toml."""

from __future__ import annotations

import contextlib
import json
import statistics
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import databases
import harness
import provenance
import report
from cases import Settings
from harness import CLIENT_CORE, CONNECTIONS, SERVER_CORE, WrkTarget, say
from provenance import section, table, text

from leasestar.applicants.cursors import CursorCodec
from leasestar.applicants.ordering import order_columns
from leasestar.applicants.query import ApplicantQuery, cursor_state, parse_order_by

DEPTHS = (0.1, 0.5, 0.9)
LIMIT = 100  # the default page size
TARGET = 1.5


# `order-by` (None: the default) and its SQL from the contract (nulls first ascending,
# last descending; the id key in the last key's direction). The nullable keys' cursors
# once made SQLite scan the index from its far end: ~10% of emails are null (90% desc is
# in the block), ~55% of middle names (10%, 50% asc).
DEFAULT = "created_at:desc (default)"
ORDERINGS = {
    None: "ORDER BY created_at DESC, id DESC",
    "email_1:desc": "ORDER BY email_1 DESC, id DESC",
    "middle_name:asc": "ORDER BY middle_name ASC, id ASC",
}


@dataclass
class Case:
    ordering: str  # its name
    kind: str  # first, cursor_10, cursor_50, cursor_90 or offset_90
    label: str
    position: int
    expected_ids: list[str] = field(repr=False)
    target: WrkTarget = field(repr=False)
    body_bytes: int = 0

    def latency(self, percentile: float) -> float:
        """The median of the slices' latencies at `percentile`, in ms."""
        return statistics.median(self.target.per_slice(percentile))


def build_cases(db: Path, rows: int, base: str, token: str) -> list[Case]:
    """Per ordering the first page and a cursor at each depth; offset 90% for contrast."""
    with contextlib.closing(databases.read_only(db)) as conn:
        key = bytes(conn.execute("SELECT cursor_key FROM sync_state").fetchone()[0])
        # As the server signs for an unscoped token, which the benchmark uses.
        codec = CursorCodec(key).for_scope(None)
        cases = []
        for given, order_sql in ORDERINGS.items():
            name = given or DEFAULT
            order_by = parse_order_by(given) if given else None
            query = ApplicantQuery(limit=LIMIT, **({"order_by": order_by} if order_by else {}))
            first = "?" + urllib.parse.urlencode({"order-by": given}) if given else ""
            pages = [("first", "first page (no cursor)", first, 0)]
            for depth in DEPTHS:
                position = int(rows * depth)
                say(f"making the cursor at {depth:.0%} of {name} (position {position:,})")
                # The total order's key values of the record before, as SQL stores them.
                after = conn.execute(
                    f"SELECT {', '.join(order_columns(query.order_by))} FROM applicants "
                    f"{order_sql} LIMIT 1 OFFSET ?",
                    (position - 1,),
                ).fetchone()
                cursor = codec.encode(cursor_state(query, position, after))
                query_string = "?" + urllib.parse.urlencode({"cursor": cursor})
                kind = f"cursor_{round(depth * 100)}"
                pages.append((kind, f"cursor at {depth:.0%}", query_string, position))
            if order_by is None:
                position = int(rows * DEPTHS[-1])
                label = f"offset={position:,} (offset pagination, for contrast)"
                pages.append(("offset_90", label, f"?offset={position}", position))
            for kind, label, query_string, position in pages:
                sql = f"SELECT id FROM applicants {order_sql} LIMIT ? OFFSET ?"
                ids = [row[0] for row in conn.execute(sql, (LIMIT, position))]
                url = f"{base}/v1/applicants{query_string}"
                target = WrkTarget(f"{name} {kind}", url, token)
                cases.append(Case(name, kind, label, position, ids, target))
    return cases


def check_case(token: str, case: Case) -> None:
    """The served page is the SQL page at that position, with a next cursor."""
    raw = harness.get_ok(case.target.url, token)
    body = json.loads(raw)
    served = [record["id"] for record in body["results"]]
    if served != case.expected_ids:
        raise RuntimeError(f"{case.label}: the served page is not the page at {case.position:,}")
    if body["meta"]["offset"] != case.position or not body["meta"].get("next"):
        raise RuntimeError(f"{case.label}: unexpected meta {body['meta']}")
    case.body_bytes = len(raw)


@dataclass
class Walk:
    rows: int
    cases: list[Case]
    settings: Settings
    loads: tuple[str, str]  # load average before, after

    def x_first(self, case: Case) -> float:
        """Its p50 over its ordering's first page's."""
        first = next(c for c in self.cases if c.ordering == case.ordering and c.kind == "first")
        return case.latency(50) / first.latency(50)

    def ratios(self) -> dict[str, float]:
        """Per ordering: p50 at the deepest cursor over its first page's."""
        return {c.ordering: self.x_first(c) for c in self.cases if c.kind == "cursor_90"}


def walk(db: Path, rows: int, base: str, token: str, settings: Settings) -> Walk:
    """The cursors made and their pages checked, then every page warmed up (caches, the
    count cache, the OS page cache) and measured in turns, each round rotated by one."""
    load_before, started = provenance.loadavg(), time.monotonic()
    cases = build_cases(db, rows, base, token)
    for case in cases:
        check_case(token, case)
    targets = [case.target for case in cases]

    def progress(index: int) -> None:
        latencies = (f"{t.name} {t.per_slice(50)[-1]:.2f} ms" for t in targets)
        say(f"slice {index + 1}/{settings.slices}: " + ", ".join(latencies))

    harness.interleave(
        targets, settings.slices, settings.slice_seconds, settings.warmup,
        order="rotate", after_round=progress,
    )  # fmt: skip
    result = Walk(rows, cases, settings, (load_before, provenance.loadavg()))
    say(
        f"cursor walks took {time.monotonic() - started:.0f} s: p50 at 90% depth "
        f"{max(result.ratios().values()):.2f}x the first page's (needs <= {TARGET}x)"
    )
    return result


def markdown(result: Walk, command: str) -> str:
    measured = [case.target.measured() for case in result.cases]
    pages = [
        [text("cursors", "row", **vars(case), rps=m.rps, x_first=result.x_first(case),
              p50=case.latency(50), p90=case.latency(90), p99=case.latency(99))]
        for case, m in zip(result.cases, measured, strict=True)
    ]  # fmt: skip
    by_ordering = ", ".join(f"`{name}` {ratio:.2f}x" for name, ratio in result.ratios().items())
    verdict = report.verdict(max(result.ratios().values()), TARGET, at_most=True)
    errors = sum(m.errors for m in measured)
    target = text(
        "cursors", "target", target=TARGET, verdict=verdict, by_ordering=by_ordering, errors=errors
    )
    settings, orderings = result.settings, ", ".join(f"`{o or DEFAULT}`" for o in ORDERINGS)
    return section(
        "cursors", table(text("cursors", "columns"), pages), target, command=command,
        rows=result.rows, limit=LIMIT, orderings=orderings, seconds=settings.seconds,
        slices=settings.slices, warmup=settings.warmup, load_before=result.loads[0],
        load_after=result.loads[1], machine=provenance.describe_machine("python", "sqlite", "wrk"),
        server_core=SERVER_CORE, client_core=CLIENT_CORE, connections=CONNECTIONS,
    )  # fmt: skip
