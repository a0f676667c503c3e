"""`make bench`: the list path against its floors (issue 4), offset depth, cursor walks,
what clients do, the query matrix and the read pool (issue 2). Method: sections.toml."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import clients
import cursor_depth
import databases
import floors
import harness
import matrix
import provenance
from cases import FULL, QUICK, SMOKE, Case, Dataset, Settings, offset_case, served_once, target_for
from harness import WrkTarget, say
from matrix import FULL_MATRIX, QUICK_MATRIX, SMOKE_MATRIX
from provenance import text
from report import CaseResult, Run, evaluate, markdown

POOL_SIZES = (1, 2, 4)


def measure_group(
    settings: Settings, group: list[tuple[Dataset, str, Case, str, bool]], floor_base: str = ""
) -> list[CaseResult]:
    """The group's cases (dataset, base URL, case, name, with its in-process floor) in
    interleaved slices, each with its HTTP floor when one serves at `floor_base`."""
    results, targets, in_process = [], [], []
    try:
        for dataset, base, case, name, with_floor in group:
            results.append(CaseResult(case, dataset.rows))
            body, results[-1].notes = served_once(base, dataset, case)
            results[-1].body_bytes = len(body)
            targets.append(target_for(base, dataset, case, name))
            if floor_base:
                url = f"{floor_base}/floor/{case.key}"
                targets.append(WrkTarget(f"HTTP floor {case.key}", url))
            if with_floor:
                in_process.append(floors.InProcessFloor(dataset.db, case, body, dataset.facts.ids))
        settings.interleave(targets, in_process)
    finally:
        for floor in in_process:
            floor.close()
    measured, floor_rates = iter(targets), iter(in_process)
    for result, (*_, with_floor) in zip(results, group, strict=True):
        result.served = next(measured).measured()
        result.http_floor = next(measured).measured() if floor_base else None
        if with_floor:
            floor = next(floor_rates)
            result.inprocess_rps, result.inprocess_variant = floor.rate, floor.variant
        say(result.line())
    return results


def measure_cases(
    settings: Settings, dataset: Dataset, base: str, cases: list[Case], floor_base: str = ""
) -> list[CaseResult]:
    """Each case interleaved with its HTTP floor (when a floor server runs) and in-process floor."""
    group = [[(dataset, base, case, f"{dataset.rows} {case.key}", True)] for case in cases]
    return [measure_group(settings, one, floor_base)[0] for one in group]


def save_bodies(base: str, dataset: Dataset, directory: Path) -> Path:
    """Each case's served body, for the HTTP floor to answer byte for byte."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for case in dataset.cases.values():
        (directory / f"{case.key}.json").write_bytes(served_once(base, dataset, case)[0])
    return directory


def measure_extras(
    settings: Settings, small: Dataset, base: str, floor_base: str
) -> list[dict[str, Any]]:
    """The HTTP floor with a 2-byte body, and list default as gzip-accepting clients get it."""
    tiny = WrkTarget("HTTP floor, 2-byte body", f"{floor_base}/floor/tiny")
    gzip = target_for(base, small, small.cases["list_default"], "list default, gzip")
    gzip.headers = ("Accept-Encoding: gzip",)
    settings.interleave([tiny, gzip])
    notes = (text("list", "tiny"), text("list", "gzip", wire=gzip.measured().wire_bytes))
    extras = []
    for target, note in zip((tiny, gzip), notes, strict=True):
        m = target.measured()
        extras.append({"name": target.name, "note": note, **asdict(m)})
        say(f"  {target.name}: {m.rps:7.0f} req/s  p50 {m.p50_ms:.2f} ms  p99 {m.p99_ms:.2f} ms")
    return extras


def measure_scale(
    settings: Settings, small: Dataset, base: str, big: Dataset, big_base: str
) -> list[CaseResult]:
    """The small list default again, in turns with the big database's cases."""
    say(f"{big.rows:,} rows against {small.rows:,}, interleaved")
    group = [(small, base, small.cases["list_default"], "100k list_default", False)]
    for key in ("list_default", "offset_90", "get_by_id"):
        group.append((big, big_base, big.cases[key], f"1m {key}", True))
    return measure_group(settings, group)


