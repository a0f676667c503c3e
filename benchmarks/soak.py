"""Soak (issue 5, `make soak`): wrk's mix of gets and list pages (`soak.lua`) while
`leasestar import` rewrites rows back to back; exits non-zero when a goal is missed (a
non-2xx, a socket error, RSS drift over 10 %) or an import fails."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from threading import Event
from typing import Any

import databases
import harness
import provenance
from harness import LEASESTAR, say

from leasestar.config import Settings

WARMUP_SECONDS = 10
RSS_GOAL = 0.10
MARK = {True: "✅", False: "❌"}
SCRIPT = harness.BENCH / "soak.lua"  # half records by id, half list pages


def request_mix(db: Path, work: Path) -> tuple[Path, Path]:
    with contextlib.closing(databases.read_only(db)) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM applicants")]
        properties = conn.execute(
            "SELECT DISTINCT property_id FROM applicants ORDER BY property_id LIMIT 40"
        ).fetchall()
        integrations = conn.execute("SELECT DISTINCT integration_id FROM applicants").fetchall()
    rng = random.Random(5)
    ids_file, lists_file = work / "ids.txt", work / "lists.txt"
    ids_file.write_text("\n".join(rng.sample(ids, min(len(ids), 20_000))) + "\n")
    base = "/v1/applicants"
    lists = [
        base, f"{base}?limit=25", f"{base}?limit=250",
        f"{base}?order-by=last_name,first_name&limit=50",
        f"{base}?order-by=updated_at:desc&limit=100", f"{base}?order-by=city,zip&limit=25",
        f"{base}?updated_at_gte=2024-01-01&updated_at_lte=2024-06-30&limit=50",
        *(f"{base}?offset={rng.randrange(len(ids))}&limit=20" for _ in range(10)),
        *(f"{base}?property_id={value}&limit=50" for (value,) in properties),
        *(f"{base}?integration_id={value}&limit=100" for (value,) in integrations),
    ]  # fmt: skip
    lists_file.write_text("\n".join(lists) + "\n")
    return ids_file, lists_file


def import_loop(
    db: Path, files: list[Path], origin: float, runs: list[dict[str, Any]], stop: Event
) -> None:
    """`leasestar import` of A, B, A, ... until `stop` (the one running let finish); each
    run's file, its start and end in seconds from `origin`, its exit status and output."""
    turn = 0
    while not stop.is_set():
        path = files[turn % 2]
        started = time.monotonic() - origin
        command = [str(LEASESTAR), "import", "--db", str(db), str(path)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        ended = time.monotonic() - origin
        output = (result.stdout + result.stderr).strip()[-300:]
        runs.append({
            "file": path.name, "started": round(started, 1), "ended": round(ended, 1),
            "returncode": result.returncode, "output": output,
        })  # fmt: skip
        say(f"import {path.name}: exit {result.returncode}, {ended - started:.1f} s")
        turn += 1


def report(figures: dict[str, Any], command: str) -> tuple[str, bool]:
    """The section, and whether the goals were met."""
    wrk, rss, imports = figures["wrk"], figures["rss_kib"], figures["imports"]
    socket_errors = wrk["connect"] + wrk["read"] + wrk["write"] + wrk["timeout"]
    drift = (rss["end"] - rss["start"]) / rss["start"]
    ok_2xx, ok_rss = wrk["non_2xx_3xx"] == 0 and socket_errors == 0, abs(drift) <= RSS_GOAL
    runs = ", ".join(
        provenance.text("soak", "import", name=run["file"].rsplit("-", 1)[1][0].upper(), **run)
        for run in imports
    )
    ms = {key.removesuffix("_us"): wrk[key] / 1000 for key in ("p50_us", "p90_us", "p99_us")}
    ms |= {"p999": wrk["p999_us"] / 1000, "slowest": wrk["max_us"] / 1000}
    mib = {key: rss[key] / 1024 for key in ("idle", "start", "end", "max")}
    table = provenance.text(
        "soak", "table", **wrk, **ms, **mib, rate=wrk["requests"] / (wrk["duration_us"] / 1e6),
        drift=drift, non_2xx_ok=MARK[wrk["non_2xx_3xx"] == 0], errors_ok=MARK[socket_errors == 0],
        rss_ok=MARK[ok_rss], server_exit=figures["server_exit"],
    )  # fmt: skip
    trend = " → ".join(f"{kib / 1024:.1f} MiB" for kib in rss["every_second"][9::10])
    verdict = "all goals met" if ok_2xx and ok_rss else "GOAL MISSED"
    section = provenance.section(
        "soak", table, provenance.text("soak", "verdict", trend=trend or "-", verdict=verdict),
        **figures, command=command, warmup=WARMUP_SECONDS, runs=runs,
        written=sum(1 for run in imports if run["returncode"] == 0), import_count=len(imports),
    )  # fmt: skip
    return section, ok_2xx and ok_rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--import-rows", type=int, default=30_000,
        help="applicants per import (sized so that several imports commit within the run)",
    )  # fmt: skip
    parser.add_argument("--duration", type=int, default=60, help="seconds of wrk")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--read-connections", type=int, default=Settings().read_connections, help="the default"
    )
    smoke = {"rows": 2_000, "import_rows": 500, "duration": 5}
    args, outputs = provenance.options(parser, smoke, rows=100_000, nice=False)
    command = "make soak" if len(sys.argv) == 1 else provenance.command()
    work, db, token = databases.workspace(args.rows, outputs.work, "soak")
    # A: new applicants (seed 501: no key of the seeded data); B: A with `notes` changed,
    # so that importing A, B, A, ... rewrites every row.
    files = databases.import_files(work, args.import_rows, 501, "", "soak rewrite of")
    script_args = (*map(str, request_mix(db, work)), token)
    runs: list[dict[str, Any]] = []
    options = ["--rate-limit", "off", "--log-format", "off"]
    options += ["--read-connections", str(args.read_connections)]
    with harness.leasestar_server(
        "soak", db, args=options, core=None, work=work, stop=signal.SIGTERM
    ) as server:
        # wrk on both cores (like the server and the imports), `soak.lua` choosing requests
        wrk = harness.WrkTarget(
            "soak", server.base, script=SCRIPT, script_args=script_args, marker="SOAK_JSON",
            connections=args.connections, threads=min(2, args.connections), core=None,
            timeout="10s",
        )  # fmt: skip
        idle, load_before = harness.proc_kib(server.pid)["VmRSS"], provenance.loadavg()
        say(f"server up on {server.base}, RSS {idle / 1024:.1f} MiB; warming up")
        wrk.wrk(WARMUP_SECONDS)
        start = harness.proc_kib(server.pid)["VmRSS"]
        say(f"RSS {start / 1024:.1f} MiB; {args.duration} s of wrk while imports run")
        importing = functools.partial(import_loop, db, files, time.monotonic(), runs)
        with harness.in_background(importing):
            with harness.rss_samples(server.pid, 1.0) as samples:
                measured = wrk.wrk(args.duration)
                end = harness.proc_kib(server.pid)["VmRSS"]
            say("wrk done; letting the running import finish")
    figures = {
        "date": provenance.now(),
        "machine": provenance.describe_machine("python"),
        "load_before": load_before,
        **{k: getattr(args, k) for k in ("rows", "import_rows", "duration", "connections")},
        "read_connections": args.read_connections,
        "wrk": measured,
        "rss_kib": {
            "idle": idle, "start": start, "end": end, "max": max([start, end, *samples]),
            "every_second": samples,
        },
        "imports": runs,
        "server_exit": server.process.returncode,
    }  # fmt: skip
    (work / "soak-results.json").write_text(json.dumps(figures, indent=2) + "\n")
    section, met = report(figures, command)
    provenance.publish(section, outputs.results_md)
    return 0 if met and all(run["returncode"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
