"""Webhooks (issue 28.6): an import with three loopback subscribers against webhooks off,
list req/s while it delivers, commit-to-attempt latency. Method: sections.toml."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import io
import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Final, cast

import databases
import harness
import httptools
import msgspec
import provenance
import uvloop
from harness import CLIENT_CORE, LEASESTAR, WrkTarget, percentile, say
from standardwebhooks.webhooks import Webhook

from leasestar.applicants.pipeline import import_ndjson
from leasestar.database import open_for_write
from leasestar.webhooks.subscriptions import create_subscription, revoke_subscription

# Kept whole: the first requests and then one in SAMPLE_EVERY.
SAMPLE_FIRST: Final = 20
SAMPLE_EVERY: Final = 5000
_OK: Final = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


class _Head(msgspec.Struct):
    change_seq: int
    event_id: str


_decode_head = msgspec.json.Decoder(_Head).decode


@dataclass
class Record:
    arrivals: list[tuple[float, int, str]] = field(default_factory=list)
    samples: list[dict[str, object]] = field(default_factory=list)

    def add(self, headers: dict[str, str], body: bytes) -> None:
        arrived = time.time()
        head = _decode_head(body)
        self.arrivals.append((arrived, head.change_seq, head.event_id))
        count = len(self.arrivals)
        if count <= SAMPLE_FIRST or count % SAMPLE_EVERY == 0:
            self.samples.append({"headers": headers, "body": body.decode()})

    def answer(self, path: str) -> bytes:
        """What the run asks a receiver for: its arrivals, its samples, their count."""
        answers = {
            "/arrivals": lambda: b"".join(msgspec.json.encode(a) + b"\n" for a in self.arrivals),
            "/samples": lambda: json.dumps(self.samples).encode(),
            "/count": lambda: str(len(self.arrivals)).encode(),
        }
        if path not in answers:
            return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
        body = answers[path]()
        return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


class _Connection(asyncio.Protocol):
    def __init__(self, record: Record) -> None:
        self._record = record
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        if self._parser.get_method() == b"POST":
            self._record.add(self._headers, b"".join(self._body))
            self._transport.write(_OK)
        else:
            self._transport.write(self._record.answer(self._url.decode()))
        self._url, self._headers, self._body = b"", {}, []  # the next request's


async def serve_receivers(count: int) -> None:
    """`count` receivers on loopback: their ports printed as JSON, served until SIGTERM."""
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(partial(_Connection, Record()), "127.0.0.1", 0, backlog=64)
        for _ in range(count)
    ]
    ports = [server.sockets[0].getsockname()[1] for server in servers]
    print(json.dumps(ports), flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


SIGNING = ("standard", "standard", "propexo")
POLL_SECONDS = 0.002
# The receivers are on loopback, which deliveries refuse by default.
WEBHOOK_ENV = {"LEASESTAR_WEBHOOK_ALLOW_PRIVATE": "on"}
DELIVERY_WAIT_SECONDS = 3600


@dataclass
class Delivered:
    """Per event (change sequence), the first attempt's arrival at each receiver."""

    latencies: list[float] = field(default_factory=list)  # commit to first attempt, s
    arrivals: list[float] = field(default_factory=list)  # each first attempt's
    lag: float = 0.0  # the last commit to the last first attempt's arrival, s
    deliveries: int = 0  # first attempts, all receivers
    duplicates: int = 0  # attempts after the first


