"""What the shared rate limit costs a request (issue 11): `python benchmarks/rate_limit_cost.py`.

Two `leasestar serve` (one worker each) over the same 100k database: one with the rate
limit off, one counting every request in the shared `<db>-ratelimit` file
(`leasestar/rate_limit.py`) with a budget no run reaches. wrk drives list default and
get by random id on each, in interleaved slices so background load hits both alike; the
difference in req/s is the limiter's cost (goal: under 5 %). Beside req/s, each server's
CPU time per request (utime + stime from /proc over the slices): on a machine shared with
other work, load moves req/s more than it moves the CPU a request takes. Writes the
`rate-limit` section of `benchmarks/RESULTS.md`; `--seconds 2 --slices 2` is a quick look.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import databases
import harness
import provenance

ROWS = 100_000
# Far beyond any run: every request is counted, none refused.
NO_REFUSAL = "999999999/day"
SERVERS = {"rate limit off": "off", "shared rate limit": NO_REFUSAL}


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, every thread's (utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Served:
    """A server under wrk, and the CPU it spent on the measured slices."""

    target: harness.WrkTarget
    pid: int
    cpu: float = 0.0

    def run(self, seconds: int) -> None:
        before = cpu_seconds(self.pid)
        self.target.run(seconds)
        self.cpu += cpu_seconds(self.pid) - before

    def cpu_us_per_request(self) -> float:
        return self.cpu / max(self.target.measured().requests, 1) * 1e6


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
        servers = {
            name: stack.enter_context(
                harness.leasestar_server(
                    f"rate-limit-{n}",
                    db,
                    {"LEASESTAR_RATE_LIMIT": limit, "LEASESTAR_LOG_FORMAT": "off"},
                )
            )
            for n, (name, limit) in enumerate(SERVERS.items())
        }
        for case, path, ids_for in (
            ("list default", "/v1/applicants", None),
            ("get by random id", f"/v1/applicants/{ids[0]}", ids_file),
        ):
            targets = [
                Served(harness.WrkTarget(name, s.base + path, token=token, ids_file=ids_for), s.pid)
                for name, s in servers.items()
            ]
            for served in targets:
                served.target.run(1, keep=False)  # warm-up
            for _ in range(slices):
                for served in targets:
                    served.run(seconds)
            off, shared = (served.target.measured() for served in targets)
            off_cpu, shared_cpu = (served.cpu_us_per_request() for served in targets)
            cost = 1 - shared.rps / off.rps
            cpu_cost = shared_cpu / off_cpu - 1
            rows.append(
                f"| {case} | {off.rps:,.0f} | {shared.rps:,.0f} | {cost:+.1%} | "
                f"{off_cpu:.0f} | {shared_cpu:.0f} | {cpu_cost:+.1%} | "
                f"{off.p99_ms:.2f} | {shared.p99_ms:.2f} |"
            )
            harness.say(
                f"{case}: off {off.rps:,.0f} req/s {off_cpu:.0f} us CPU, shared "
                f"{shared.rps:,.0f} ({cost:+.1%}) {shared_cpu:.0f} us ({cpu_cost:+.1%})"
            )
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
            f"{provenance.loadavg()} after. Goal: a cost under 5 % of req/s. CPU us/req: the "
            "server's CPU time (all its threads) over the measured slices, per request.",
            "",
            "| case | off req/s | shared req/s | cost | off CPU us/req | shared CPU us/req "
            "| CPU cost | off p99 ms | shared p99 ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
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
