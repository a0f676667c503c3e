"""`make bench`: the list path under wrk against its floors (issue 4), and what rides on
its servers: offset depth, cursor walks (`cursor_depth.py`), what clients do
(`clients.py`), the query matrix (`matrix.py`) and the read pool (issue 2).

Cases are data (`cases.py`); the floors are `floors.py`'s; servers, wrk and interleaved
slices are `harness.py`'s; the report is rendered from the results (`report.py`, with
the section texts of `sections.toml`). Method and figures: benchmarks/RESULTS.md.
`--quick`: 100k rows, short slices, no cursor walks or pool. `--smoke DIR`: every step on
2,000 and 10,000 rows with 1 s slices, every file written below DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import clients
import cursor_depth
import databases
import floors
import harness
import matrix
import matrix_report
import provenance
from cases import FULL, QUICK, SMOKE, Case, Dataset, Settings, offset_case, served_once, target_for
from floors import interleave
from harness import BENCH, WORK, WrkTarget, say
from provenance import RESULTS_MD
from report import CHART_NAME, CaseResult, Run, chart, evaluate, markdown, print_table, serialise

POOL_SIZES = (1, 2, 4)


def measure_cases(
    settings: Settings,
    dataset: Dataset,
    base: str,
    cases: list[Case],
    floor_base: str | None,
    floor_dir: Path | None,
) -> list[CaseResult]:
    """Each case interleaved with its HTTP floor (when a floor server runs) and in-process floor."""
    results = []
    for case in cases:
        result = CaseResult(case, dataset.rows)
        body, result.notes = served_once(base, dataset, case)
        result.body_bytes = len(body)
        served = target_for(base, dataset, case, f"{dataset.rows} {case.key}")
        targets = [served]
        http = None
        if floor_base and floor_dir and (floor_dir / f"{case.key}.json").exists():
            http = WrkTarget(f"HTTP floor {case.key}", f"{floor_base}/floor/{case.key}")
            targets.append(http)
        floor = floors.InProcessFloor(dataset.db, case, body, dataset.facts.ids)
        try:
            interleave(settings, targets, [floor])
        finally:
            floor.close()
        result.served = served.measured()
        result.http_floor = http.measured() if http else None
        result.inprocess_rps, result.inprocess_variant = floor.rate, floor.variant
        say(result.line())
        results.append(result)
    return results


def leasestar_server(
    name: str, db: Path, work: Path, read_connections: int | None = None
) -> contextlib.AbstractContextManager[harness.Server]:
    env = {"LEASESTAR_READ_CONNECTIONS": str(read_connections)} if read_connections else {}
    return harness.leasestar_server(name, db, env, work=work)


def save_bodies(base: str, dataset: Dataset, directory: Path) -> Path:
    """Each case's served body, for the HTTP floor to answer byte for byte."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for case in dataset.cases.values():
        body, _ = served_once(base, dataset, case)
        (directory / f"{case.key}.json").write_bytes(body)
    return directory


def measure_extras(
    settings: Settings, small: Dataset, base: str, floor_base: str
) -> list[dict[str, Any]]:
    """The HTTP floor with a 2-byte body, and list default as gzip-accepting clients get it."""
    tiny = WrkTarget("HTTP floor, 2-byte body", f"{floor_base}/floor/tiny")
    gzip = target_for(base, small, small.cases["list_default"], "list default, gzip")
    gzip.headers = ("Accept-Encoding: gzip",)
    interleave(settings, [tiny, gzip], [])
    gzip_bytes = gzip.measured().wire_bytes
    extras = []
    for target, note in (
        (tiny, provenance.text("list", "tiny")),
        (gzip, provenance.text("list", "gzip", wire=gzip_bytes)),
    ):
        m = target.measured()
        extras.append({"name": target.name, "note": note, **asdict(m)})
        say(f"  {target.name}: {m.rps:7.0f} req/s  p50 {m.p50_ms:.2f} ms  p99 {m.p99_ms:.2f} ms")
    return extras


