"""The shared rate limit's cost in instructions: `python benchmarks/rate_limit_instructions.py`.

req/s and CPU time move with whatever else the machine runs; the instructions a request
executes do not. So this counts them with valgrind's callgrind: the app is driven
through ASGI in-process (as `request_cost.py` does: no socket, no HTTP parser) for 200
and for 1,200 requests, with the rate limit off and on (`999999999/day`: every request
counted in `<db>-ratelimit`, the default `--token-concurrency`), and the difference of
the two runs over 1,000 requests is one request's count, start-up cancelled out. Not
counted: the kernel's side of system calls (the counter's two `flock` calls, about
0.4 us each) and uvicorn writing the four headers. Eight runs under valgrind, one per
core at a time: 10 to 25 minutes on 2 cores, as busy as they are.
Writes the `rate-limit-instructions` section of `benchmarks/RESULTS.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import databases
import harness
import provenance
from request_cost import scope_for

from leasestar.config import RateLimit, Settings
from leasestar.main import create_app

ROWS = 100_000
FEW, MANY = 200, 1200
CASES = ("list default", "get by id")


def scope(path: str, token: str) -> dict[str, Any]:
    """A get as uvicorn hands it to the app."""
    return scope_for(path, "", token)


async def drive(db: Path, limited: bool, case: str, count: int, token: str) -> None:
    """`count` requests of `case` through the app, after 100 to warm it."""
    ids = [row[0] for row in databases.read_only(db).execute("SELECT id FROM applicants LIMIT 500")]
    limit = RateLimit(999_999_999, "day") if limited else None
    app = create_app(Settings(db_path=db, log_format="off", rate_limit=limit))
    statuses: set[int] = set()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    async with app.lifespan():
        for n in range(count + 100):
            path = "/v1/applicants" if case == CASES[0] else f"/v1/applicants/{ids[n % len(ids)]}"
            await app(scope(path, token), receive, send)
    if statuses != {200}:
        raise RuntimeError(f"answers other than 200: {statuses}")


def instructions(db: Path, limited: bool, case: str, count: int, token: str) -> int:
    """The instructions one run of `drive` executes, by callgrind."""
    arguments = [__file__, "--drive", "on" if limited else "off", case, str(count)]
    return harness.callgrind_instructions(arguments, {"BENCH_DB": str(db), "BENCH_TOKEN": token})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drive", nargs=3, metavar=("on|off", "CASE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md as is")
    args = parser.parse_args()
    if args.drive:
        mode, case, count = args.drive
        db, token = Path(os.environ["BENCH_DB"]), os.environ["BENCH_TOKEN"]
        asyncio.run(drive(db, mode == "on", case, int(count), token))
        return 0
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is required: apt-get install -y valgrind")
    db = databases.ensure_database(ROWS)
    token = databases.create_token(db, "instructions")
    load, started = provenance.loadavg(), time.monotonic()
    runs = [(case, limited, n) for case in CASES for limited in (False, True) for n in (FEW, MANY)]
    # Counts do not depend on what else runs: one valgrind per core at once.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counted = dict(
            zip(
                runs,
                pool.map(lambda run: instructions(db, run[1], run[0], run[2], token), runs),
                strict=True,
            )
        )
    rows = []
    for case in CASES:
        off, on = (
            (counted[case, limited, MANY] - counted[case, limited, FEW]) / (MANY - FEW)
            for limited in (False, True)
        )
        harness.say(f"{case}: off {off:,.0f}, on {on:,.0f} instructions a request")
        rows.append(f"| {case} | {off:,.0f} | {on:,.0f} | {on - off:+,.0f} | {on / off - 1:+.1%} |")
    section = "\n".join(
        [
            "<!-- BEGIN rate-limit-instructions -->",
            "### The same cost in instructions (callgrind)",
            "",
            f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on commit "
            f"`{provenance.git_commit()}` with `.venv/bin/python "
            "benchmarks/rate_limit_instructions.py`: the app driven in-process through ASGI "
            f"on {ROWS:,} applicants, instructions per request as the difference of "
            f"{MANY:,} and {FEW} requests under callgrind, rate limit off and on "
            "(`999999999/day`, the default `--token-concurrency`). Load does not move these "
            f"counts (load average {load} before, {provenance.loadavg()} after; took "
            f"{(time.monotonic() - started) / 60:.1f} min). Not in them: the kernel's side of "
            "the counter's two `flock` calls and uvicorn writing the four headers.",
            "",
            "| case | off | on | the limit's cost | of a request |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "<!-- END rate-limit-instructions -->",
        ]
    )
    print(section)
    if not args.no_write:
        provenance.write_section(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