@dataclass
class Receivers:
    ports: list[int]
    moves: list[tuple[float, int]] = field(default_factory=list)  # (instant seen, change seq)
    expected: int = 0  # the events each receiver is to have got

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}/hook"

    def get(self, index: int, path: str) -> bytes:
        return harness.get_ok(f"http://127.0.0.1:{self.ports[index]}{path}")

    def pending(self) -> bool:
        return any(int(self.get(i, "/count")) < self.expected for i in range(len(self.ports)))

    def committed_at(self, change_seq: int) -> float:
        return next(seen for seen, seq in self.moves if seq >= change_seq)

    def delivered(self, after: int, through: int, events: int, what: str) -> Delivered:
        """The figures of the events in (after, through], once every receiver has each."""
        failure = f"{what}: not delivered within {DELIVERY_WAIT_SECONDS} s"
        harness.wait_until(lambda: not self.pending(), DELIVERY_WAIT_SECONDS, failure)
        found, last = Delivered(), 0.0
        for index in range(len(self.ports)):
            first: dict[int, float] = {}
            for line in self.get(index, "/arrivals").splitlines():
                arrived, seq, _ = json.loads(line)
                if after < seq <= through:
                    if seq in first:
                        found.duplicates += 1
                    first[seq] = min(arrived, first.get(seq, arrived))
            if len(first) != events:
                raise RuntimeError(f"receiver {index}: {len(first)} of {events} events")
            for seq, arrived in first.items():
                found.latencies.append(arrived - self.committed_at(seq))
                found.arrivals.append(arrived)
            last = max(last, *first.values())
            found.deliveries += len(first)
        found.lag = last - self.committed_at(through)
        return found

    def verify_samples(self, secrets: list[str]) -> int:
        """How many sampled requests verified (one that does not fails the run)."""
        verified = 0
        for index, secret in enumerate(secrets):
            for sample in json.loads(self.get(index, "/samples")):
                headers, body = sample["headers"], sample["body"].encode()
                if SIGNING[index] == "standard":
                    at = datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
                    expected = Webhook(secret).sign(headers["webhook-id"], at, body.decode())
                    ok = expected in headers["webhook-signature"].split(" ")
                else:
                    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
                    ok = hmac.compare_digest(digest, headers["propexo-signature"])
                if not ok:
                    raise RuntimeError(f"receiver {index}: a request's signature did not verify")
                verified += 1
        return verified


@contextlib.contextmanager
def receiving(count: int, db: Path) -> Iterator[Receivers]:
    """`count` receivers in a process on the client core; meanwhile `sync_state` polled
    every POLL_SECONDS, each move of the change sequence kept with the instant seen."""
    command = [*harness.pinned(CLIENT_CORE), sys.executable, str(Path(__file__).resolve())]
    command += ["--receivers", str(count)]

    def watch(stop: threading.Event) -> None:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            while not stop.is_set():
                seq = databases.change_seq(conn)
                if not receivers.moves or receivers.moves[-1][1] != seq:
                    receivers.moves.append((time.time(), seq))
                time.sleep(POLL_SECONDS)

    with harness.running(command, stdout=subprocess.PIPE, text=True) as process:
        receivers = Receivers(json.loads(process.stdout.readline()))
        with harness.in_background(watch):
            yield receivers


def timed_import(db: Path, file: Path) -> tuple[float, float]:
    return harness.timed_run([str(LEASESTAR), "import", "--db", str(db), str(file)])