def measure_scale(
    settings: Settings,
    small: Dataset,
    base: str,
    big: Dataset,
    big_base: str,
    small_results: list[CaseResult],
) -> list[CaseResult]:
    """The small list default again, in turns with the big database's cases."""
    say(f"{big.rows:,} rows against {small.rows:,}, interleaved")
    by_key = {r.case.key: r for r in small_results}
    paired = CaseResult(small.cases["list_default"], small.rows, by_key["list_default"].body_bytes)
    big_results = [
        CaseResult(big.cases[key], big.rows) for key in ("list_default", "offset_90", "get_by_id")
    ]
    targets = [target_for(base, small, paired.case, "100k list_default")]
    in_process = []
    for result in big_results:
        body, result.notes = served_once(big_base, big, result.case)
        result.body_bytes = len(body)
        targets.append(target_for(big_base, big, result.case, f"1m {result.case.key}"))
        in_process.append(floors.InProcessFloor(big.db, result.case, body, big.facts.ids))
    try:
        interleave(settings, targets, in_process)
    finally:
        for floor in in_process:
            floor.close()
    paired.served = targets[0].measured()
    for result, target, floor in zip(big_results, targets[1:], in_process, strict=True):
        result.served = target.measured()
        result.inprocess_rps, result.inprocess_variant = floor.rate, floor.variant
        # The HTTP floor depends on the body's size only; offset 90% differs.
        if result.case.key in by_key and result.case.key != "offset_90":
            result.http_floor = by_key[result.case.key].http_floor
    scale = [paired, *big_results]
    for result in scale:
        say(result.line())
    return scale


def measure_depth(
    settings: Settings, dataset: Dataset, base: str, known: list[CaseResult]
) -> list[CaseResult]:
    """p50 against offset depth, the default order."""
    say(f"{dataset.rows:,} rows: p50 against offset depth")
    cases = [offset_case(dataset.rows, f) for f in settings.offsets[dataset.rows]]
    measured = measure_cases(settings, dataset, base, cases, None, None)
    by_key = {r.case.key: r for r in known}
    return sorted(
        [by_key["list_default"], by_key["offset_90"], *measured], key=lambda r: r.case.offset
    )


def measure_cursors(settings: Settings, big: Dataset, big_base: str) -> cursor_depth.Walk:
    """Issue 7's cursor walks at 10%, 50% and 90% depth of the big database."""
    say(f"{big.rows:,} rows: cursor walks at 10%, 50% and 90% depth (issue 7)")
    started = time.monotonic()
    walk = cursor_depth.walk(
        big.db,
        big.rows,
        big_base,
        big.tokens[False],
        slices=settings.slices,
        slice_seconds=settings.slice_seconds,
        warmup=settings.warmup,
    )
    say(
        f"cursor walks took {time.monotonic() - started:.0f} s: p50 at 90% depth "
        f"{walk.ratio:.2f}x the first page's (needs <= {cursor_depth.TARGET}x)"
    )
    return walk


def measure_pool(settings: Settings, small: Dataset, work: Path) -> list[dict[str, Any]]:
    """Issue 2's question: one read connection against a small pool."""
    say(f"{small.rows:,} rows: one read connection or a pool (LEASESTAR_READ_CONNECTIONS)")
    figures = []
    with contextlib.ExitStack() as stack:
        bases = {
            size: stack.enter_context(leasestar_server(f"pool-{size}", small.db, work, size)).base
            for size in POOL_SIZES
        }
        for key in ("list_default", "get_by_id"):
            case = small.cases[key]
            targets = [
                target_for(bases[size], small, case, f"pool {size} {key}") for size in POOL_SIZES
            ]
            interleave(settings, targets, [])
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
    domains = [(d, matrix.prepare(d.db, d.rows)) for d in (small, big) if d is not None]
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(leasestar_server("leasestar-100k", small.db, work)).base
        bodies = save_bodies(base, small, work / "floor-bodies")
        floor_base = stack.enter_context(floors.floor_server(bodies, work)).base
        big_base = (
            stack.enter_context(leasestar_server("leasestar-1m", big.db, work)).base
            if big
            else None
        )
        say(f"{small.rows:,} rows: every case against its floors")
        run.cases[small.rows] = measure_cases(
            settings, small, base, list(small.cases.values()), floor_base, bodies
        )
        run.extras = measure_extras(settings, small, base, floor_base)
        if big and big_base:
            run.scale = measure_scale(settings, small, base, big, big_base, run.cases[small.rows])
            run.cases[big.rows] = run.scale[1:]
        served = [(d, b) for d, b in ((small, base), (big, big_base)) if d and b]
        for dataset, dataset_base in served:
            run.depth[dataset.rows] = measure_depth(
                settings, dataset, dataset_base, run.cases[dataset.rows]
            )
        for dataset, dataset_base in served:  # issue 15: what clients do
            result = clients.build(dataset_base, floor_base, dataset, work, settings.cursor_pages)
            clients.measure(settings, dataset, dataset_base, result)
            run.clients.append(result)
        if settings.cursors and big and big_base:
            run.cursors = measure_cursors(settings, big, big_base)
        for (dataset, dataset_base), (_, domain) in zip(served, domains, strict=True):
            run.matrix.append(matrix.measure(dataset_base, dataset.db, domain, matrix_settings))
    if settings.pool:
        run.pool = measure_pool(settings, small, work)
    return run


