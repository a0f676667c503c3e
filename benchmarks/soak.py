"""Soak benchmark (issue 5, `make soak`): the read API under steady load while an import
writes; `python benchmarks/soak.py --rows 20000 --duration 15` is a quick look.

A copy of the bench database is served (`--rate-limit off`, not pinned: wrk and the
imports share both cores with it) under wrk's mix of gets by id and list pages
(`soak.lua`) while `leasestar import` rewrites every row of a file back to back. Goals:
no non-2xx answer, no socket error, end RSS within 10 % of start RSS; exits non-zero
when one is missed or an import fails. Writes the soak section and soak-results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import databases
import harness
import msgspec
import provenance
from harness import LEASESTAR, say

from leasestar.config import Settings

WARMUP_SECONDS = 10
RSS_GOAL = 0.10

SCRIPT = harness.BENCH / "soak.lua"  # half records by id, half list pages


def copy_database(source: Path, target: Path) -> None:
    """A copy of `source` (which other benchmarks read, so it is only read) at `target`."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    with (
        contextlib.closing(databases.read_only(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)


def import_files(count: int, work: Path) -> tuple[Path, Path]:
    """A: `count` new applicants (seed 501, so no key or id is in the seeded data); B: the
    same records with `notes` changed, so importing A, B, A, ... rewrites every row."""
    first, second = work / f"import-{count}-a.ndjson", work / f"import-{count}-b.ndjson"
    if first.exists() and second.exists():
        return first, second
    from leasestar.seed.generator import synthetic_applicants

    say(f"writing two import files of {count:,} applicants")
    encoder = msgspec.json.Encoder()
    with first.open("wb") as out_a, second.open("wb") as out_b:
        for record in synthetic_applicants(count, seed=501):
            out_a.write(encoder.encode(record) + b"\n")
            changed = msgspec.structs.replace(record, notes=f"soak rewrite of {record.x_id}")
            out_b.write(encoder.encode(changed) + b"\n")
    return first, second


def request_mix(db: Path, work: Path) -> tuple[Path, Path]:
    """Files the Lua script reads: random applicant ids, and list paths."""
    connection = sqlite3.connect(db)
    try:
        ids = [row[0] for row in connection.execute("SELECT id FROM applicants")]
        properties = [
            row[0]
            for row in connection.execute(
                "SELECT DISTINCT property_id FROM applicants ORDER BY property_id LIMIT 40"
            )
        ]
        integrations = [
            row[0] for row in connection.execute("SELECT DISTINCT integration_id FROM applicants")
        ]
    finally:
        connection.close()
    rng = random.Random(5)
    ids_file, lists_file = work / "ids.txt", work / "lists.txt"
    ids_file.write_text("\n".join(rng.sample(ids, min(len(ids), 20_000))) + "\n")
    base = "/v1/applicants"
    lists = [
        base,
        f"{base}?limit=25",
        f"{base}?limit=250",
        f"{base}?order-by=last_name,first_name&limit=50",
        f"{base}?order-by=updated_at:desc&limit=100",
        f"{base}?order-by=city,zip&limit=25",
        f"{base}?updated_at_gte=2024-01-01&updated_at_lte=2024-06-30&limit=50",
        *(f"{base}?offset={rng.randrange(len(ids))}&limit=20" for _ in range(10)),
        *(f"{base}?property_id={value}&limit=50" for value in properties),
        *(f"{base}?integration_id={value}&limit=100" for value in integrations),
    ]
    lists_file.write_text("\n".join(lists) + "\n")
    return ids_file, lists_file


@dataclass
class ImportRun:
    file: str
    started: float  # seconds from the start of the measured wrk run
    ended: float
    returncode: int
    output: str


@dataclass
class ImportLoop:
    """`leasestar import` of the files in turn, back to back, until stopped."""

    db: Path
    files: tuple[Path, Path]
    origin: float = 0.0
    runs: list[ImportRun] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            path = self.files[turn % 2]
            started = time.monotonic() - self.origin
            result = subprocess.run(
                [str(LEASESTAR), "import", "--db", str(self.db), str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
            ended = time.monotonic() - self.origin
            self.runs.append(
                ImportRun(
                    path.name,
                    round(started, 1),
                    round(ended, 1),
                    result.returncode,
                    (result.stdout + result.stderr).strip()[-300:],
                )
            )
            say(f"import {path.name}: exit {result.returncode}, {ended - started:.1f} s")
            turn += 1


def run_wrk(
    script: Path, base_url: str, seconds: int, connections: int, args: list[str]
) -> dict[str, Any]:
    """wrk on both cores (like the server and the imports), `script` choosing requests."""
    return harness.run_wrk(
        base_url,
        seconds,
        script=script,
        script_args=args,
        connections=connections,
        threads=min(2, connections),
        core=None,
        timeout="10s",
        marker="SOAK_JSON",
    )


def report(figures: dict[str, Any], command: str) -> str:
    wrk = figures["wrk"]
    requests = wrk["requests"]
    socket_errors = wrk["connect"] + wrk["read"] + wrk["write"] + wrk["timeout"]
    rss = figures["rss_kib"]
    drift = (rss["end"] - rss["start"]) / rss["start"]
    imports = figures["imports"]
    written = sum(1 for run in imports if run["returncode"] == 0)
    ok_2xx = wrk["non_2xx_3xx"] == 0 and socket_errors == 0
    ok_rss = abs(drift) <= RSS_GOAL

    def ms(microseconds: float) -> str:
        return f"{microseconds / 1000:.1f} ms"

    def mib(kib: int) -> str:
        return f"{kib / 1024:.1f} MiB"

    def mark(ok: bool) -> str:
        return "✅" if ok else "❌"

    errors = "/".join(str(wrk[k]) for k in ("connect", "read", "write", "timeout"))
    rate = requests / (wrk["duration_us"] / 1e6)
    latency = f"{ms(wrk['p50_us'])} / {ms(wrk['p90_us'])} / {ms(wrk['p99_us'])}"
    tail = f"{ms(wrk['p999_us'])} / {ms(wrk['max_us'])}"
    growth = f"{mib(rss['start'])} → {mib(rss['end'])} ({drift:+.1%}; max {mib(rss['max'])})"
    runs = ", ".join(
        f"{run['file'].rsplit('-', 1)[1][0].upper()} from {run['started']:.0f} to "
        f"{run['ended']:.0f} s (exit {run['returncode']})"
        for run in imports
    )
    warmed = f"{mib(rss['idle'])} → {mib(rss['start'])}"
    rows = [
        ("requests", f"{requests:,} ({rate:,.0f}/s)", ""),
        ("non-2xx answers", str(wrk["non_2xx_3xx"]), f"0 {mark(wrk['non_2xx_3xx'] == 0)}"),
        ("socket errors (connect/read/write/timeout)", errors, f"0 {mark(socket_errors == 0)}"),
        ("latency p50 / p90 / **p99**", latency, ""),
        ("latency p99.9 / max", tail, ""),
        ("server RSS idle → start (after the warm-up)", warmed, ""),
        ("server RSS start → end", growth, f"within 10 % {mark(ok_rss)}"),
        ("server exit after SIGTERM", str(figures["server_exit"]), "0"),
    ]  # fmt: skip
    trend = " → ".join(mib(kib) for kib in rss["every_second"][9::10])
    verdict = "all goals met" if ok_2xx and ok_rss else "GOAL MISSED"
    return provenance.section(
        "soak",
        provenance.table("| Measure | Value | Goal |", "|---|---|---|", rows),
        provenance.text("soak", "verdict", trend=trend or "-", verdict=verdict),
        **figures,
        command=command,
        commit=provenance.git_commit(),
        warmup=WARMUP_SECONDS,
        runs=runs,
        written=written,
        import_count=len(imports),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="seeded applicants")
    parser.add_argument(
        "--import-rows",
        type=int,
        default=30_000,
        help="applicants per import (sized so that several imports commit within the run)",
    )
    parser.add_argument("--duration", type=int, default=60, help="seconds of wrk")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--read-connections", type=int, default=Settings().read_connections, help="the default"
    )
    parser.add_argument(
        "--no-results", action="store_true", help="do not write benchmarks/RESULTS.md"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=harness.WORK,
        help="where the seeded database is (or goes) and soak/ with the rest (benchmarks/work)",
    )
    args = parser.parse_args()
    command = (
        "make soak" if len(sys.argv) == 1 else "python benchmarks/soak.py " + " ".join(sys.argv[1:])
    )

    harness.ensure_wrk()
    work = args.work.resolve() / "soak"
    work.mkdir(parents=True, exist_ok=True)
    template = databases.ensure_database(args.rows, args.work.resolve())
    files = import_files(args.import_rows, work)
    db = work / "soak.db"
    copy_database(template, db)
    token = databases.create_token(db, "soak")
    ids_file, lists_file = request_mix(db, work)
    script = SCRIPT
    wrk_args = [str(ids_file), str(lists_file), token]

    loop = ImportLoop(db, files)
    importer = threading.Thread(target=loop.run, daemon=True)
    samples: list[int] = []
    sampling = threading.Event()
    with harness.leasestar_server(
        "soak",
        db,
        args=(
            *("--rate-limit", "off", "--log-format", "off"),
            *("--read-connections", str(args.read_connections)),
        ),
        core=None,
        work=work,
        stop=signal.SIGTERM,
    ) as server:
        try:
            idle = harness.rss_kib(server.pid)
            load_before = provenance.loadavg()
            say(
                f"server up on {server.base}, RSS {idle / 1024:.1f} MiB; "
                f"warming up {WARMUP_SECONDS} s"
            )
            run_wrk(script, server.base, WARMUP_SECONDS, args.connections, wrk_args)
            start = harness.rss_kib(server.pid)

            def sample() -> None:
                while not sampling.wait(1.0):
                    samples.append(harness.rss_kib(server.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            loop.origin = time.monotonic()
            importer.start()
            say(f"RSS {start / 1024:.1f} MiB; {args.duration} s of wrk while imports run")
            measured = run_wrk(script, server.base, args.duration, args.connections, wrk_args)
            end = harness.rss_kib(server.pid)
            sampling.set()
            sampler.join()
            loop.stop.set()
            say("wrk done; letting the running import finish")
            importer.join(timeout=600)
        finally:
            loop.stop.set()

    figures = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": provenance.describe_machine("python"),
        "load_before": load_before,
        "rows": args.rows,
        "import_rows": args.import_rows,
        "duration": args.duration,
        "connections": args.connections,
        "read_connections": args.read_connections,
        "wrk": measured,
        "rss_kib": {
            "idle": idle,
            "start": start,
            "end": end,
            "max": max([start, end, *samples]),
            "every_second": samples,
        },
        "imports": [asdict(run) for run in loop.runs],
        "server_exit": server.returncode,
    }
    (work / "soak-results.json").write_text(json.dumps(figures, indent=2) + "\n")
    text = report(figures, command)
    print(text)
    if not args.no_results:
        provenance.write_section(text)
        say(f"wrote the soak section of {provenance.shown(provenance.RESULTS_MD)}")
    socket_errors = sum(measured[k] for k in ("connect", "read", "write", "timeout"))
    drift = abs(end - start) / start
    failed_imports = [run for run in loop.runs if run.returncode != 0]
    if measured["non_2xx_3xx"] or socket_errors or drift > RSS_GOAL or failed_imports:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