def steady_imports(db: Path, rows: int, seconds: int) -> list[float]:
    """`rows` changed records imported in this process every second; each import's seconds."""
    lines = databases.ndjson(rows * seconds, 0, "steady").splitlines(True)
    took = []
    with contextlib.closing(open_for_write(db)) as connection:
        started = time.monotonic()
        for second in range(seconds):
            these = lines[second * rows : (second + 1) * rows]
            time.sleep(max(0.0, started + second - time.monotonic()))
            began = time.monotonic()
            import_ndjson(connection, io.BytesIO(b"".join(these)))
            took.append(time.monotonic() - began)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changed", type=int, default=100_000)
    parser.add_argument("--steady-rows", type=int, default=300, help="changed records a second")
    parser.add_argument("--steady-seconds", type=int, default=20)
    parser.add_argument("--slice", type=int, default=2, help="seconds per wrk slice")
    parser.add_argument("--idle-slices", type=int, default=3, help="before and after, each")
    parser.add_argument("--delivering-slices", type=int, default=3, help="at most, from the commit")
    parser.add_argument("--receivers", type=int, help="only serve this many receivers")
    smoke = {"rows": 2000, "changed": 500, "steady_rows": 20, "steady_seconds": 5, "slice": 1}
    args, outputs = provenance.options(parser, smoke, rows=1_000_000)
    if args.receivers:
        uvloop.run(serve_receivers(args.receivers))
        return
    steady_events = args.steady_rows * args.steady_seconds
    if steady_events > args.changed:
        parser.error("--steady-rows x --steady-seconds must be at most --changed")
    here, db, token = databases.workspace(args.rows, outputs.work, "webhooks")
    file_a, file_b = databases.import_files(
        here, args.changed, 0, "webhook bench A", "webhook bench B"
    )
    with (
        receiving(len(SIGNING), db) as receivers,
        harness.leasestar_server("webhooks", db, WEBHOOK_ENV, work=here) as server,
    ):
        list_url = f"{server.base}/v1/applicants"
        idle = WrkTarget("list default, idle", list_url, token)
        delivering = WrkTarget("list default, delivering", list_url, token)

        def list_slices(target: WrkTarget, slices: int) -> None:
            say(f"{target.name} req/s")
            # Unmeasured: the first list after a change counts the new total (s at 1M).
            harness.get_ok(list_url, token, 600)
            for _ in range(slices):
                target.run(args.slice)
                if target is delivering and not receivers.pending():
                    target.slices.pop()  # it ended within the slice: not all delivering
                    break

        list_slices(idle, args.idle_slices)
        say(f"import A, webhooks off ({args.changed:,} changed)")
        imports_off = [timed_import(db, file_a)]
        with contextlib.closing(open_for_write(db)) as connection:
            subscriptions = [
                create_subscription(connection, receivers.url(index), signing=signing)
                for index, signing in enumerate(SIGNING)
            ]
        before = databases.change_seq(db)
        say("import B, three subscribers")
        import_on = timed_import(db, file_b)
        through = databases.change_seq(db)
        receivers.expected += args.changed
        list_slices(delivering, args.delivering_slices)
        wrk_ended = time.time()
        burst = receivers.delivered(before, through, args.changed, "import B")
        say(f"import B delivered: {burst.lag:.1f} s from its commit to the last")
        list_slices(idle, args.idle_slices)
        say(f"steady: {args.steady_rows} changed a second for {args.steady_seconds} s")
        steady_from = databases.change_seq(db)
        took = steady_imports(db, args.steady_rows, args.steady_seconds)
        receivers.expected += steady_events
        steady_through = databases.change_seq(db)
        steady = receivers.delivered(steady_from, steady_through, steady_events, "steady phase")
        verified = receivers.verify_samples([s.secret for s in subscriptions])
        with contextlib.closing(open_for_write(db)) as connection:
            for subscription in subscriptions:
                revoke_subscription(connection, subscription.id)
        say("import A again, webhooks off")
        imports_off.append(timed_import(db, file_a))
        load = provenance.loadavg()
    off, off_cpu = (statistics.mean(column) for column in zip(*imports_off, strict=True))
    (on, on_cpu), calm = import_on, idle.measured() if idle.slices else None
    while_delivering = provenance.text("webhooks", "no_delivering")
    if calm is not None and delivering.slices:
        rps, slices = delivering.measured().rps, len(delivering.slices)
        fields = {"rps": rps, "ratio": rps / calm.rps, "slices": slices}
        while_delivering = provenance.text("webhooks", "delivering", **fields)
    after = [arrived for arrived in burst.arrivals if arrived > wrk_ended]
    unloaded = provenance.text("webhooks", "no_unloaded")
    if len(after) > 1:
        rate = len(after) / (max(after) - wrk_ended)
        unloaded = provenance.text("webhooks", "unloaded", rate=rate, each=rate / len(SIGNING))
    ms = 1000
    section = provenance.section(
        "webhooks",
        provenance.text(
            "webhooks", "table", off=off, off_cpu=off_cpu, on=on, on_cpu=on_cpu,
            imports_off=", ".join(f"{wall:.1f} s ({cpu:.1f} s CPU)" for wall, cpu in imports_off),
            speed=off / on, cpu_speed=off_cpu / on_cpu, burst_seconds=burst.lag,
            burst=burst, steady=steady, burst_rate=burst.deliveries / burst.lag,
            burst_rate_each=burst.deliveries / burst.lag / len(SIGNING), unloaded=unloaded,
            burst_p50=percentile(burst.latencies, 0.5), burst_p99=percentile(burst.latencies, 0.99),
            steady_p50=percentile(steady.latencies, 0.5) * ms,
            steady_p99=percentile(steady.latencies, 0.99) * ms,
            steady_lag=steady.lag * ms, steady_import=statistics.median(took) * ms,
            idle=f"{calm.rps:,.0f}" if calm else "-", idle_slices=len(idle.slices),
            while_delivering=while_delivering,
        ),
        name="webhooks" if (args.rows, args.changed) == (1_000_000, 100_000) else
        f"webhooks-{args.rows}-{args.changed}",
        load=load, args=args, verified=verified, poll_ms=POLL_SECONDS * 1000,
    )  # fmt: skip
    provenance.publish(section, outputs.results_md)


if __name__ == "__main__":
    main()
