"""What the direct route saves get by id, in-process: `python benchmarks/direct_route_cost.py`.

The app is driven through ASGI in-process (no socket, no HTTP parser), built as `make
bench` serves it (access log on, written to /dev/null here; compression on), with the
rate limit off (as `make bench` runs it) and on (`999999999/day`), and each of those with
the direct route of get by id (`leasestar/applicants/direct_route.py`) and without it
(`create_app(direct_route=False)`: every get through Litestar's router). Random ids of
the 100,000-row database, one unscoped token.

- Time: the four variants take turns, `ROUNDS` rounds of `SECONDS` each; a variant's
  figure is its median round, in microseconds per request. Other load moves the figures;
  taking turns keeps the comparison between variants fair.
- Instructions (`--instructions`, needs valgrind): callgrind's count per request, the
  difference of `MANY` and `FEW` requests over their difference (start-up cancelled
  out), which load does not move. Eight runs under valgrind, one per core at a time.

Writes the `direct-route` section of `benchmarks/RESULTS.md` (`--no-write`: print only).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import databases
import harness
import provenance
import uvloop
from request_cost import scope_for

from leasestar.config import RateLimit, Settings
from leasestar.main import create_app

ROWS = 100_000
ROUNDS = 9
SECONDS = 0.3  # per variant and round
FEW, MANY = 200, 1200
# (rate limit on, direct route on), in the order the table lists them.
VARIANTS = ((False, False), (False, True), (True, False), (True, True))


def scope(path: str, token: str) -> dict[str, Any]:
    """A get as uvicorn hands it to the app (wrk's headers)."""
    return scope_for(path, "", token)


@contextlib.contextmanager
def access_log_to_nowhere() -> Iterator[None]:
    """The access log written as served, but to /dev/null: the figures are the server's."""
    with open(os.devnull, "w") as nowhere, contextlib.redirect_stderr(nowhere):
        yield


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def app_of(db: Path, limited: bool, direct: bool) -> Any:
    settings = Settings(
        db_path=db,
        log_format="json",
        rate_limit=RateLimit(999_999_999, "day") if limited else None,
    )
    return create_app(settings, direct_route=direct)


def getter(app: Any, ids: list[str], token: str) -> Callable[[int], Any]:
    """`get(n)` asks for the n-th id (of a shuffled list) and checks the answer is a 200."""
    statuses: set[int] = set()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    async def get(n: int) -> None:
        await app(scope(f"/v1/applicants/{ids[n % len(ids)]}", token), _receive, send)
        if statuses != {200}:
            raise RuntimeError(f"answers other than 200: {statuses}")

    return get


async def time_variants(db: Path, token: str) -> dict[tuple[bool, bool], float]:
    """Median microseconds per get of each variant, over rounds taken in turns."""
    ids = databases.sample_ids(db)
    rounds: dict[tuple[bool, bool], list[float]] = {variant: [] for variant in VARIANTS}
    async with contextlib.AsyncExitStack() as stack:
        gets = {}
        for variant in VARIANTS:
            app = app_of(db, *variant)
            await stack.enter_async_context(app.lifespan())
            gets[variant] = getter(app, ids, token)
            for n in range(500):  # warm: caches, the token's window
                await gets[variant](n)
        for _ in range(ROUNDS):
            for variant in VARIANTS:
                done, started = 0, time.perf_counter()
                while time.perf_counter() - started < SECONDS:
                    await gets[variant](done)
                    done += 1
                rounds[variant].append((time.perf_counter() - started) / done * 1e6)
    return {variant: statistics.median(times) for variant, times in rounds.items()}


async def drive(db: Path, limited: bool, direct: bool, count: int, token: str) -> None:
    """`count` gets through one variant, after 100 to warm it (run under callgrind)."""
    ids = databases.sample_ids(db)
    app = app_of(db, limited, direct)
    async with app.lifespan():
        get = getter(app, ids, token)
        for n in range(count + 100):
            await get(n)


def instructions(db: Path, limited: bool, direct: bool, count: int, token: str) -> int:
    """The instructions one run of `drive` executes, by callgrind."""
    arguments = [
        __file__, "--drive", "on" if limited else "off", "on" if direct else "off", str(count),
    ]  # fmt: skip
    return harness.callgrind_instructions(arguments, {"BENCH_DB": str(db), "BENCH_TOKEN": token})


def count_instructions(db: Path, token: str) -> dict[tuple[bool, bool], float]:
    """Instructions per get of each variant."""
    runs = [(variant, n) for variant in VARIANTS for n in (FEW, MANY)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counted = dict(
            zip(
                runs,
                pool.map(lambda run: instructions(db, *run[0], run[1], token), runs),
                strict=True,
            )
        )
    return {v: (counted[v, MANY] - counted[v, FEW]) / (MANY - FEW) for v in VARIANTS}


def section(
    timed: dict[tuple[bool, bool], float],
    counted: dict[tuple[bool, bool], float] | None,
    load: str,
    minutes: float,
) -> str:
    rows = []
    for limited in (False, True):
        routed, direct = timed[limited, False], timed[limited, True]
        limit = "on" if limited else "off"
        row = f"| {limit} | {routed:.1f} | {direct:.1f} | {direct / routed:.2f}x |"
        if counted is not None:
            routed_i, direct_i = counted[limited, False], counted[limited, True]
            row += f" {routed_i:,.0f} | {direct_i:,.0f} | {direct_i / routed_i:.2f}x |"
        rows.append(row)
    header = "| rate limit | us, Litestar's route | us, direct route | ratio |"
    rule = "|---|---:|---:|---:|"
    if counted is not None:
        header += " instructions, Litestar's route | instructions, direct route | ratio |"
        rule += "---:|---:|---:|"
    return "\n".join(
        [
            "<!-- BEGIN direct-route -->",
            "## Get by id: the direct route against Litestar's route (in-process)",
            "",
            f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on commit "
            f"`{provenance.git_commit()}` with `.venv/bin/python "
            f"benchmarks/direct_route_cost.py{' --instructions' if counted else ''}`: "
            f"the app driven in-process through ASGI on {ROWS:,} applicants (random ids, "
            "access log on, compression on), with get by id answered by the direct route "
            "(`leasestar/applicants/direct_route.py`) and by Litestar's route "
            f"(`create_app(direct_route=False)`). Time: the median of {ROUNDS} rounds taken "
            f"in turns, microseconds per request (load average {load} before, "
            f"{provenance.loadavg()} after; took {minutes:.1f} min)"
            + (
                f"; instructions: callgrind's count per request ({MANY:,} requests less "
                f"{FEW}), which load does not move."
                if counted is not None
                else "."
            ),
            f"Machine: {provenance.describe_machine('litestar', 'uvloop')}.",
            "",
            header,
            rule,
            *rows,
            "<!-- END direct-route -->",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instructions", action="store_true", help="count with callgrind too")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md as is")
    parser.add_argument("--drive", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        limited, direct, count = args.drive
        db, token = Path(os.environ["BENCH_DB"]), os.environ["BENCH_TOKEN"]
        with access_log_to_nowhere():
            uvloop.run(drive(db, limited == "on", direct == "on", int(count), token))
        return 0
    if args.instructions and shutil.which("valgrind") is None:
        sys.exit("valgrind is required: apt-get install -y valgrind")
    db = databases.ensure_database(ROWS)
    token = databases.create_token(db, "direct-route")
    load, started = provenance.loadavg(), time.monotonic()
    harness.say("timing the four variants in turns")
    with access_log_to_nowhere():
        timed = uvloop.run(time_variants(db, token))
    if args.instructions:
        harness.say("counting instructions: eight runs under valgrind")
    counted = count_instructions(db, token) if args.instructions else None
    text = section(timed, counted, load, (time.monotonic() - started) / 60)
    print(text)
    if not args.no_write:
        provenance.write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
