"""The rate limit's cost, and get by id against its floors, in instructions:
`python benchmarks/rate_limit_instructions.py`.

req/s and CPU time move with whatever else the machine runs (two servers started alike
differ by up to 20 %, one server by a third from one minute to the next); the
instructions a request executes do not. So this counts them with valgrind's callgrind,
on the real server: `leasestar serve` (one worker, its defaults) runs under callgrind
with instrumentation off, a client sends it `WARM` requests on one kept-alive connection,
then `callgrind_control -i on`, `COUNT` requests, `-i off`: the count is those requests'
alone, uvicorn's parsing and header checks included (start-up, shutdown and the client
are not in it). Cases:

- get by id (random ids) and list default, with the rate limit off, on without the
  per-token cap (`999999999/day`, `LEASESTAR_TOKEN_CONCURRENCY=off`: every request
  counted, none refused), and on with the default cap;
- get by id's floors, as `run.py` defines them: the HTTP floor (`floor_app.py` under the
  same uvicorn, answering a get's body) counted the same way, and the in-process floor
  (the record read and its bytes, `floors.InProcessFloor`'s statement) as the difference
  of two runs of a loop. Composite = HTTP + in-process, in instructions.

Not counted: the kernel's side of system calls (the same for every case but the limit's
`flock`, once every 16 requests). Two valgrinds at a time: 5 to 10 minutes on 2 cores.
Writes the `rate-limit-instructions` section of `benchmarks/RESULTS.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import databases
import harness
import provenance
from harness import BENCH, LEASESTAR, UVICORN

from leasestar.applicants.bodies import BodyDecoder

ROWS = 100_000
WARM = 300
COUNTS = {"get": 2000, "list": 300}  # a list page is ~6x a get's instructions
LIMITS = {
    "off": {"LEASESTAR_RATE_LIMIT": "off"},
    "on, no cap": {"LEASESTAR_RATE_LIMIT": "999999999/day", "LEASESTAR_TOKEN_CONCURRENCY": "off"},
    "on, default cap": {"LEASESTAR_RATE_LIMIT": "999999999/day"},
}
RECORD_SQL = "SELECT CAST(body AS BLOB) FROM applicants WHERE id = ?"


def send(base: str, paths: list[str], token: str | None) -> None:
    """Each of `paths` in turn on one kept-alive connection; every answer must be 200."""
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=600)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        for path in paths:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}")
    finally:
        connection.close()


@contextlib.contextmanager
def under_callgrind(
    name: str, command: list[str], health: str, env: dict[str, str]
) -> Iterator[tuple[harness.Server, Path]]:
    """A server run by callgrind with instrumentation off; its output file."""
    out = Path(tempfile.mkdtemp(prefix="leasestar-cg-")) / "callgrind.out"
    valgrind = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
    ]  # fmt: skip
    with harness.server(
        f"cg-{name}", [*valgrind, *command], health, {"PYTHONHASHSEED": "0", **env}, core=None
    ) as server:
        yield server, out


def counted(
    server: harness.Server, out: Path, paths: list[str], token: str | None, settled: bool = False
) -> float:
    """Instructions per request of `paths` (after WARM of them, uncounted).

    `settled`: first wait for the server's start-up work to end (a list page waits for the
    columnar copy's first read, which runs on a thread from the server's start: under
    callgrind it lasts minutes, and would otherwise be counted with the requests)."""
    if settled:
        send(server.base, ["/v1/applicants?limit=1"], token)
    send(server.base, paths[:WARM], token)
    control = ["callgrind_control", "-i"]
    subprocess.run([*control, "on", str(server.pid)], check=True, capture_output=True)
    send(server.base, paths[WARM:], token)
    subprocess.run([*control, "off", str(server.pid)], check=True, capture_output=True)
    os.kill(server.pid, signal.SIGINT)
    deadline = time.monotonic() + 120
    while not out.exists() or "totals:" not in out.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"callgrind wrote no totals to {out}")
        time.sleep(0.5)
    totals = [line for line in out.read_text().splitlines() if line.startswith("totals:")]
    return int(totals[0].split()[1]) / (len(paths) - WARM)


def served_case(limit: str, case: str, db: Path, token: str, ids: list[str]) -> float:
    """One `leasestar serve` under callgrind, `limit` applied, counting `case`."""
    command = [str(LEASESTAR), "serve", "--db", str(db), "--host", "127.0.0.1", "--port", "{port}"]
    total = WARM + COUNTS[case]
    paths = (
        [f"/v1/applicants/{ids[n % len(ids)]}" for n in range(total)]
        if case == "get"
        else ["/v1/applicants"] * total
    )
    with under_callgrind(f"{case}-{limit}", command, "/health", LIMITS[limit]) as (server, out):
        return counted(server, out, paths, token, settled=True)


def http_floor(db: Path, token: str, ids: list[str]) -> float:
    """The HTTP floor of get by id: `floor_app.py` answering a get's exact body."""
    folder = Path(tempfile.mkdtemp(prefix="leasestar-floor-"))
    with harness.leasestar_server("body", db, core=None) as server:
        parts = urlsplit(server.base)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
        connection.request(
            "GET", f"/v1/applicants/{ids[0]}", headers={"Authorization": f"Bearer {token}"}
        )
        (folder / "get_by_id.json").write_bytes(connection.getresponse().read())
        connection.close()
    command = [
        str(UVICORN), "floor_app:create_floor_app", "--factory", "--app-dir", str(BENCH),
        "--host", "127.0.0.1", "--port", "{port}", "--workers", "1", "--log-level", "info",
        "--no-access-log",
    ]  # fmt: skip
    paths = ["/floor/get_by_id"] * (WARM + COUNTS["get"])
    with under_callgrind("floor", command, "/floor/tiny", {"BENCH_FLOOR_DIR": str(folder)}) as (
        server,
        out,
    ):
        return counted(server, out, paths, None)


