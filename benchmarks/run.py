"""`make bench`: the list path against its floors (issue 4), offset depth, cursor walks,
what clients do, the query matrix and the read pool (issue 2). Method: sections.toml."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import clients
import cursor_depth
import databases
import floors
import harness
import matrix
import provenance
from cases import FULL, QUICK, SMOKE, Case, Dataset, Settings, offset_case, served_once
from harness import BENCH, CLIENT_CORE, CONNECTIONS, SERVER_CORE, SERVER_ENV, WrkTarget, say
from matrix import FULL_MATRIX, QUICK_MATRIX, SMOKE_MATRIX
from provenance import section, table, text
from report import Measurement, list_case, measure, table_rows, targets

POOL_SIZES = (1, 2, 4)
NOTES = BENCH / "list-notes.md"  # hand-written analysis of a run, kept with the figures
# Issue 4 item 3: (case, what its req/s is taken against, the ratio it needs).
TARGETS = (
    ("list_default", "composite", 0.7), ("limit_250", "composite", 0.7),
    ("get_by_id", "composite", 0.5), ("updated_window", "list_default", 0.5),
    ("property_filter", "list_default", 0.5), ("order_two_keys", "list_default", 0.5),
    ("scoped_token", "list_default", 0.5),
)  # fmt: skip


@dataclass
class Run:
    small: int  # the rows of the database every case runs on
    big: int | None  # the rows of the scale, depth and cursor cases' database
    cases: dict[int, list[Measurement]] = field(default_factory=dict)
    depth: dict[int, list[Measurement]] = field(default_factory=dict)
    scale: list[Measurement] = field(default_factory=list)  # 100k and 1M, interleaved
    pool: list[tuple[int, Measurement]] = field(default_factory=list)  # (read connections, case)
    extras: list[tuple[Measurement, str]] = field(default_factory=list)  # (case, note)
    cursors: cursor_depth.Walk | None = None  # on the big database, in a full run
    matrix: list[matrix.MatrixResult] = field(default_factory=list)  # per database (issue 17)
    clients: list[clients.Clients] = field(default_factory=list)  # per database (issue 15)


def measure_alone(
    settings: Settings, dataset: Dataset, base: str, cases: list[Case], floor_base: str = ""
) -> list[Measurement]:
    """Each case interleaved with its floors, one case at a time."""
    found = [list_case(base, dataset, case, floor_base) for case in cases]
    for m in found:
        measure(settings, [m])
    return found


def measure_extras(
    settings: Settings, small: Dataset, base: str, floor_base: str
) -> list[tuple[Measurement, str]]:
    """The HTTP floor with a 2-byte body, and list default as gzip-accepting clients get it."""
    tiny = WrkTarget("HTTP floor, 2-byte body", f"{floor_base}/floor/tiny")
    gzip = list_case(base, small, small.cases["list_default"], in_process=False)
    gzip.label, gzip.target.headers = "list default, gzip", ("Accept-Encoding: gzip",)
    extras = [Measurement(tiny.name, tiny, small.rows), gzip]
    measure(settings, extras)
    assert gzip.served is not None
    notes = (text("list", "tiny"), text("list", "gzip", wire=gzip.served.wire_bytes))
    return list(zip(extras, notes, strict=True))


def measure_scale(
    settings: Settings, small: Dataset, base: str, big: Dataset, big_base: str
) -> list[Measurement]:
    """The small list default again, in turns with the big database's cases."""
    say(f"{big.rows:,} rows against {small.rows:,}, interleaved")
    paired = list_case(base, small, small.cases["list_default"], in_process=False)
    group = [list_case(big_base, big, big.cases[key]) for key in ("list_default", "offset_90")]
    group += [list_case(big_base, big, big.cases["get_by_id"])]
    for m, against, need in zip(group[:2], (paired, group[0]), (0.85, 0.2), strict=True):
        m.against, m.need = against, need
    measure(settings, [paired, *group])
    return [paired, *group]