def measure_depth(
    settings: Settings, dataset: Dataset, base: str, known: list[CaseResult]
) -> list[CaseResult]:
    """p50 against offset depth, the default order."""
    say(f"{dataset.rows:,} rows: p50 against offset depth")
    cases = [offset_case(dataset.rows, f) for f in settings.offsets[dataset.rows]]
    known_depths = [r for r in known if r.case.key in ("list_default", "offset_90")]
    measured = [*known_depths, *measure_cases(settings, dataset, base, cases)]
    return sorted(measured, key=lambda r: r.case.offset)


def measure_pool(settings: Settings, small: Dataset, work: Path) -> list[dict[str, Any]]:
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
            case = small.cases[key]
            targets = [target_for(bases[n], small, case, f"pool {n} {key}") for n in POOL_SIZES]
            settings.interleave(targets)
            for size, target in zip(POOL_SIZES, targets, strict=True):
                m = target.measured()
                figures.append({"read_connections": size, "case": key, **asdict(m)})
                say(
                    f"  read connections {size}: {case.label:<18} {m.rps:7.0f} req/s  "
                    f"p50 {m.p50_ms:6.2f} ms  p99 {m.p99_ms:6.2f} ms"
                )
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
        bodies = save_bodies(base, small, work / "floor-bodies")
        floor_base = stack.enter_context(floors.floor_server(bodies, work)).base
        big_base = ""
        if big:
            big_base = stack.enter_context(serve("leasestar-1m", big.db, work=work)).base
        say(f"{small.rows:,} rows: every case against its floors")
        run.cases[small.rows] = measure_cases(
            settings, small, base, [*small.cases.values()], floor_base
        )
        run.extras = measure_extras(settings, small, base, floor_base)
        if big:
            run.scale = measure_scale(settings, small, base, big, big_base)
            run.cases[big.rows] = run.scale[1:]
            by_key = {r.case.key: r for r in run.cases[small.rows]}
            for result in run.scale[1:]:
                # The HTTP floor depends on the body's size only; offset 90% differs.
                if result.case.key != "offset_90":
                    result.http_floor = by_key[result.case.key].http_floor
        served = [(small, base), *([(big, big_base)] if big else [])]
        for dataset, dataset_base in served:
            run.depth[dataset.rows] = measure_depth(
                settings, dataset, dataset_base, run.cases[dataset.rows]
            )
        for dataset, dataset_base in served:  # issue 15: what clients do
            result = clients.build(dataset_base, floor_base, dataset, work, settings.cursor_pages)
            clients.measure(settings, dataset, dataset_base, result)
            run.clients.append(result)
        if settings.cursors and big:
            say(f"{big.rows:,} rows: cursor walks at 10%, 50% and 90% depth (issue 7)")
            run.cursors = cursor_depth.walk(big.db, big.rows, big_base, big.tokens[False], settings)
        for (dataset, dataset_base), domain in zip(served, domains, strict=True):
            run.matrix.append(matrix.measure(dataset_base, dataset.db, domain, matrix_settings))
    if settings.pool:
        run.pool = measure_pool(settings, small, work)
    return run


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
    machine, versions = provenance.machine(), provenance.versions()
    report: dict[str, Any] = {
        **asdict(settings), "seconds": settings.seconds, "when": provenance.now(),
        "commit": provenance.git_commit(), "command": command or provenance.command(),
        "machine": ", ".join(f"{k} {v}" for k, v in machine.items()),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "load_before": provenance.loadavg(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }  # fmt: skip
    measuring = time.monotonic()
    run = run_benchmark(settings, outputs.work, matrix_settings)
    report["load_after"] = provenance.loadavg()
    report["elapsed"] = (
        f"measuring took {(time.monotonic() - measuring) / 60:.1f} min, "
        f"the whole run {(time.monotonic() - started) / 60:.1f} min"
    )
    targets = evaluate(run)
    for t in targets:
        print(f"  {t.verdict():<26} {t.name}: {t.measured:.2f}x (needs >= {t.need:.2f}x)")
    command, when = report["command"], report["when"]
    sections = [markdown(report, run, targets)]
    sections += [cursor_depth.markdown(run.cursors, command)] if run.cursors else []
    sections.append(clients.markdown(run.clients, settings, command, when))
    sections.append(matrix.markdown(run.matrix, command, when))
    for section in sections:
        provenance.publish(section, outputs.results_md)
    say(report["elapsed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
