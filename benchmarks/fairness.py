"""The rate limit's cases: what the shared limit costs a request (issue 11) and that no
token starves the rest (issue 17.5). Method: sections.toml (rate-limit, fairness)."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import multiprocessing
import os
import random
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from statistics import fmean
from typing import Any

import databases
import harness
import provenance
from cases import iso
from harness import percentile

# Far beyond any run: every request is counted, none refused.
NO_REFUSAL = "999999999/day"
# Every server alike but for its limit: no access log, one hash seed (two servers with
# the limit off were 7-28 % apart with random seeds, within 3 % in 10 of 14 with seed 0);
# the limit off (the per-token cap too), the shared limit alone, and with the default
# per-token cap, which one token's 16 connections meet (they queue).
SAME_PROCESS = {"LEASESTAR_LOG_FORMAT": "off", "PYTHONHASHSEED": "0"}
COST_SERVERS: dict[str, dict[str, str]] = {
    "rate limit off": {"LEASESTAR_RATE_LIMIT": "off", **SAME_PROCESS},
    "shared rate limit": {
        "LEASESTAR_RATE_LIMIT": NO_REFUSAL, "LEASESTAR_TOKEN_CONCURRENCY": "off", **SAME_PROCESS
    },
    "with the per-token cap": {"LEASESTAR_RATE_LIMIT": NO_REFUSAL, **SAME_PROCESS},
}  # fmt: skip
LIGHT_RATE = 8  # requests a second, under the light token's own 600 a minute
HEAVY_RATE = 10  # the heavy token's full allowance: 600 a minute
HEAVY_OUTSTANDING = 32
DRAIN_SECONDS = 180
VARIANTS = ("off", "2")  # --token-concurrency: before the cap, and its default
# The most expensive request found: every record from a random `last_seen` on, one NDJSON
# stream by name, gzip: ~100 MB and a second of a core at 100k rows (a list page: ms).
HEAVY_PATH = "/v1/applicants?order-by=last_name:asc&last_seen_gte="
HEAVY_HEADERS = {"Accept": "application/x-ndjson", "Accept-Encoding": "gzip"}


@dataclass
class Heavy:
    sent: int = 0
    skipped: int = 0  # due, but HEAVY_OUTSTANDING were outstanding
    statuses: dict[int, int] = field(default_factory=dict)
    served_ms: list[float] = field(default_factory=list)


def heavy_sender(base: str, token: str, paths: list[str], go: Event, stop: Event, out: Any) -> None:
    """Send HEAVY_RATE requests a second from `go` until `stop`, then wait for the answers."""
    heavy = Heavy()
    outstanding = threading.Semaphore(HEAVY_OUTSTANDING)
    lock = threading.Lock()
    split = urllib.parse.urlsplit(base)
    headers = {"Authorization": f"Bearer {token}", **HEAVY_HEADERS}

    def one(path: str) -> None:
        connection = http.client.HTTPConnection(split.hostname or "", split.port, DRAIN_SECONDS)
        started, status = time.perf_counter(), 0  # 0: no answer
        try:
            with contextlib.suppress(OSError):
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                while response.read(1 << 20):  # read to the end, a MiB at a time, and forget it
                    pass
                status = response.status
            with lock:
                heavy.statuses[status] = heavy.statuses.get(status, 0) + 1
                if status == 200:
                    heavy.served_ms.append((time.perf_counter() - started) * 1000)
        finally:
            connection.close()
            outstanding.release()

    with ThreadPoolExecutor(max_workers=HEAVY_OUTSTANDING) as pool:
        go.wait()
        started = time.perf_counter()
        while not stop.is_set():
            if outstanding.acquire(blocking=False):
                pool.submit(one, paths[heavy.sent % len(paths)])
                heavy.sent += 1
            else:
                heavy.skipped += 1
            due = started + (heavy.sent + heavy.skipped) / HEAVY_RATE
            stop.wait(max(due - time.perf_counter(), 0))
    out.put(heavy)


def light_slice(base: str, token: str, paths: list[str], seconds: float) -> list[float]:
    """LIGHT_RATE requests a second for `seconds` on one connection: each one's ms."""
    latencies: list[float] = []
    started = time.perf_counter()
    with contextlib.closing(harness.KeepAlive(base)) as client:
        while time.perf_counter() - started < seconds:
            status, _, _, elapsed = client.get(paths[len(latencies) % len(paths)], token)
            if status != 200:
                raise RuntimeError(f"the light token got {status}")
            latencies.append(elapsed * 1000)
            due = started + len(latencies) / LIGHT_RATE
            time.sleep(max(due - time.perf_counter(), 0))
    return latencies


