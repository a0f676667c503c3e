"""Cursor walks at depth (issue 7): is the page at a deep cursor as fast as the first page?

    .venv/bin/python benchmarks/cursor_depth.py [--rows N] [--seconds S] [--no-results]

1. Reuses `benchmarks/work/applicants-N.db` (the database `make bench` builds; a
   `bench-N.db` is taken too), waits for it while another benchmark is still seeding
   it, or seeds it with `leasestar seed --count N --seed 0` (stamped with the same
   fingerprint `benchmarks/run.py` checks, so both reuse it).
2. Makes cursors at 10%, 50% and 90% depth of the default ordering (created_at desc)
   without walking there: reads the record just before each depth with SQL, takes its
   sort-key values with the app's own `key_values`, and signs the app's own
   `cursor_state` with the database's key (`CursorCodec`). Each cursor page is checked
   against the same page read by SQL with LIMIT/OFFSET before anything is measured.
3. Serves the database with `leasestar serve` (uvicorn, one worker, rate limit off)
   pinned to core 0 with taskset, and drives it with wrk (`-t1 -c16`) pinned to core 1.
   The first page, the three cursor pages and, for contrast, offset=90% are measured in
   interleaved slices (so background load hits them alike); a case's p50 is the median
   of its slices' p50s.
4. Prints the table and writes it between `<!-- BEGIN cursors -->` and
   `<!-- END cursors -->` in benchmarks/RESULTS.md (appended when missing; nothing else
   in the file is touched). Target: p50 at 90% within 1.5x of the first page.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / "work"
BIN = Path(sys.executable).parent
LEASESTAR = BIN / "leasestar"
RESULTS_MD = BENCH / "RESULTS.md"
BEGIN, END = "<!-- BEGIN cursors -->", "<!-- END cursors -->"
LUA = WORK / "cursor-depth.lua"
SERVER_LOG = WORK / "server-cursor-depth.log"

sys.path.insert(0, str(ROOT))
from app.applicants.cursors import CursorCodec, key_values  # noqa: E402
from app.applicants.query import ApplicantQuery, cursor_state, total_order  # noqa: E402

DEPTHS = (0.1, 0.5, 0.9)
LIMIT = 100  # the default page size
CONNECTIONS = 16
SERVER_CORE, CLIENT_CORE = "0", "1"
TARGET = 1.5
# The default ordering, as SQL, written here from the contract (created_at desc + id).
DEFAULT_ORDER_SQL = "ORDER BY created_at DESC, id DESC"
WRK_LUA = """-- written by benchmarks/cursor_depth.py: one machine-readable summary line
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'CURSOR_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"errors":%d}\\n',
    summary.requests, summary.duration, summary.bytes, latency:percentile(50),
    latency:percentile(90), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
