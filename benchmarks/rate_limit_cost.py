"""What the shared rate limit costs a request (issue 11): `python benchmarks/rate_limit_cost.py`.

Servers alike but for their limit (`SERVERS`), in interleaved slices on several sets of
freshly started servers; req/s and each server's CPU time per request (which load moves
less than req/s). Writes the `rate-limit` section; `--pairs 2 --slices 2` is a quick look.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from dataclasses import dataclass

import databases
import harness
import provenance

ROWS = 100_000
# Far beyond any run: every request is counted, none refused.
NO_REFUSAL = "999999999/day"
# Each server's settings over the defaults: the limit off (which turns the per-token cap
# off too), the shared rate limit alone, and with the default per-token cap (issue 17),
# which a single token's 16 connections meet: its requests queue for their turns.
SERVERS: dict[str, dict[str, str]] = {
    "rate limit off": {"LEASESTAR_RATE_LIMIT": "off"},
    "shared rate limit": {"LEASESTAR_RATE_LIMIT": NO_REFUSAL, "LEASESTAR_TOKEN_CONCURRENCY": "off"},
    "with the per-token cap": {"LEASESTAR_RATE_LIMIT": NO_REFUSAL},
}

# Every server alike but for its limit: no access log, and one hash seed (two servers
# with the limit off, run at once on one core, were 7-28 % apart in req/s in each of 6
# slices with random seeds, and within 3 % in 10 of 14 with seed 0: where a dictionary's
# keys collide follows the seed).
SAME_PROCESS = {"LEASESTAR_LOG_FORMAT": "off", "PYTHONHASHSEED": "0"}


@dataclass
class Served:
    """A server under wrk, and the CPU it spent on the measured slices."""

    target: harness.WrkTarget
    pid: int
    cpu: float = 0.0

    def run(self, seconds: int) -> None:
        before = harness.cpu_seconds(self.pid)
        self.target.run(seconds)
        self.cpu += harness.cpu_seconds(self.pid) - before

    def cpu_us_per_request(self) -> float:
        return self.cpu / max(self.target.measured().requests, 1) * 1e6


def measure(seconds: int, slices: int, pairs: int) -> str:
    db = databases.ensure_database(ROWS)
    token = databases.create_token(db, "rate-limit")
    ids = [
        row[0] for row in databases.read_only(db).execute("SELECT id FROM applicants LIMIT 10000")
    ]
    ids_file = harness.WORK / "rate-limit-ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    started = time.monotonic()
    load = provenance.loadavg()
    cases = (
        ("list default", "/v1/applicants", None),
        ("get by random id", f"/v1/applicants/{ids[0]}", ids_file),
    )
    # case -> one measurement per server (SERVERS' order) for each set of servers
    runs: dict[str, list[list[Served]]] = {case: [] for case, _, _ in cases}
    for pair in range(pairs):
        # Fresh processes for each set: two servers started alike differ by up to 20 % in
        # req/s for as long as they live (measured: both with the limit off), more than
        # the cost measured; over several sets that difference averages out.
        with contextlib.ExitStack() as stack:
            servers = {
                name: stack.enter_context(
                    harness.leasestar_server(f"rate-limit-{pair}-{n}", db, {**env, **SAME_PROCESS})
                )
                for n, (name, env) in enumerate(SERVERS.items())
            }
            for case, path, ids_for in cases:
                measured = [
                    Served(
                        harness.WrkTarget(name, s.base + path, token=token, ids_file=ids_for),
                        s.pid,
                    )
                    for name, s in servers.items()
                ]
                for served in measured:
                    served.target.run(1, keep=False)  # warm-up
                for slice_number in range(slices):
                    turn = (pair + slice_number) % len(measured)
                    for served in measured[turn:] + measured[:turn]:
                        served.run(seconds)
                runs[case].append(measured)
                harness.say(
                    f"set {pair + 1}/{pairs}, {case}: "
                    + ", ".join(f"{m.target.name} {m.target.measured().rps:,.0f}" for m in measured)
                )
    rows: list[list[str]] = []
    for case, sets in runs.items():
        off_rps = statistics.fmean(one[0].target.measured().rps for one in sets)
        off_cpu = statistics.fmean(one[0].cpu_us_per_request() for one in sets)
        cells = [f"{off_rps:,.0f}", f"{off_cpu:.0f}"]
        for number, name in enumerate(list(SERVERS)[1:], 1):
            costs = [
                1 - one[number].target.measured().rps / one[0].target.measured().rps for one in sets
            ]
            cpu_costs = [
                one[number].cpu_us_per_request() / one[0].cpu_us_per_request() - 1 for one in sets
            ]
            rps = statistics.fmean(one[number].target.measured().rps for one in sets)
            cpu = statistics.fmean(one[number].cpu_us_per_request() for one in sets)
            cost, cpu_cost = statistics.fmean(costs), statistics.fmean(cpu_costs)
            cells += [
                f"{rps:,.0f}",
                f"{cost:+.1%} ({min(costs):+.1%} to {max(costs):+.1%})",
                f"{cpu:.0f} ({cpu_cost:+.1%})",
            ]
            harness.say(
                f"{case}, {name}: {rps:,.0f} req/s ({cost:+.1%}), {cpu:.0f} us CPU "
                f"({cpu_cost:+.1%}) against {off_rps:,.0f} req/s, {off_cpu:.0f} us off"
            )
        rows.append([case, *cells])
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    return provenance.section(
        "rate-limit",
        provenance.table(
            "| case | off req/s | off CPU us/req | rate limit req/s | its cost | its CPU "
            "us/req | with the cap req/s | its cost | its CPU us/req |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            rows,
        ),
        provenance.text("rate-limit", "busy") if busy else "",
        when=provenance.now(),
        commit=provenance.git_commit(),
        rows=ROWS,
        no_refusal=NO_REFUSAL,
        connections=harness.CONNECTIONS,
        pairs=pairs,
        slices=slices,
        seconds=seconds,
        minutes=(time.monotonic() - started) / 60,
        machine=provenance.describe_machine(),
        load_before=load,
        load_after=provenance.loadavg(),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=3, help="seconds per slice (default 3)")
    parser.add_argument("--slices", type=int, default=3, help="slices per server (default 3)")
    parser.add_argument("--pairs", type=int, default=4, help="sets of fresh servers (default 4)")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md as is")
    args = parser.parse_args()
    harness.ensure_wrk()
    harness.raise_priority()
    section = measure(args.seconds, args.slices, args.pairs)
    print(section)
    if not args.no_write:
        provenance.write_section(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
