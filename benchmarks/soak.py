"""Soak benchmark (issue 5): the read API under steady load while an import writes.

    make soak                                    # 100k rows, 60 s, 64 connections
    python benchmarks/soak.py --rows 20000 --duration 15   # a quick development run

What it does, all under benchmarks/work/soak/ (git-ignored, reused between runs):

1. Seeds a database of `--rows` applicants with `leasestar seed` (once; later runs copy
   it), and writes two NDJSON files of `--import-rows` new applicants for the import: A,
   and B = A with one field changed, so that every import in the loop writes every row.
2. Starts `leasestar serve --rate-limit off --log-format off` (one worker) on a free port.
3. Warms it up with 10 s of wrk, then reads the server's RSS ("start").
4. Runs `leasestar import` of A, B, A, ... back to back, and meanwhile `--duration`
   seconds of wrk at `--connections` connections, requests mixed half and half between
   GET /v1/applicants/{random id} and list pages (default, limits 25-250, deep offsets,
   orderings, filters), all with a bearer token.
5. Reads the RSS again when wrk ends ("end"), lets the running import finish, stops the
   server with SIGTERM, and writes its section of benchmarks/RESULTS.md (between
   `<!-- BEGIN soak -->` and `<!-- END soak -->`, nothing else) plus soak-results.json.

Goals: no non-2xx answer and no socket error; end RSS within 10 % of start RSS.
Exits non-zero when a goal is missed or an import fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "soak"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- BEGIN soak -->", "<!-- END soak -->"
WARMUP_SECONDS = 10
RSS_GOAL = 0.10

LUA = r"""
-- Written by benchmarks/soak.py. Args: IDS_FILE LISTS_FILE TOKEN.
local ids, lists = {}, {}
function init(args)
  for line in io.lines(args[1]) do ids[#ids + 1] = line end
  for line in io.lines(args[2]) do lists[#lists + 1] = line end
  wrk.headers["Authorization"] = "Bearer " .. args[3]
  math.randomseed(os.time() * 1000 + math.floor(os.clock() * 1000000))
end
function request()
  if math.random() < 0.5 then
    return wrk.format("GET", "/v1/applicants/" .. ids[math.random(#ids)])
  end
  return wrk.format("GET", lists[math.random(#lists)])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'SOAK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"non_2xx_3xx":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"p999_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read,
    e.write, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max, latency.mean))
end
"""


def leasestar() -> list[str]:
    script = Path(sys.executable).with_name("leasestar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        log("wrk is missing: installing the Debian package")
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=False)
        found = shutil.which("wrk")
    if not found:
        sys.exit("soak: wrk is required (Debian/Ubuntu: apt-get install wrk)")
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def copy_database(source: Path, target: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def seeded_template(rows: int) -> Path:
    """A database of `rows` seeded applicants, made once and reused."""
    template = WORK / f"seed-{rows}.db"
    if template.exists():
        return template
    partial = WORK / f"seed-{rows}.db.partial"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    log(f"seeding {rows:,} applicants into {template.name} (once; reused by later runs)")
    subprocess.run(
        [*leasestar(), "seed", "--db", str(partial), "--count", str(rows), "--seed", "0"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    connection = sqlite3.connect(partial)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    partial.replace(template)
    return template


def import_files(count: int) -> tuple[Path, Path]:
    """A: `count` new applicants (seed 501, so no key or id is in the seeded data); B: the
    same records with `notes` changed, so importing A, B, A, ... rewrites every row."""
    first, second = WORK / f"import-{count}-a.ndjson", WORK / f"import-{count}-b.ndjson"
    if first.exists() and second.exists():
        return first, second
    sys.path.insert(0, str(ROOT))
    from seed.generator import synthetic_applicants

    log(f"writing two import files of {count:,} applicants")
    encoder = msgspec.json.Encoder()
    with first.open("wb") as out_a, second.open("wb") as out_b:
        for record in synthetic_applicants(count, seed=501):
            out_a.write(encoder.encode(record) + b"\n")
            changed = msgspec.structs.replace(record, notes=f"soak rewrite of {record.x_id}")
            out_b.write(encoder.encode(changed) + b"\n")
    return first, second


def request_mix(db: Path) -> tuple[Path, Path]:
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
    ids_file, lists_file = WORK / "ids.txt", WORK / "lists.txt"
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
                [*leasestar(), "import", "--db", str(self.db), str(path)],
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
            log(f"import {path.name}: exit {result.returncode}, {ended - started:.1f} s")
            turn += 1


def wait_healthy(base_url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"soak: the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("soak: the server did not answer /health")


def run_wrk(
    wrk: str, base_url: str, seconds: int, connections: int, args: list[str]
) -> dict[str, Any]:
    script = WORK / "soak.lua"
    script.write_text(LUA)
    command = [
        wrk,
        f"-t{min(2, connections)}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        base_url,
        "--",
        *args,
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = re.search(r"^SOAK_JSON (.*)$", output, re.MULTILINE)
    if match is None:
        sys.exit(f"soak: no summary from wrk:\n{output}")
    result: dict[str, Any] = json.loads(match[1])
    return result


def machine() -> str:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} CPU ({model or platform.machine()}), Python {platform.python_version()}"
    )


def write_section(text: str) -> None:
    """Replace the soak section of RESULTS.md (or append it); never touch the rest."""
    section = f"{BEGIN}\n{text.rstrip()}\n{END}"
    current = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    if BEGIN in current and END in current:
        head, _, rest = current.partition(BEGIN)
        _, _, tail = rest.partition(END)
        updated = head + section + tail
    else:
        updated = current + ("\n" if current and not current.endswith("\n") else "")
        updated += ("\n" if current else "") + section + "\n"
    RESULTS.write_text(updated, encoding="utf-8")


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
    rows = [
        ("requests", f"{requests:,} ({rate:,.0f}/s)", ""),
        ("non-2xx answers", str(wrk["non_2xx_3xx"]), f"0 {mark(wrk['non_2xx_3xx'] == 0)}"),
        ("socket errors (connect/read/write/timeout)", errors, f"0 {mark(socket_errors == 0)}"),
        ("latency p50 / p90 / **p99**", latency, ""),
        ("latency p99.9 / max", tail, ""),
        (
            "server RSS idle → start (after the warm-up)",
            f"{mib(rss['idle'])} → {mib(rss['start'])}",
            "",
        ),
        ("server RSS start → end", growth, f"within 10 % {mark(ok_rss)}"),
        ("server exit after SIGTERM", str(figures["server_exit"]), "0"),
    ]
    table = "\n".join(f"| {name} | {value} | {goal} |" for name, value, goal in rows)
    trend = " → ".join(mib(kib) for kib in rss["every_second"][9::10])
    return f"""## Soak: reads under load while an import writes (issue 5)

Command: `{command}` ({figures["date"]}; {figures["machine"]}; load average
{figures["load_before"]} before the run).

{figures["rows"]:,} seeded applicants served by `leasestar serve --rate-limit off
--log-format off` (1 worker, {figures["read_connections"]} read connections). wrk with
{figures["connections"]} connections and 2 threads for {figures["duration"]} s, after a
{WARMUP_SECONDS} s warm-up: half `GET /v1/applicants/{{random id}}`, half list pages
(default, limits 25-250, offsets, orderings, a date window, property and integration
filters). All the while `leasestar import` ran back to back over two files of
{figures["import_rows"]:,} applicants (A: new rows; B: every row of A changed), each in one
transaction, the last one let finish after wrk stopped. Imports, in seconds from the
start of the measured run: {runs}; {written} of {len(imports)} committed.

| Measure | Value | Goal |
|---|---|---|
{table}

Server RSS every 10 s of the measured run: {trend or "-"}.

Verdict: {"all goals met" if ok_2xx and ok_rss else "GOAL MISSED"}. The machine was shared
with other work during the run (see the load average), so the latencies are an upper
bound, not this code's floor; the error counts and the RSS drift do not depend on it.
"""


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
    parser.add_argument("--read-connections", type=int, default=2)
    parser.add_argument(
        "--no-results", action="store_true", help="do not write benchmarks/RESULTS.md"
    )
    args = parser.parse_args()
    command = (
        "make soak" if len(sys.argv) == 1 else "python benchmarks/soak.py " + " ".join(sys.argv[1:])
    )

    wrk = ensure_wrk()
    WORK.mkdir(parents=True, exist_ok=True)
    template = seeded_template(args.rows)
    files = import_files(args.import_rows)
    db = WORK / "soak.db"
    copy_database(template, db)
    token = (
        subprocess.run(
            [*leasestar(), "token", "create", "--db", str(db), "--name", "soak"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    ids_file, lists_file = request_mix(db)

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server_log = (WORK / "server.log").open("wb")
    server = subprocess.Popen(
        [
            *leasestar(),
            *("serve", "--db", str(db), "--port", str(port), "--rate-limit", "off"),
            *("--log-format", "off", "--read-connections", str(args.read_connections)),
        ],
        stdout=server_log,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")},
    )
    loop = ImportLoop(db, files)
    importer = threading.Thread(target=loop.run, daemon=True)
    samples: list[int] = []
    sampling = threading.Event()
    try:
        wait_healthy(base_url, server)
        idle = rss_kib(server.pid)
        load_before = " ".join(f"{value:.1f}" for value in os.getloadavg())
        log(f"server up on {base_url}, RSS {idle / 1024:.1f} MiB; warming up {WARMUP_SECONDS} s")
        run_wrk(
            wrk, base_url, WARMUP_SECONDS, args.connections, [str(ids_file), str(lists_file), token]
        )
        start = rss_kib(server.pid)

        def sample() -> None:
            while not sampling.wait(1.0):
                samples.append(rss_kib(server.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        loop.origin = time.monotonic()
        importer.start()
        log(f"RSS {start / 1024:.1f} MiB; {args.duration} s of wrk while imports run")
        measured = run_wrk(
            wrk, base_url, args.duration, args.connections, [str(ids_file), str(lists_file), token]
        )
        end = rss_kib(server.pid)
        sampling.set()
        sampler.join()
        loop.stop.set()
        log("wrk done; letting the running import finish")
        importer.join(timeout=600)
    finally:
        loop.stop.set()
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            server_exit = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server_exit = server.wait()
        server_log.close()

    figures = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
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
        "server_exit": server_exit,
    }
    (WORK / "soak-results.json").write_text(json.dumps(figures, indent=2) + "\n")
    text = report(figures, command)
    print(text)
    if not args.no_results:
        write_section(text)
        log(f"wrote the soak section of {RESULTS.relative_to(ROOT)}")
    socket_errors = sum(measured[k] for k in ("connect", "read", "write", "timeout"))
    drift = abs(end - start) / start
    failed_imports = [run for run in loop.runs if run.returncode != 0]
    if measured["non_2xx_3xx"] or socket_errors or drift > RSS_GOAL or failed_imports:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