"""


def say(message: str) -> None:
    print(f"[cursor-depth {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- database


def count_rows(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return int(db.execute("SELECT count(*) FROM applicants").fetchone()[0])
    except sqlite3.Error:
        return -1


def data_fingerprint() -> str:
    """What a seeded database depends on (the stamp benchmarks/run.py checks)."""
    digest = hashlib.sha256()
    for source in (ROOT / "schema.sql", ROOT / "seed" / "generator.py"):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def ensure_database(rows: int) -> Path:
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"applicants-{rows}.db"
    partial = path.with_name(path.name + ".partial")
    # Another benchmark may be seeding it right now: its .partial keeps growing.
    while not path.exists() and partial.exists():
        wal = Path(f"{partial}-wal")
        changed = max(p.stat().st_mtime for p in (partial, wal) if p.exists())
        if time.time() - changed > 300:
            break  # abandoned
        say(f"{partial.name} is being seeded by another run; waiting for it")
        time.sleep(30)
    for candidate in (path, WORK / f"bench-{rows}.db"):
        if candidate.exists():
            found = count_rows(candidate)
            if found == rows:
                say(f"reusing {candidate.relative_to(ROOT)} ({rows:,} applicants)")
                return candidate
            say(f"{candidate.name} holds {found:,} rows, not {rows:,}")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    say(f"seeding {rows:,} applicants into {path.relative_to(ROOT)} (leasestar seed)")
    started = time.monotonic()
    subprocess.run(
        [str(LEASESTAR), "seed", "--db", str(partial), "--count", str(rows), "--seed", "0"],
        check=True,
    )
    partial.rename(path)
    path.with_name(path.name + ".fingerprint").write_text(data_fingerprint() + "\n")
    say(f"seeded {rows:,} in {time.monotonic() - started:.0f} s")
    return path


@dataclass
class Case:
    key: str
    label: str
    path: str  # path and query string
    position: int
    expected_ids: list[str]
    p50s: list[float] = field(default_factory=list)
    p90s: list[float] = field(default_factory=list)
    p99s: list[float] = field(default_factory=list)
    requests: int = 0
    seconds: float = 0.0
    errors: int = 0
    body_bytes: int = 0

    @property
    def p50(self) -> float:
        return statistics.median(self.p50s)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def build_cases(db: Path, rows: int, with_offset: bool) -> list[Case]:
    """The first page, a cursor page at each depth, and offset=90% for contrast."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        key = bytes(conn.execute("SELECT cursor_key FROM sync_state").fetchone()[0])
        codec = CursorCodec(key)
        query = ApplicantQuery(limit=LIMIT)  # the defaults: created_at desc

        def page_ids(offset: int) -> list[str]:
            return [
                row[0]
                for row in conn.execute(
                    f"SELECT id FROM applicants {DEFAULT_ORDER_SQL} LIMIT ? OFFSET ?",
                    (LIMIT, offset),
                )
            ]

        cases = [Case("first", "first page (no cursor)", "/v1/applicants", 0, page_ids(0))]
        for depth in DEPTHS:
            position = int(rows * depth)
            say(f"making the cursor at {depth:.0%} (position {position:,})")
            body, change_seq = conn.execute(
                f"SELECT body, change_seq FROM applicants {DEFAULT_ORDER_SQL} LIMIT 1 OFFSET ?",
                (position - 1,),
            ).fetchone()
            after = key_values(total_order(query.order_by), body, change_seq)
            cursor = codec.encode(cursor_state(query, position, after))
            cases.append(
                Case(
                    f"cursor_{round(depth * 100)}",
                    f"cursor at {depth:.0%}",
                    "/v1/applicants?" + urllib.parse.urlencode({"cursor": cursor}),
                    position,
                    page_ids(position),
                )
            )
        if with_offset:
            position = int(rows * DEPTHS[-1])
            cases.append(
                Case(
                    "offset_90",
                    f"offset={position:,} (offset pagination, for contrast)",
                    f"/v1/applicants?offset={position}",
                    position,
                    page_ids(position),
                )
            )
    return cases


# --------------------------------------------------------------------------- server, wrk


def pinned(core: str) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", core]
    return []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_get(url: str, token: str | None = None, timeout: float = 60) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