@dataclass(frozen=True)
class Outputs:
    """Where a run writes: its databases and logs, RESULTS.md, the JSON and the charts."""

    work: Path
    results_md: Path
    results_json: Path
    charts: Path  # the directory of the charts

    @classmethod
    def below(cls, directory: Path) -> Outputs:
        """`--smoke DIR`: every file below DIR (a copy of RESULTS.md updated in place);
        `benchmarks/` is only read."""
        directory.mkdir(parents=True, exist_ok=True)
        results_md = directory / RESULTS_MD.name
        if not results_md.exists():
            shutil.copyfile(RESULTS_MD, results_md)
        return cls(directory / "work", results_md, directory / "list-results.json", directory)


OUTPUTS = Outputs(WORK, RESULTS_MD, BENCH / "list-results.json", BENCH)


def write_results(report: dict[str, Any], run: Run, settings: Settings, outputs: Outputs) -> None:
    """Every section of RESULTS.md this run measured, the JSON and the charts."""
    targets = evaluate(run)
    print_table(run, targets)
    command, when = report["command"], report["when"]
    title = f"leasestar {report['commit']}, {when}: {command}"
    sections = [markdown(report, run, targets)]
    chart(run, title, outputs.charts / CHART_NAME)
    if run.cursors:
        sections.append(cursor_depth.markdown(run.cursors, command))
    sections.append(clients.markdown(run.clients, settings, command, when, report["commit"]))
    clients.chart(run.clients, title, outputs.charts / clients.CHART_NAME)
    sections.append(matrix_report.markdown(run.matrix, command, when, report["commit"]))
    matrix_report.chart(run.matrix, title, outputs.charts / matrix_report.CHART_NAME)
    for section in sections:
        provenance.write_section(section, outputs.results_md)
    outputs.results_json.write_text(json.dumps(serialise(report, run, targets), indent=1) + "\n")
    names = [section.split("\n", 1)[0].removeprefix("<!-- BEGIN ")[:-4] for section in sections]
    say(
        f"wrote the {', '.join(names)} sections of {provenance.shown(outputs.results_md)}, "
        f"{provenance.shown(outputs.results_json)} and the charts in "
        f"{provenance.shown(outputs.charts)}; {report['elapsed']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="leasestar's list path against its floors")
    parser.add_argument("--quick", action="store_true", help="100k rows only, 3 s per case")
    parser.add_argument(
        "--rows",
        type=int,
        metavar="N",
        help="with --quick: N rows instead of 100k (the databases of benchmarks/work/ reused)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write RESULTS.md, the JSON and the charts below DIR (a copy updated in place)",
    )
    parser.add_argument(
        "--smoke",
        type=Path,
        metavar="DIR",
        help="every step on 2k and 10k rows, 1 s slices, writing only below DIR",
    )
    args = parser.parse_args(argv)
    settings, outputs = (QUICK if args.quick else FULL), OUTPUTS
    matrix_settings = matrix.QUICK_MATRIX if args.quick else matrix.FULL_MATRIX
    command = "make bench" + (" BENCH_ARGS=--quick" if args.quick else "")
    if args.rows:
        if not args.quick:
            parser.error("--rows goes with --quick")
        settings = replace(settings, sizes=(args.rows,), offsets={args.rows: (0.1, 0.5)})
        command = f"python benchmarks/run.py --quick --rows {args.rows}"
    if args.out:
        below = Outputs.below(args.out.resolve())
        outputs = replace(below, work=outputs.work)
        command += f" --out {args.out}"
    if args.smoke:
        settings, outputs = SMOKE, Outputs.below(args.smoke.resolve())
        matrix_settings = matrix.SMOKE_MATRIX
        command = f"python benchmarks/run.py --smoke {args.smoke}"
    priority = harness.raise_priority()
    harness.ensure_wrk()
    outputs.work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for rows in settings.sizes:
        # All seeding first: it must not overlap a measurement.
        databases.ensure_database(rows, outputs.work)
    report: dict[str, Any] = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": provenance.git_commit(),
        "command": command,
        "machine": provenance.machine(),
        "versions": provenance.versions(),
        "load_before": provenance.loadavg(),
        "settings": {
            "seconds": settings.seconds,
            "slices": settings.slices,
            "slice_seconds": settings.slice_seconds,
            "warmup": settings.warmup,
            "quick": settings.quick,
            "nice": priority,
        },
    }
    measuring = time.monotonic()
    run = run_benchmark(settings, outputs.work, matrix_settings)
    report["load_after"] = provenance.loadavg()
    report["elapsed"] = (
        f"measuring took {(time.monotonic() - measuring) / 60:.1f} min, "
        f"the whole run {(time.monotonic() - started) / 60:.1f} min"
    )
    write_results(report, run, settings, outputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
