"""Webhooks (issue 28.6): an import into a large database with three loopback subscribers
against webhooks off, list req/s while it delivers, commit-to-attempt latency of a burst
and of steady imports. Method: sections.toml, RESULTS.md. The subscribers: a process of
asyncio protocols over httptools on uvloop, so that a receiver is not what limits the sender."""

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
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
        if path == "/arrivals":
            lines = b"".join(msgspec.json.encode(a) + b"\n" for a in self.arrivals)
            return _response(lines, "application/x-ndjson")
        if path == "/samples":
            return _response(json.dumps(self.samples).encode(), "application/json")
        if path == "/count":
            return _response(str(len(self.arrivals)).encode(), "text/plain")
        return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def _response(body: bytes, kind: str) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


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

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

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


async def serve_receivers(count: int) -> None:
    """`count` receivers on loopback: their ports printed as JSON, served until SIGTERM."""
    loop = asyncio.get_running_loop()
    servers = []
    for _ in range(count):
        record = Record()
        server = await loop.create_server(
            lambda record=record: _Connection(record), "127.0.0.1", 0, backlog=64
        )
        servers.append(server)
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
class Receivers:
    process: subprocess.Popen[str]
    ports: list[int]

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}/hook"

    def get(self, index: int, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[index]}{path}") as answer:
            return bytes(answer.read())

    def pending(self, expected: list[int]) -> bool:
        counts = [int(self.get(i, "/count")) for i in range(len(self.ports))]
        return any(got < want for got, want in zip(counts, expected, strict=True))

    def wait_delivered(self, expected: list[int], what: str) -> None:
        failure = f"{what}: not delivered within {DELIVERY_WAIT_SECONDS} s"
        harness.wait_until(lambda: not self.pending(expected), DELIVERY_WAIT_SECONDS, failure)

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
def receiving(count: int) -> Iterator[Receivers]:
    command = [*harness.pinned(CLIENT_CORE), sys.executable, str(Path(__file__).resolve())]
    command += ["--receivers", str(count)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield Receivers(process, json.loads(process.stdout.readline()))
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def watching(db: Path) -> Iterator[list[tuple[float, int]]]:
    """Polls `sync_state` every POLL_SECONDS: (instant seen, change sequence) per move."""
    moves: list[tuple[float, int]] = []

    def watch(stop: threading.Event) -> None:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            while not stop.is_set():
                seq = databases.change_seq(conn)
                if not moves or moves[-1][1] != seq:
                    moves.append((time.time(), int(seq)))
                time.sleep(POLL_SECONDS)

    with harness.in_background(watch):
        yield moves


def committed_at(moves: list[tuple[float, int]], change_seq: int) -> float:
    return next(seen for seen, seq in moves if seq >= change_seq)


def timed_import(db: Path, file: Path) -> tuple[float, float]:
    """`leasestar import`'s seconds, and its CPU seconds (which other work moves least)."""
    started, cpu = time.monotonic(), harness.children_cpu()
    command = [str(LEASESTAR), "import", "--db", str(db), str(file)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started, harness.children_cpu() - cpu


@dataclass
class Delivered:
    """Per event (change sequence), the first attempt's arrival at each receiver."""

    latencies: list[float] = field(default_factory=list)  # commit to first attempt, s
    arrivals: list[float] = field(default_factory=list)  # each first attempt's
    last: float = 0.0  # the last first attempt's arrival
    deliveries: int = 0  # first attempts, all receivers
    duplicates: int = 0  # attempts after the first


def delivered(
    receivers: Receivers, watch: list[tuple[float, int]], after: int, through: int, events: int
) -> Delivered:
    """The figures of the events in (after, through], each receiver having every one."""
    found = Delivered()
    for index in range(len(receivers.ports)):
        first: dict[int, float] = {}
        for line in receivers.get(index, "/arrivals").splitlines():
            arrived, seq, _ = json.loads(line)
            if after < seq <= through:
                if seq in first:
                    found.duplicates += 1
                first[seq] = min(arrived, first.get(seq, arrived))
        if len(first) != events:
            raise RuntimeError(f"receiver {index}: {len(first)} of {events} events")
        for seq, arrived in first.items():
            found.latencies.append(arrived - committed_at(watch, seq))
            found.arrivals.append(arrived)
        found.last = max(found.last, *first.values())
        found.deliveries += len(first)
    return found


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
    if args.steady_rows * args.steady_seconds > args.changed:
        parser.error("--steady-rows x --steady-seconds must be at most --changed")
    source = databases.ensure_database(args.rows, outputs.work)
    here = outputs.work / "webhooks"
    here.mkdir(parents=True, exist_ok=True)
    say(f"copying {source.name}")
    db = databases.copy_database(source, here / "bench.db")
    token = databases.create_token(db, "webhooks")
    file_a, file_b = here / "changed-a.ndjson", here / "changed-b.ndjson"
    say(f"writing two files of {args.changed:,} changed records")
    file_a.write_bytes(databases.ndjson(args.changed, 0, "webhook bench A"))
    file_b.write_bytes(databases.ndjson(args.changed, 0, "webhook bench B"))
    with (
        receiving(len(SIGNING)) as receivers,
        harness.leasestar_server("webhooks", db, WEBHOOK_ENV, work=here) as server,
        watching(db) as watch,
    ):
        list_url = f"{server.base}/v1/applicants"
        idle = WrkTarget("list default, idle", list_url, token)
        delivering = WrkTarget("list default, delivering", list_url, token)
        say("list req/s, idle")
        # Unmeasured: the first list after a change counts the new total (s at 1M).
        harness.get_ok(list_url, token, 600)
        for _ in range(args.idle_slices):
            idle.run(args.slice)
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
        say("list req/s while delivering")
        harness.get_ok(list_url, token, 600)
        expected = [args.changed] * len(SIGNING)
        for _ in range(args.delivering_slices):
            delivering.run(args.slice)
            if not receivers.pending(expected):
                delivering.slices.pop()  # it ended within the slice: not all delivering
                break
        wrk_ended = time.time()
        receivers.wait_delivered(expected, "import B")
        burst = delivered(receivers, watch, before, through, args.changed)
        burst_seconds = burst.last - committed_at(watch, through)
        say(f"import B delivered: {burst_seconds:.1f} s from its commit to the last")
        say("list req/s, idle again")
        harness.get_ok(list_url, token, 600)
        for _ in range(args.idle_slices):
            idle.run(args.slice)
        say(f"steady: {args.steady_rows} changed a second for {args.steady_seconds} s")
        steady_from = databases.change_seq(db)
        took = steady_imports(db, args.steady_rows, args.steady_seconds)
        steady_through = databases.change_seq(db)
        steady_events = args.steady_rows * args.steady_seconds
        receivers.wait_delivered([n + steady_events for n in expected], "steady phase")
        steady = delivered(receivers, watch, steady_from, steady_through, steady_events)
        steady_lag = steady.last - committed_at(watch, steady_through)
        verified = receivers.verify_samples([s.secret for s in subscriptions])
        with contextlib.closing(open_for_write(db)) as connection:
            for subscription in subscriptions:
                revoke_subscription(connection, subscription.id)
        say("import A again, webhooks off")
        imports_off.append(timed_import(db, file_a))
        load = provenance.loadavg()
    off = statistics.mean(wall for wall, _ in imports_off)
    off_cpu = statistics.mean(cpu for _, cpu in imports_off)
    (on, on_cpu), calm = import_on, idle.measured() if idle.slices else None
    while_delivering = "- (delivery ended within the first slice)"
    if calm is not None and delivering.slices:
        rps = delivering.measured().rps
        while_delivering = (
            f"{rps:,.0f} ({rps / calm.rps:.2f}x of idle, {len(delivering.slices)} slices)"
        )
    after = [arrived for arrived in burst.arrivals if arrived > wrk_ended]
    unloaded = "- (delivered before wrk stopped)"
    if len(after) > 1:
        rate = len(after) / (max(after) - wrk_ended)
        unloaded = f"{rate:,.0f} ({rate / len(SIGNING):,.0f} per subscription)"
    ms = 1000
    section = provenance.section(
        "webhooks",
        provenance.text(
            "webhooks", "table", off=off, off_cpu=off_cpu, on=on, on_cpu=on_cpu,
            imports_off=", ".join(f"{wall:.1f} s ({cpu:.1f} s CPU)" for wall, cpu in imports_off),
            speed=off / on, cpu_speed=off_cpu / on_cpu, burst_seconds=burst_seconds,
            burst=burst, steady=steady, burst_rate=burst.deliveries / burst_seconds,
            burst_rate_each=burst.deliveries / burst_seconds / len(SIGNING), unloaded=unloaded,
            burst_p50=percentile(burst.latencies, 0.5), burst_p99=percentile(burst.latencies, 0.99),
            steady_p50=percentile(steady.latencies, 0.5) * ms,
            steady_p99=percentile(steady.latencies, 0.99) * ms,
            steady_lag=steady_lag * ms, steady_import=statistics.median(took) * ms,
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
