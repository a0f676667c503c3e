"""No token can starve the rest (issue 17.5): a light token's latency alone and while a
heavy token, from a process of its own, sends its allowance of the most expensive request;
one server per `--token-concurrency`. Method: sections.toml, RESULTS.md."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import multiprocessing
import random
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import databases
import harness
import provenance
from cases import iso

ROWS = 100_000
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


def _heavy_request(base: str, path: str, token: str) -> tuple[int, float]:
    split = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=DRAIN_SECONDS)
    started = time.perf_counter()
    try:
        connection.request(
            "GET", path, headers={"Authorization": f"Bearer {token}", **HEAVY_HEADERS}
        )
        response = connection.getresponse()
        while response.read(1 << 20):  # read to the end, a MiB at a time, and forget it
            pass
        return response.status, (time.perf_counter() - started) * 1000
    except OSError:
        return 0, 0.0
    finally:
        connection.close()


def heavy_sender(base: str, token: str, paths: list[str], go: Event, stop: Event, out: Any) -> None:
    """Send HEAVY_RATE requests a second from `go` until `stop`, then wait for the answers."""
    heavy = Heavy()
    outstanding = threading.Semaphore(HEAVY_OUTSTANDING)
    lock = threading.Lock()

    def one(path: str) -> None:
        try:
            status, ms = _heavy_request(base, path, token)
            with lock:
                heavy.statuses[status] = heavy.statuses.get(status, 0) + 1
                if status == 200:
                    heavy.served_ms.append(ms)
        finally:
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
    client = harness.KeepAlive(base)
    latencies: list[float] = []
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            status, _, _, elapsed = client.get(paths[len(latencies) % len(paths)], token)
            if status != 200:
                raise RuntimeError(f"the light token got {status}")
            latencies.append(elapsed * 1000)
            due = started + len(latencies) / LIGHT_RATE
            time.sleep(max(due - time.perf_counter(), 0))
    finally:
        client.close()
    return latencies


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered)) - 1))]


@dataclass
class Variant:
    concurrency: str
    alone: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)
    heavy: list[Heavy] = field(default_factory=list)

    def row(self) -> list[str]:
        statuses = sum((Counter(h.statuses) for h in self.heavy), Counter[int]())
        served = [ms for h in self.heavy for ms in h.served_ms]
        ratio = percentile(self.loaded, 99) / percentile(self.alone, 99)
        sent, skipped = sum(h.sent for h in self.heavy), sum(h.skipped for h in self.heavy)
        phases = (self.alone, self.loaded)
        return [
            self.concurrency, str(len(self.alone)),
            *(f"{percentile(values, p):.2f}" for values in phases for p in (50, 99)),
            f"**{ratio:.2f}x** {'✅' if ratio <= 2 else '❌'}", f"{sent:,} ({skipped:,} not sent)",
            f"{statuses[200]:,}", f"{statuses[429]:,}",
            f"{percentile(served, 50) / 1000 if served else 0:.2f}",
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
            harness.say(
                f"concurrency {variant.concurrency}, round {number + 1}: light p99 alone "
                f"{percentile(variant.alone, 99):.2f} ms, with heavy "
                f"{percentile(variant.loaded, 99):.2f} ms"
            )


def report(
    variants: list[Variant], rows: int, rounds: int, seconds: float, load: str, took: float
) -> str:
    return provenance.section(
        "fairness",
        provenance.table(
            "| `--token-concurrency` | light requests per phase | p50 alone ms | p99 alone ms "
            "| p50 with heavy ms | p99 with heavy ms | p99 ratio | heavy sent | heavy 200 "
            "| heavy 429 | heavy p50 s (200s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            (variant.row() for variant in variants),
        ),
        rows=rows, rounds=rounds, seconds=seconds, minutes=took / 60, load_before=load,
        load_after=provenance.loadavg(), light_rate=LIGHT_RATE, heavy_rate=HEAVY_RATE,
        outstanding=HEAVY_OUTSTANDING,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per server (default 4)")
    parser.add_argument("--seconds", type=float, default=20, help="seconds per slice (default 20)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 8 s: a look")
    smoke = {"rows": 2_000, "rounds": 1, "seconds": 3.0}
    args, outputs = provenance.options(parser, smoke, rows=ROWS)
    if args.quick and not args.smoke:
        args.rounds, args.seconds = 2, 8.0
    rows, rounds, seconds = args.rows, args.rounds, args.seconds
    db = databases.ensure_database(rows, outputs.work)
    load, started = provenance.loadavg(), time.monotonic()
    variants = [Variant(concurrency) for concurrency in VARIANTS]
    with harness.on_core(harness.CLIENT_CORE):
        for variant in variants:
            measure(variant, db, rounds, seconds, outputs.work)
    section = report(variants, rows, rounds, seconds, load, time.monotonic() - started)
    provenance.publish(section, outputs.results_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
