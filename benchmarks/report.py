"""The list benchmark's figures, issue 4's targets, and the list section rendered from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import clients
import cursor_depth
import harness
import matrix
from cases import Case
from harness import BENCH, CLIENT_CORE, CONNECTIONS, SERVER_CORE, SERVER_ENV
from provenance import section, table, text

NOTES = BENCH / "list-notes.md"  # hand-written analysis of a run, kept with the figures
# Issue 4 item 3: (case, what its req/s is taken against, the ratio it needs).
TARGETS = (
    ("list_default", "composite", 0.7), ("limit_250", "composite", 0.7),
    ("get_by_id", "composite", 0.5), ("updated_window", "list_default", 0.5),
    ("property_filter", "list_default", 0.5), ("order_two_keys", "list_default", 0.5),
    ("scoped_token", "list_default", 0.5),
)  # fmt: skip


@dataclass
class CaseResult:
    case: Case
    rows: int
    body_bytes: int = 0
    served: harness.Measured | None = None
    http_floor: harness.Measured | None = None
    inprocess_rps: float | None = None
    inprocess_variant: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def composite(self) -> float | None:
        if self.http_floor is None or not self.http_floor.rps or not self.inprocess_rps:
            return None
        return 1 / (1 / self.http_floor.rps + 1 / self.inprocess_rps)

    @property
    def ratio(self) -> float | None:
        composite = self.composite
        return self.served.rps / composite if self.served and composite else None

    def line(self) -> str:
        m, floor, in_process = self.served, self.http_floor, self.inprocess_rps
        assert m is not None
        return (
            f"{self.rows:>9,} {self.case.label:<38} {m.rps:7.0f} req/s  p50 {m.p50_ms:7.2f} ms  "
            f"p99 {m.p99_ms:7.2f} ms  {self.body_bytes:>7,} B"
            + (f" | HTTP floor {floor.rps:6.0f}" if floor else "")
            + (f" | in-process {in_process:6.0f} ({self.inprocess_variant})" if in_process else "")
            + (f" | {self.ratio:.2f}x composite" if self.ratio else "")
        )


@dataclass
class Run:
    small: int  # the rows of the database every case runs on
    big: int | None  # the rows of the scale, depth and cursor cases' database
    cases: dict[int, list[CaseResult]] = field(default_factory=dict)
    depth: dict[int, list[CaseResult]] = field(default_factory=dict)
    scale: list[CaseResult] = field(default_factory=list)  # 100k and 1M, interleaved
    pool: list[dict[str, Any]] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)
    cursors: cursor_depth.Walk | None = None  # on the big database, in a full run
    matrix: list[matrix.MatrixResult] = field(default_factory=list)  # per database (issue 17)
    clients: list[clients.ClientsResult] = field(default_factory=list)  # per database (issue 15)


@dataclass
class Target:
    name: str
    measured: float
    need: float

    def verdict(self) -> str:
        if self.measured >= self.need:
            return "PASS"
        if self.measured <= 0:
            return "MISS (nothing served)"
        return f"MISS ({(self.need - self.measured) / self.need:.0%} short)"


def evaluate(run: Run) -> list[Target]:
    targets: list[Target] = []
    by_key = {r.case.key: r for r in run.cases[run.small]}
    for key, against, need in TARGETS:
        result, reference = by_key[key], by_key.get(against)
        if reference is None and result.ratio is not None:
            targets.append(
                Target(f"{result.case.label} vs its composite floor", result.ratio, need)
            )
        elif reference and result.served and reference.served:
            name = f"{result.case.label} vs {reference.case.label}"
            targets.append(Target(name, result.served.rps / reference.served.rps, need))
    if run.scale:
        paired, default, deep = (
            r.served or harness.Measured(0, 0, 0, 0, 0, 0, 0) for r in run.scale[:3]
        )
        name = f"list default at {run.big:,} rows vs at {run.small:,} (interleaved)"
        targets.append(Target(name, default.rps / paired.rps, 0.85))
        name = f"offset 90% at {run.big:,} rows vs offset 0"
        targets.append(Target(name, deep.rps / default.rps, 0.2))
    return targets


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def case_table(results: list[CaseResult], with_rows: bool = False) -> str:
    rows = [
        [*([f"{r.rows:,}"] if with_rows else []), r.case.label, fmt(r.served.rps),
         f"{r.served.p50_ms:.2f}", f"{r.served.p99_ms:.2f}", f"{r.body_bytes:,}",
         f"{r.served.wire_bytes:,.0f}", fmt(r.inprocess_rps),
         fmt(r.http_floor.rps if r.http_floor else None), fmt(r.composite), fmt(r.ratio, 2)]
        for r in results
        if r.served is not None
    ]  # fmt: skip
    return table(text("list", "scale_columns" if with_rows else "columns"), rows)


def markdown(report: dict[str, Any], run: Run, targets: list[Target]) -> str:
    extras = "\n".join(
        f"- {x['name']}: {x['rps']:,.0f} req/s, p50 {x['p50_ms']:.2f} ms, "
        f"p99 {x['p99_ms']:.2f} ms ({x['note']})."
        for x in run.extras
    )
    scale = "\n\n".join(
        [f"### {run.big:,} applicants, interleaved with {run.small:,}", text("list", "scale"),
         case_table(run.scale, with_rows=True)]
    ) if run.scale else ""  # fmt: skip
    verdicts = table(
        text("list", "target_columns"),
        ([t.name, f"{t.measured:.2f}x", f">= {t.need:.2f}x", t.verdict()] for t in targets),
    )
    depth = table(
        text("list", "depth_columns"),
        (
            [f"{rows:,}", f"{r.case.offset:,}", f"{r.served.rps:,.0f}", f"{r.served.p50_ms:.2f}",
             f"{r.served.p99_ms:.2f}", fmt(r.inprocess_rps)]
            for rows, series in run.depth.items()
            for r in series
            if r.served is not None
        ),
    )  # fmt: skip
    pool = "Not measured in a --quick run."
    if run.pool:
        pool = text("list", "pool", rows=run.small) + "\n\n" + table(
            text("list", "pool_columns"),
            ([p["read_connections"], p["case"], f"{p['rps']:,.0f}", f"{p['p50_ms']:.2f}",
              f"{p['p99_ms']:.2f}"] for p in run.pool),
        )  # fmt: skip
    notes = [n for rs in run.cases.values() for r in rs for n in r.notes]
    return section(
        "list", f"### {run.small:,} applicants", case_table(run.cases[run.small]), extras, scale,
        "### Targets (issue 4 item 3)", verdicts, text("list", "total"),
        "### p50 against offset depth (default order, created_at desc)", depth,
        "### One read connection or a pool (issue 2)", pool,
        "**Correctness problems seen during the run**: " + "; ".join(notes) if notes else "",
        # Hand-written analysis of a run (profile, misses, suggestions): kept with the figures.
        NOTES.read_text().rstrip("\n") if NOTES.exists() else "",
        **report, server_env=", ".join(f"`{k}={v}`" for k, v in SERVER_ENV.items()),
        server_core=SERVER_CORE, client_core=CLIENT_CORE, connections=CONNECTIONS,
    )  # fmt: skip