def measure_depth(
    settings: Settings, dataset: Dataset, base: str, known: list[Measurement]
) -> list[Measurement]:
    """p50 against offset depth, the default order."""
    say(f"{dataset.rows:,} rows: p50 against offset depth")
    cases = [offset_case(dataset.rows, f) for f in settings.offsets[dataset.rows]]
    known_depths = [m for m in known if m.case and m.case.key in ("list_default", "offset_90")]
    measured = [*known_depths, *measure_alone(settings, dataset, base, cases)]
    return sorted(measured, key=lambda m: m.case.offset if m.case else 0)


def measure_pool(settings: Settings, small: Dataset, work: Path) -> list[tuple[int, Measurement]]:
    """Issue 2's question: one read connection against a small pool."""
    say(f"{small.rows:,} rows: one read connection or a pool (LEASESTAR_READ_CONNECTIONS)")
    figures = []
    with contextlib.ExitStack() as stack:
        bases = {}
        for n in POOL_SIZES:
            env = {"LEASESTAR_READ_CONNECTIONS": str(n)}
            server = harness.leasestar_server(f"pool-{n}", small.db, env, work=work)
            bases[n] = stack.enter_context(server).base
        for key in ("list_default", "get_by_id"):
            group = [
                (n, list_case(bases[n], small, small.cases[key], in_process=False))
                for n in POOL_SIZES
            ]
            measure(settings, [m for _, m in group])
            figures += group
    return figures


def run_benchmark(settings: Settings, work: Path, matrix_settings: matrix.MatrixSettings) -> Run:
    """Every measurement of the run, in the order the report shows them."""
    run = Run(settings.small, settings.big)
    small = Dataset.prepare(settings.small, work)
    big = Dataset.prepare(settings.big, work) if settings.big else None
    # The matrix's tokens are made before the servers start, as the cases' are.
    domains = [matrix.prepare(d.db, d.rows) for d in (small, big) if d is not None]
    with contextlib.ExitStack() as stack:
        serve = harness.leasestar_server
        base = stack.enter_context(serve("leasestar-100k", small.db, work=work)).base
        bodies = {case.key: served_once(base, small, case)[0] for case in small.cases.values()}
        floor_base = stack.enter_context(floors.floor_server(bodies, work)).base
        big_base = ""
        if big:
            big_base = stack.enter_context(serve("leasestar-1m", big.db, work=work)).base
        say(f"{small.rows:,} rows: every case against its floors")
        cases = [*small.cases.values()]
        run.cases[small.rows] = measure_alone(settings, small, base, cases, floor_base)
        by_key = {m.case.key: m for m in run.cases[small.rows] if m.case}
        for key, against, need in TARGETS:
            by_key[key].against, by_key[key].need = by_key.get(against), need
        run.extras = measure_extras(settings, small, base, floor_base)
        if big:
            run.scale = measure_scale(settings, small, base, big, big_base)
            run.cases[big.rows] = run.scale[1:]
            for m in run.scale[1:]:
                # The HTTP floor depends on the body's size only; offset 90% differs.
                if m.case and m.case.key != "offset_90":
                    m.http = by_key[m.case.key].http
        served = [(small, base), *([(big, big_base)] if big else [])]
        for dataset, dataset_base in served:
            known = run.cases[dataset.rows]
            run.depth[dataset.rows] = measure_depth(settings, dataset, dataset_base, known)
        for dataset, dataset_base in served:  # issue 15: what clients do
            run.clients.append(clients.measure(settings, dataset_base, floor_base, dataset, work))
        if settings.cursors and big:
            say(f"{big.rows:,} rows: cursor walks at 10%, 50% and 90% depth (issue 7)")
            run.cursors = cursor_depth.walk(big, big_base, settings)
        for (dataset, dataset_base), domain in zip(served, domains, strict=True):
            run.matrix.append(matrix.measure(dataset_base, dataset.db, domain, matrix_settings))
    if settings.pool:
        run.pool = measure_pool(settings, small, work)
    return run