@dataclass
class Variant:
    concurrency: str
    alone: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)
    heavy: list[Heavy] = field(default_factory=list)

    def row(self) -> list[str]:
        statuses = sum((Counter(h.statuses) for h in self.heavy), Counter[int]())
        served = [ms for h in self.heavy for ms in h.served_ms]
        ratio = percentile(self.loaded, 0.99) / percentile(self.alone, 0.99)
        sent, skipped = sum(h.sent for h in self.heavy), sum(h.skipped for h in self.heavy)
        phases = (self.alone, self.loaded)
        return [
            self.concurrency, str(len(self.alone)),
            *(f"{percentile(values, p):.2f}" for values in phases for p in (0.5, 0.99)),
            f"**{ratio:.2f}x** {'✅' if ratio <= 2 else '❌'}", f"{sent:,} ({skipped:,} not sent)",
            f"{statuses[200]:,}", f"{statuses[429]:,}",
            f"{percentile(served, 0.5) / 1000 if served else 0:.2f}",
        ]  # fmt: skip


def measure(variant: Variant, db: Path, rounds: int, seconds: float, work: Path) -> None:
    light_token = databases.create_token(db, "fair-light")
    heavy_token = databases.create_token(db, "fair-heavy")
    ids = databases.first_ids(db, 2000)
    with contextlib.closing(databases.read_only(db)) as reader:
        sql = "SELECT min(last_seen), max(last_seen) FROM applicants"
        low, high = reader.execute(sql).fetchone()
    rng = random.Random(17)
    light_paths = [p for i in ids for p in ("/v1/applicants", f"/v1/applicants/{i}")]
    env = {"LEASESTAR_RATE_LIMIT": "600/minute", "LEASESTAR_LOG_FORMAT": "off"}
    env["LEASESTAR_TOKEN_CONCURRENCY"] = variant.concurrency
    spawn = multiprocessing.get_context("spawn")
    with harness.leasestar_server(f"fairness-{variant.concurrency}", db, env, work=work) as server:
        light_slice(server.base, light_token, light_paths, 2)  # warm-up
        for number in range(rounds):
            variant.alone += light_slice(server.base, light_token, light_paths, seconds)
            # Fresh instants each round: no count cached from an earlier one answers.
            heavy_paths = [
                HEAVY_PATH + urllib.parse.quote(iso(rng.randint(low, high)))
                for _ in range(int(seconds * HEAVY_RATE) + 10)
            ]
            go, stop, out = spawn.Event(), spawn.Event(), spawn.Queue()
            process = spawn.Process(
                target=heavy_sender, args=(server.base, heavy_token, heavy_paths, go, stop, out)
            )
            process.start()
            go.set()
            variant.loaded += light_slice(server.base, light_token, light_paths, seconds)
            stop.set()
            variant.heavy.append(out.get(timeout=DRAIN_SECONDS + 30))
            process.join(timeout=30)
            harness.say(f"concurrency {variant.concurrency}, round {number + 1}: {variant.row()}")