def in_process_drive(db: Path, count: int) -> None:
    """`count` record reads and their bytes, as the in-process floor makes them."""
    connection = databases.read_only(db)
    decode = BodyDecoder.of(connection).decode
    ids = databases.sample_ids(db)
    head = b'{"meta":{"offset":0},"results":'
    for n in range(count + 200):
        (blob,) = connection.execute(RECORD_SQL, (ids[(n * 7919) % len(ids)],)).fetchone()
        b"".join((head, decode(blob), b"}"))


def in_process_floor(db: Path) -> float:
    few, many = 200, 5200
    runs = [
        harness.callgrind_instructions([__file__, "--drive", str(n)], {"BENCH_DB": str(db)})
        for n in (few, many)
    ]
    return (runs[1] - runs[0]) / (many - few)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drive", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md as is")
    args = parser.parse_args()
    if args.drive is not None:
        in_process_drive(Path(os.environ["BENCH_DB"]), args.drive)
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is required: apt-get install -y valgrind")
    db = databases.ensure_database(ROWS)
    token = databases.create_token(db, "instructions")
    ids = databases.sample_ids(db)
    load, started = provenance.loadavg(), time.monotonic()
    jobs: dict[tuple[str, str], Callable[[], float]] = {
        (case, limit): functools.partial(served_case, limit, case, db, token, ids)
        for case in ("get", "list")
        for limit in LIMITS
    }
    jobs["floor", "http"] = functools.partial(http_floor, db, token, ids)
    jobs["floor", "in-process"] = functools.partial(in_process_floor, db)
    # Counts do not depend on what else runs: one valgrind per core at once.
    with ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 2)) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        got = {key: future.result() for key, future in futures.items()}
    harness.say(json.dumps({" / ".join(key): round(value) for key, value in got.items()}))
    rows = []
    for case, label in (("get", "get by id"), ("list", "list default")):
        off = got[case, "off"]
        for limit in ("on, no cap", "on, default cap"):
            on = got[case, limit]
            rows.append(
                f"| {label} | {limit} | {off:,.0f} | {on:,.0f} | {on - off:+,.0f} | "
                f"{on / off - 1:+.1%} |"
            )
    composite = got["floor", "http"] + got["floor", "in-process"]
    get_off = got["get", "off"]
    section = "\n".join(
        [
            "<!-- BEGIN rate-limit-instructions -->",
            "### The same cost in instructions, on the real server (callgrind)",
            "",
            f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on commit "
            f"`{provenance.git_commit()}` with `.venv/bin/python "
            "benchmarks/rate_limit_instructions.py`: `leasestar serve` (one worker, its "
            f"defaults) on {ROWS:,} applicants under callgrind, instrumentation switched on "
            f"(`callgrind_control -i`) for {COUNTS['get']:,} gets of random ids or "
            f"{COUNTS['list']} list pages after {WARM} uncounted, on one kept-alive "
            "connection: uvicorn's parsing and header checks are in the counts, start-up "
            "and the client are not. Load does not move these counts (load average "
            f"{load} before, {provenance.loadavg()} after; took "
            f"{(time.monotonic() - started) / 60:.1f} min). Not in them: the kernel's side "
            "of system calls (the limit adds one `flock` pair every 16 requests).",
            "",
            "| case | rate limit | off | on | the limit's cost | of a request |",
            "|---|---|---:|---:|---:|---:|",
            *rows,
            "",
            "Get by id against its floors, in the same instructions: HTTP floor "
            f"(`floor_app.py` answering a get's body under the same uvicorn) "
            f"{got['floor', 'http']:,.0f}, in-process floor (the record read and its "
            f"bytes) {got['floor', 'in-process']:,.0f}, composite {composite:,.0f}: get by "
            f"id (rate limit off) is **{composite / get_off:.2f}x** of its composite floor "
            "in instructions. The req/s ratio of `run.py` reads lower (RESULTS.md, "
            '"What clients do"): its in-process floor runs hot in a loop, where the '
            "server's read runs between uvicorn's work, and req/s counts the kernel's "
            "network stack too.",
            "<!-- END rate-limit-instructions -->",
        ]
    )
    print(section)
    if not args.no_write:
        provenance.write_section(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
