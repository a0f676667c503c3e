"""What the shared rate limit costs a request (issue 11): servers alike but for their
limit, in interleaved slices on fresh sets of servers. Method: sections.toml, RESULTS.md."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path

import databases
import harness
import provenance

ROWS = 100_000
# Far beyond any run: every request is counted, none refused.
NO_REFUSAL = "999999999/day"
# Over the defaults: the limit off (the per-token cap too), the shared limit alone, and
# with the default per-token cap, which one token's 16 connections meet (they queue).
SERVERS: dict[str, dict[str, str]] = {
    "rate limit off": {"LEASESTAR_RATE_LIMIT": "off"},
    "shared rate limit": {"LEASESTAR_RATE_LIMIT": NO_REFUSAL, "LEASESTAR_TOKEN_CONCURRENCY": "off"},
    "with the per-token cap": {"LEASESTAR_RATE_LIMIT": NO_REFUSAL},
}
# Every server alike but for its limit: no access log, one hash seed (two servers with
# the limit off were 7-28 % apart with random seeds, within 3 % in 10 of 14 with seed 0).
SAME_PROCESS = {"LEASESTAR_LOG_FORMAT": "off", "PYTHONHASHSEED": "0"}
SERVERS = {name: {**env, **SAME_PROCESS} for name, env in SERVERS.items()}


def measure(seconds: int, slices: int, pairs: int, rows: int, work: Path) -> str:
    db = databases.ensure_database(rows, work)
    token = databases.create_token(db, "rate-limit")
    ids_file = work / "rate-limit-ids.txt"
    ids = databases.first_ids(db, 10_000, ids_file)
    started, load = time.monotonic(), provenance.loadavg()
    cases = (
        ("list default", "/v1/applicants", None),
        ("get by random id", f"/v1/applicants/{ids[0]}", ids_file),
    )
    # case -> one target per server (SERVERS' order) for each set of servers
    runs: dict[str, list[list[harness.WrkTarget]]] = {case: [] for case, _, _ in cases}
    for pair in range(pairs):
        # Fresh servers each set: two started alike differ by up to 20 % for as long as they
        # live, more than the cost measured; over several sets that averages out.
        with contextlib.ExitStack() as stack:
            servers = {}
            for n, (name, env) in enumerate(SERVERS.items()):
                server = harness.leasestar_server(f"rate-limit-{pair}-{n}", db, env, work=work)
                servers[name] = stack.enter_context(server)
            for case, path, ids_for in cases:
                targets = [
                    harness.WrkTarget(name, s.base + path, token, ids_for, pid=s.pid)
                    for name, s in servers.items()
                ]
                harness.interleave(targets, slices, seconds, 1, order="rotate", start=pair)
                runs[case].append(targets)
                harness.say(
                    f"set {pair + 1}/{pairs}, {case}: "
                    + ", ".join(f"{t.name} {t.measured().rps:,.0f}" for t in targets)
                )
    rows_out: list[list[str]] = []
    for case, sets in runs.items():
        off_rps = statistics.fmean(one[0].measured().rps for one in sets)
        off_cpu = statistics.fmean(one[0].cpu_us_per_request() for one in sets)
        cells = [f"{off_rps:,.0f}", f"{off_cpu:.0f}"]
        for number, name in enumerate(list(SERVERS)[1:], 1):
            costs = [1 - one[number].measured().rps / one[0].measured().rps for one in sets]
            cpu_costs = [
                one[number].cpu_us_per_request() / one[0].cpu_us_per_request() - 1 for one in sets
            ]
            rps = statistics.fmean(one[number].measured().rps for one in sets)
            cpu = statistics.fmean(one[number].cpu_us_per_request() for one in sets)
            cost, cpu_cost = statistics.fmean(costs), statistics.fmean(cpu_costs)
            cost_range = f"{cost:+.1%} ({min(costs):+.1%} to {max(costs):+.1%})"
            cells += [f"{rps:,.0f}", cost_range, f"{cpu:.0f} ({cpu_cost:+.1%})"]
            harness.say(
                f"{case}, {name}: {rps:,.0f} req/s ({cost:+.1%}), {cpu:.0f} us CPU "
                f"({cpu_cost:+.1%}) against {off_rps:,.0f} req/s, {off_cpu:.0f} us off"
            )
        rows_out.append([case, *cells])
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    return provenance.section(
        "rate-limit",
        provenance.table(
            "| case | off req/s | off CPU us/req | rate limit req/s | its cost | its CPU "
            "us/req | with the cap req/s | its cost | its CPU us/req |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            rows_out,
        ),
        provenance.text("rate-limit", "busy") if busy else "",
        rows=rows, no_refusal=NO_REFUSAL, connections=harness.CONNECTIONS, pairs=pairs,
        slices=slices, seconds=seconds, minutes=(time.monotonic() - started) / 60,
        load_before=load, load_after=provenance.loadavg(),
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=3, help="seconds per slice (default 3)")
    parser.add_argument("--slices", type=int, default=3, help="slices per server (default 3)")
    parser.add_argument("--pairs", type=int, default=4, help="sets of fresh servers (default 4)")
    smoke = {"rows": 2_000, "seconds": 1, "slices": 1, "pairs": 1}
    args, outputs = provenance.options(parser, smoke, rows=ROWS)
    section = measure(args.seconds, args.slices, args.pairs, args.rows, outputs.work)
    provenance.publish(section, outputs.results_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