def markdown(report: dict[str, Any], run: Run, verdicts: list[list[str]]) -> str:
    extras = (text("list", "extra", **m.fields(), note=note) for m, note in run.extras)
    scale = "\n\n".join(
        [f"### {run.big:,} applicants, interleaved with {run.small:,}", text("list", "scale"),
         table(text("list", "scale_columns"), table_rows("list", "scale_row", run.scale))]
    ) if run.scale else ""  # fmt: skip
    depths = [m for series in run.depth.values() for m in series]
    depth = table(text("list", "depth_columns"), table_rows("list", "depth_row", depths))
    pool = "Not measured in a --quick run."
    if run.pool:
        pool_rows = [[text("list", "pool_row", **m.fields(), connections=n)] for n, m in run.pool]
        pool = text("list", "pool", rows=run.small) + "\n\n"
        pool += table(text("list", "pool_columns"), pool_rows)
    notes = [n for group in run.cases.values() for m in group for n in m.notes]
    return section(
        "list", f"### {run.small:,} applicants",
        table(text("list", "columns"), table_rows("list", "case_row", run.cases[run.small])),
        "\n".join(extras), scale, "### Targets (issue 4 item 3)",
        table(text("list", "target_columns"), verdicts), text("list", "total"),
        "### p50 against offset depth (default order, created_at desc)", depth,
        "### One read connection or a pool (issue 2)", pool,
        "**Correctness problems seen during the run**: " + "; ".join(notes) if notes else "",
        # Hand-written analysis of a run (profile, misses, suggestions): kept with the figures.
        NOTES.read_text().rstrip("\n") if NOTES.exists() else "",
        **report, server_env=", ".join(f"`{k}={v}`" for k, v in SERVER_ENV.items()),
        server_core=SERVER_CORE, client_core=CLIENT_CORE, connections=CONNECTIONS,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="leasestar's list path against its floors")
    parser.add_argument("--quick", action="store_true", help="100k rows only, 3 s per case")
    args, outputs = provenance.options(parser, {"quick": False, "rows": None}, argv, rows=None)
    settings, matrix_settings = (QUICK, QUICK_MATRIX) if args.quick else (FULL, FULL_MATRIX)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    command = {"": "make bench", "--quick": "make bench BENCH_ARGS=--quick"}.get(given)
    if args.rows:
        if not args.quick:
            parser.error("--rows goes with --quick")
        settings = replace(settings, sizes=(args.rows,), offsets={args.rows: (0.1, 0.5)})
    if args.smoke:
        settings, matrix_settings = SMOKE, SMOKE_MATRIX
    started = time.monotonic()
    for rows in settings.sizes:
        # All seeding first: it must not overlap a measurement.
        databases.ensure_database(rows, outputs.work)
    report: dict[str, Any] = {
        **asdict(settings), "seconds": settings.seconds, "when": provenance.now(),
        "command": command or provenance.command(),
        "versions": ", ".join(f"{k} {v}" for k, v in provenance.versions().items()),
        "load_before": provenance.loadavg(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }  # fmt: skip
    measuring = time.monotonic()
    run = run_benchmark(settings, outputs.work, matrix_settings)
    report["load_after"] = provenance.loadavg()
    report["elapsed"] = (
        f"measuring took {(time.monotonic() - measuring) / 60:.1f} min, "
        f"the whole run {(time.monotonic() - started) / 60:.1f} min"
    )
    order = [key for key, *_ in TARGETS]  # issue 4's targets in its order, then the scale's
    small = sorted((m for m in run.cases[run.small] if m.need), key=lambda m: order.index(m.key))
    verdicts = targets([*small, *run.scale])
    for what, measured, needs, verdict in verdicts:
        print(f"  {verdict:<26} {what}: {measured} (needs {needs})")
    command, when = report["command"], report["when"]
    sections = [markdown(report, run, verdicts)]
    sections += [cursor_depth.markdown(run.cursors, command)] if run.cursors else []
    sections.append(clients.markdown(run.clients, settings, command, when))
    sections.append(matrix.markdown(run.matrix, command, when))
    for text_of_section in sections:
        provenance.publish(text_of_section, outputs.results_md)
    say(report["elapsed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
