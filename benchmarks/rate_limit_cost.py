"""What the shared rate limit costs a request (issue 11): `python benchmarks/rate_limit_cost.py`.

Two `leasestar serve` (one worker each) over the same 100k database: one with the rate
limit off, one counting every request in the shared `<db>-ratelimit` file
(`leasestar/rate_limit.py`) with a budget no run reaches. wrk drives list default and
get by random id on each, in interleaved slices so background load hits both alike; the
difference in req/s is the limiter's cost (goal: under 5 %). Writes the `rate-limit`
section of `benchmarks/RESULTS.md`; `--seconds 2 --slices 2` is a quick look.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import databases
import harness
import provenance

ROWS = 100_000
# Far beyond any run: every request is counted, none refused.
NO_REFUSAL = "999999999/day"
SERVERS = {"rate limit off": "off", "shared rate limit": NO_REFUSAL}


def measure(seconds: int, slices: int) -> str:
    db = databases.ensure_database(ROWS)
    token = databases.create_token(db, "rate-limit")
    ids = [
        row[0] for row in databases.read_only(db).execute("SELECT id FROM applicants LIMIT 10000")
    ]
    ids_file = harness.WORK / "rate-limit-ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    started = time.monotonic()
    load = provenance.loadavg()
    rows: list[str] = []
    with contextlib.ExitStack() as stack:
        bases = {
            name: stack.enter_context(
                harness.leasestar_server(
                    f"rate-limit-{n}",
                    db,
                    {"LEASESTAR_RATE_LIMIT": limit, "LEASESTAR_LOG_FORMAT": "off"},
                )
            ).base
            for n, (name, limit) in enumerate(SERVERS.items())
        }
        for case, path, ids_for in (
            ("list default", "/v1/applicants", None),
            ("get by random id", f"/v1/applicants/{ids[0]}", ids_file),
        ):
            targets = [
                harness.WrkTarget(name, base + path, token=token, ids_file=ids_for)
                for name, base in bases.items()
            ]
            for target in targets:
                target.run(1, keep=False)  # warm-up
            for _ in range(slices):
                for target in targets:
                    target.run(seconds)
            off, shared = (target.measured() for target in targets)
            cost = 1 - shared.rps / off.rps
            rows.append(
                f"| {case} | {off.rps:,.0f} | {shared.rps:,.0f} | {cost:+.1%} | "
                f"{off.p99_ms:.2f} | {shared.p99_ms:.2f} |"
            )
            harness.say(f"{case}: off {off.rps:,.0f} req/s, shared {shared.rps:,.0f} ({cost:+.1%})")
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    caveat = (
        "**Provisional**: the machine was busy with other work (load average above its "
        "cores), which moves req/s by more than the cost measured; a quiet run decides."
        if busy
        else ""
    )
    return "\n".join(
        [
            "<!-- BEGIN rate-limit -->",
            "## The shared rate limit's cost (issue 11)",
            "",
            f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on commit "
            f"`{provenance.git_commit()}` with `make bench` (`benchmarks/rate_limit_cost.py`): "
            f"{ROWS:,} applicants, `leasestar serve` (one worker, access log off) with "
            f"`LEASESTAR_RATE_LIMIT=off` and with `{NO_REFUSAL}` (every request counted in "
            f"`<db>-ratelimit`, none refused), wrk `-c{harness.CONNECTIONS}`, {slices} "
            f"interleaved slices of {seconds} s each, measuring took "
            f"{(time.monotonic() - started) / 60:.1f} min. Machine: "
            f"{provenance.describe_machine()}; load average {load} before, "
            f"{provenance.loadavg()} after. Goal: a cost under 5 % of req/s.",
            "",
            "| case | off req/s | shared req/s | cost | off p99 ms | shared p99 ms |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
            *(["", caveat] if caveat else []),
            "<!-- END rate-limit -->",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="seconds per slice (default 5)")
    parser.add_argument("--slices", type=int, default=4, help="slices per server (default 4)")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md as is")
    args = parser.parse_args()
    harness.ensure_wrk()
    harness.raise_priority()
    section = measure(args.seconds, args.slices)
    print(section)
    if not args.no_write:
        provenance.write_section(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