def create_token(db: Path) -> str:
    name = f"bench-cursor-depth-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
    out = subprocess.run(
        [str(LEASESTAR), "token", "create", "--db", str(db), "--name", name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.strip().splitlines()[-1]


@contextlib.contextmanager
def leasestar_server(db: Path) -> Iterator[int]:
    """`leasestar serve` (uvicorn, one worker) pinned to the server core; yields its port."""
    port = free_port()
    command = [
        *pinned(SERVER_CORE),
        str(LEASESTAR),
        "serve",
        "--db",
        str(db),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {**os.environ, "LEASESTAR_RATE_LIMIT": "off"}  # a load test is not a limiter test
    with SERVER_LOG.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"server exited early ({process.returncode}); see {log.name}"
                    )
                with contextlib.suppress(OSError):
                    if http_get(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not answer within 120 s")
                time.sleep(0.2)
            yield port
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def check_case(base: str, token: str, case: Case) -> None:
    """The served page is the SQL page at that position, with a next cursor."""
    status, raw = http_get(base + case.path, token)
    if status != 200:
        raise RuntimeError(f"{case.label}: HTTP {status}: {raw[:300]!r}")
    body = json.loads(raw)
    served = [record["id"] for record in body["results"]]
    if served != case.expected_ids:
        raise RuntimeError(f"{case.label}: the served page is not the page at {case.position:,}")
    if body["meta"]["offset"] != case.position or not body["meta"].get("next"):
        raise RuntimeError(f"{case.label}: unexpected meta {body['meta']}")
    case.body_bytes = len(raw)


def wrk(url: str, token: str, seconds: float) -> dict[str, int]:
    command = [
        *pinned(CLIENT_CORE),
        "wrk",
        "-t1",
        f"-c{CONNECTIONS}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "30s",
        "-s",
        str(LUA),
        "-H",
        f"Authorization: Bearer {token}",
        url,
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    match = re.search(r"^CURSOR_JSON (\{.*\})$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    summary: dict[str, int] = json.loads(match[1])
    return summary


def measure(base: str, token: str, cases: list[Case], seconds: float, slices: int) -> None:
    for case in cases:  # warm-up: caches, the count cache, the OS page cache
        wrk(base + case.path, token, 1)
    for index in range(slices):
        rotated = cases[index % len(cases) :] + cases[: index % len(cases)]
        for case in rotated:
            summary = wrk(base + case.path, token, seconds / slices)
            case.p50s.append(summary["p50_us"] / 1000)
            case.p90s.append(summary["p90_us"] / 1000)
            case.p99s.append(summary["p99_us"] / 1000)
            case.requests += summary["requests"]
            case.seconds += summary["duration_us"] / 1e6
            case.errors += summary["errors"]
        say(
            f"slice {index + 1}/{slices}: "
            + ", ".join(f"{c.key} {c.p50s[-1]:.2f} ms" for c in cases)
        )


# --------------------------------------------------------------------------- report


def git_commit() -> str:
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "app", "schema.sql"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"`{sha}`" + (" (with uncommitted changes in app/)" if dirty else "")


def machine() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    return (
        f"{model}, {os.cpu_count()} cores, kernel {platform.release()}; python "
        f"{platform.python_version()}, sqlite {sqlite3.sqlite_version}, wrk "
        f"{(wrk_version.split() or ['?', '?'])[1]}"
    )


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def markdown(
    cases: list[Case], rows: int, command: str, seconds: float, slices: int, loads: tuple[str, str]
) -> str:
    first = cases[0]
    deepest = next(c for c in cases if c.key == "cursor_90")
    ratio = deepest.p50 / first.p50
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    lines = [
        BEGIN,
        "## Cursor walks at depth (issue 7)",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on commit {git_commit()} with "
        f"`{command}`: {rows:,} applicants, pages of {LIMIT} in the default order "
        f"(created_at desc); {seconds:g} measured seconds per case in {slices} interleaved "
        f"slices after a 1 s warm-up; load average {loads[0]} before, {loads[1]} after.",
        "",
        f"**Machine**: {machine()}. The machine is shared with other work: absolute "
        "figures move with it, the interleaved ratios much less.",
        "",
        "**Method**: `leasestar serve` (uvicorn, one worker, `LEASESTAR_RATE_LIMIT=off`) "
        f"pinned to core {SERVER_CORE}; wrk (`-t1 -c{CONNECTIONS}`) pinned to core "
        f"{CLIENT_CORE}. Each cursor is the app's own (`cursor_state` signed by "
        "`CursorCodec` with the database's key) for the record just before the depth, "
        "so no walk is needed to get there; before measuring, each page is checked to be "
        "the SQL page at that position (`ORDER BY created_at DESC, id DESC LIMIT/OFFSET`). "
        "p50 is the median of the slices' p50s.",
        "",
        "| page | position | req/s | p50 ms | p90 ms | p99 ms | body B | p50 x first page |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        lines.append(
            f"| {case.label} | {case.position:,} | {case.rps:,.0f} | {case.p50:.2f} | "
            f"{statistics.median(case.p90s):.2f} | {statistics.median(case.p99s):.2f} | "
            f"{case.body_bytes:,} | {case.p50 / first.p50:.2f} |"
        )
    errors = sum(c.errors for c in cases)
    lines += [
        "",
        f"**Target** (issue 7 item 3): p50 at 90% depth within {TARGET}x of the first page: "
        f"**{verdict}** ({ratio:.2f}x). Non-2xx or socket errors during the run: {errors}.",
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


def write_results(section: str) -> None:
    """Replace this benchmark's section of RESULTS.md (append it when missing)."""
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        before, _, rest = text.partition(BEGIN)
        _, _, after = rest.partition(END)
        text = before + section + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS_MD.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="database size")
    parser.add_argument("--seconds", type=float, default=9, help="measured seconds per case")
    parser.add_argument("--slices", type=int, default=3, help="interleaved slices per case")
    parser.add_argument("--no-offset", action="store_true", help="skip the offset=90%% case")
    parser.add_argument("--no-results", action="store_true", help="do not write RESULTS.md")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        say("wrk is required: apt-get install -y wrk (Debian/Ubuntu), brew install wrk (macOS)")
        return 2
    command = ".venv/bin/python benchmarks/cursor_depth.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    db = ensure_database(args.rows)
    cases = build_cases(db, args.rows, with_offset=not args.no_offset)
    LUA.write_text(WRK_LUA)
    token = create_token(db)
    load_before = loadavg()
    with leasestar_server(db) as port:
        base = f"http://127.0.0.1:{port}"
        for case in cases:
            check_case(base, token, case)
        measure(base, token, cases, args.seconds, args.slices)
    load_after = loadavg()
    section = markdown(
        cases, args.rows, command, args.seconds, args.slices, (load_before, load_after)
    )
    print(section)
    if not args.no_results:
        write_results(section)
        say(f"wrote the cursors section of {RESULTS_MD.relative_to(ROOT)}")
    ratio = next(c for c in cases if c.key == "cursor_90").p50 / cases[0].p50
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