def rate_limit_cost(db: Path, seconds: int, slices: int, pairs: int, rows: int, work: Path) -> str:
    token = databases.create_token(db, "rate-limit")
    ids_file = work / "rate-limit-ids.txt"
    ids = databases.first_ids(db, 10_000, ids_file)
    started, load = time.monotonic(), provenance.loadavg()
    sets = []  # per set of servers, per read, a target per server (COST_SERVERS' order)
    for pair in range(pairs):
        # Fresh servers each set: two started alike differ by up to 20 % for as long as they
        # live, more than the cost measured; over several sets that averages out.
        with contextlib.ExitStack() as stack:
            servers = {
                name: stack.enter_context(
                    harness.leasestar_server(f"rate-limit-{pair}-{n}", db, env, work=work)
                )
                for n, (name, env) in enumerate(COST_SERVERS.items())
            }
            sets.append(harness.reads(servers, token, ids, ids_file))
            for targets in sets[-1]:
                harness.interleave(targets, slices, seconds, 1, order="rotate", start=pair)
                rates = (f"{t.name} {t.measured().rps:,.0f}" for t in targets)
                harness.say(f"set {pair + 1}/{pairs}: " + ", ".join(rates))
    table_rows = []
    for (read, _), per_set in zip(harness.READS, zip(*sets, strict=True), strict=True):
        # Per server (COST_SERVERS' order): its req/s and CPU us per request in each set.
        per_server = list(zip(*per_set, strict=True))
        rps = [[target.measured().rps for target in one] for one in per_server]
        cpu = [[target.cpu_us_per_request() for target in one] for one in per_server]
        cells = [f"{fmean(rps[0]):,.0f}", f"{fmean(cpu[0]):.0f}"]
        for number in range(1, len(per_server)):
            costs = [1 - r / off for r, off in zip(rps[number], rps[0], strict=True)]
            cpu_costs = [c / off - 1 for c, off in zip(cpu[number], cpu[0], strict=True)]
            cells += [
                f"{fmean(rps[number]):,.0f}",
                f"{fmean(costs):+.1%} ({min(costs):+.1%} to {max(costs):+.1%})",
                f"{fmean(cpu[number]):.0f} ({fmean(cpu_costs):+.1%})",
            ]
        table_rows.append([read, *cells])
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    return provenance.section(
        "rate-limit",
        provenance.table(provenance.text("rate-limit", "columns"), table_rows),
        provenance.text("rate-limit", "busy") if busy else "",
        rows=rows, no_refusal=NO_REFUSAL, connections=harness.CONNECTIONS, pairs=pairs,
        slices=slices, seconds=seconds, minutes=(time.monotonic() - started) / 60,
        load_before=load, load_after=provenance.loadavg(),
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("rate-limit", "fairness"), help="one section")
    parser.add_argument("--slice-seconds", type=int, default=3, help="rate limit's slices")
    parser.add_argument("--slices", type=int, default=3, help="rate limit's, per server")
    parser.add_argument("--pairs", type=int, default=4, help="rate limit's sets of servers")
    parser.add_argument("--rounds", type=int, default=4, help="fairness' rounds per server")
    parser.add_argument("--seconds", type=float, default=20, help="fairness' phase seconds")
    smoke = {"rows": 2_000, "slice_seconds": 1, "slices": 1, "pairs": 1, "rounds": 1}
    quick = {"rounds": 2, "seconds": 8.0}  # fairness' only
    args, outputs = provenance.options(parser, {**smoke, "seconds": 3.0}, rows=100_000, quick=quick)
    rows, rounds, seconds = args.rows, args.rounds, args.seconds
    db = databases.ensure_database(rows, outputs.work)
    if args.only != "fairness":
        cost = rate_limit_cost(db, args.slice_seconds, args.slices, args.pairs, rows, outputs.work)
        provenance.publish(cost, outputs.results_md)
    if args.only == "rate-limit":
        return 0
    load, started = provenance.loadavg(), time.monotonic()
    variants = [Variant(concurrency) for concurrency in VARIANTS]
    with harness.on_core(harness.CLIENT_CORE):
        for variant in variants:
            measure(variant, db, rounds, seconds, outputs.work)
    section = provenance.section(
        "fairness",
        provenance.table(provenance.text("fairness", "columns"), (v.row() for v in variants)),
        rows=rows, rounds=rounds, seconds=seconds, minutes=(time.monotonic() - started) / 60,
        load_before=load, load_after=provenance.loadavg(), light_rate=LIGHT_RATE,
        heavy_rate=HEAVY_RATE, outstanding=HEAVY_OUTSTANDING,
    )  # fmt: skip
    provenance.publish(section, outputs.results_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
