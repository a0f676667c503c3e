"""Webhooks (issue 28.6): an import of changed records into a large database with three
subscribers on loopback receivers, against the same import with webhooks off.

    .venv/bin/python benchmarks/webhooks.py [--rows 1000000] [--changed 100000]

(`make bench` runs it on a full run; `--rows 100000 --changed 10000` is a development
run of a few minutes.) One database (a copy of `benchmarks/work/applicants-N.db`),
served by `leasestar serve` pinned to the server core; the receivers
(`webhook_receivers.py`) and wrk on the client core. In order:

1. list req/s, idle (wrk, alternating with the same after delivery, step 5);
2. import A (`leasestar import`, `--changed` records with `notes` changed), webhooks
   off: no subscription, so no event is recorded;
3. three subscriptions (two `standard`, one `propexo`), then import B (the same records
   changed again): its time against step 2's and step 7's, the webhooks-off imports;
4. from B's commit, at most `--delivering-slices` wrk slices while the server delivers
   (a slice that ended after the last delivery is not kept), then unloaded until every
   receiver has every event: commit to last delivered, deliveries a second (over the
   burst, and once wrk stopped), commit-to-first-attempt per event;
5. list req/s idle again;
6. steady phase: `--steady-rows` changed records imported every second for
   `--steady-seconds` (in this process), each commit's events timed from that commit
   to their first attempt: the figure the p99 <= 1 s target is for, as a single commit
   of 100,000 events is a burst no sender attempts within a second;
7. the subscriptions revoked, import A again: webhooks off a second time.

A commit's instant is when a poll of `sync_state` every POLL_SECONDS first sees its
change sequence (so up to that much late); each receiver stamps an arrival with the
same clock. Every receiver must have every event of B and of the steady phase (by
change sequence), and a sample of each one's requests must verify: the standard ones
with the `standardwebhooks` package's own signing, the Propexo one by HMAC as Propexo
documents. Writes the `webhooks` section of RESULTS.md (`--out FILE`: elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import io
import json
import resource
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

import msgspec
from databases import create_token, ensure_database
from harness import (
    BENCH,
    CLIENT_CORE,
    LEASESTAR,
    WORK,
    Measured,
    WrkTarget,
    ensure_wrk,
    http_get,
    leasestar_server,
    pinned,
    raise_priority,
    say,
)
from provenance import (
    RESULTS_MD,
    describe_machine,
    git_commit,
    loadavg,
    now,
    section,
    table,
    write_section,
)
from standardwebhooks.webhooks import Webhook

from leasestar.applicants.pipeline import import_ndjson
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from leasestar.webhooks.subscriptions import create_subscription, revoke_subscription

SIGNING = ("standard", "standard", "propexo")
POLL_SECONDS = 0.002
# The receivers are on loopback, which deliveries refuse by default.
WEBHOOK_ENV = {"LEASESTAR_WEBHOOK_ALLOW_PRIVATE": "on"}
DELIVERY_WAIT_SECONDS = 3600


# --------------------------------------------------------------------------- receivers


@dataclass
class Receivers:
    """The receivers' process and ports."""

    process: subprocess.Popen[str]
    ports: list[int]

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}/hook"

    def _get(self, index: int, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[index]}{path}") as answer:
            body: bytes = answer.read()
            return body

    def counts(self) -> list[int]:
        return [int(self._get(i, "/count")) for i in range(len(self.ports))]

    def arrivals(self, index: int) -> list[tuple[float, int, str]]:
        lines = self._get(index, "/arrivals").splitlines()
        return [tuple(json.loads(line)) for line in lines]  # type: ignore[misc]

    def samples(self, index: int) -> list[dict[str, object]]:
        found: list[dict[str, object]] = json.loads(self._get(index, "/samples"))
        return found


@contextlib.contextmanager
def receiving(count: int) -> Iterator[Receivers]:
    command = [*pinned(CLIENT_CORE), sys.executable, str(BENCH / "webhook_receivers.py")]
    process = subprocess.Popen([*command, str(count)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield Receivers(process, json.loads(process.stdout.readline()))
    finally:
        process.terminate()
        process.wait(timeout=30)


def verify_samples(receivers: Receivers, secrets: list[str]) -> int:
    """How many sampled requests verified (any that does not fails the run)."""
    verified = 0
    for index, secret in enumerate(secrets):
        for sample in receivers.samples(index):
            headers = dict(sample["headers"])  # type: ignore[call-overload]
            body = str(sample["body"]).encode()
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


# --------------------------------------------------------------------------- commits


class CommitWatch:
    """Polls `sync_state` every POLL_SECONDS: (instant seen, change sequence) per move."""

    def __init__(self, db: Path) -> None:
        self._db = db
        self.moves: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CommitWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        connection = sqlite3.connect(f"file:{self._db}?mode=ro", uri=True)
        try:
            last = None
            while not self._stop.is_set():
                (seq,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
                if seq != last:
                    self.moves.append((time.time(), int(seq)))
                    last = seq
                time.sleep(POLL_SECONDS)
        finally:
            connection.close()

    def committed_at(self, change_seq: int) -> float:
        """When the commit holding `change_seq` was first seen."""
        for seen, seq in self.moves:
            if seq >= change_seq:
                return seen
        raise RuntimeError(f"change {change_seq} was never seen committed")


def change_seq(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        return int(connection.execute("SELECT change_seq FROM sync_state").fetchone()[0])


# --------------------------------------------------------------------------- imports


def changed_lines(count: int, mark: str) -> bytes:
    """The first `count` seeded records with `notes` changed to `mark`."""
    encode = msgspec.json.Encoder().encode
    return b"".join(
        encode(msgspec.structs.replace(record, notes=f"{mark} {record.x_id}")) + b"\n"
        for record in synthetic_applicants(count, seed=0)
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_import(db: Path, file: Path) -> tuple[float, float]:
    """Seconds `leasestar import` took, process start to exit, and its CPU seconds (its
    worker's included): the figure other work on the machine moves least."""
    started, cpu = time.monotonic(), _children_cpu()
    subprocess.run(
        [str(LEASESTAR), "import", "--db", str(db), str(file)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.monotonic() - started, _children_cpu() - cpu


def pending(receivers: Receivers, expected: list[int]) -> bool:
    """Whether a receiver has had fewer requests than `expected` says."""
    return any(got < want for got, want in zip(receivers.counts(), expected, strict=True))


def wait_delivered(receivers: Receivers, expected: list[int], what: str) -> None:
    deadline = time.monotonic() + DELIVERY_WAIT_SECONDS
    while pending(receivers, expected):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not delivered within {DELIVERY_WAIT_SECONDS} s")
        time.sleep(0.2)


# --------------------------------------------------------------------------- figures


@dataclass
class Delivered:
    """Per event (change sequence), the first attempt's arrival at each receiver."""

    latencies: list[float] = field(default_factory=list)  # commit to first attempt, s
    arrivals: list[float] = field(default_factory=list)  # each first attempt's
    last: float = 0.0  # the last first attempt's arrival
    deliveries: int = 0  # first attempts, all receivers
    duplicates: int = 0  # attempts after the first


def delivered(
    receivers: Receivers, watch: CommitWatch, after: int, through: int, events: int
) -> Delivered:
    """The figures of the events in (after, through], each receiver having every one."""
    found = Delivered()
    for index in range(len(receivers.ports)):
        first: dict[int, float] = {}
        for arrived, seq, _ in receivers.arrivals(index):
            if after < seq <= through:
                if seq in first:
                    found.duplicates += 1
                first[seq] = min(arrived, first.get(seq, arrived))
        if len(first) != events:
            raise RuntimeError(f"receiver {index}: {len(first)} of {events} events")
        for seq, arrived in first.items():
            found.latencies.append(arrived - watch.committed_at(seq))
            found.arrivals.append(arrived)
        found.last = max(found.last, *first.values())
        found.deliveries += len(first)
    return found


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def steady_imports(db: Path, args: argparse.Namespace) -> list[float]:
    """`--steady-rows` changed records imported every second, `--steady-seconds` times
    (here, on a connection of this process); each import's seconds."""
    lines = changed_lines(args.steady_rows * args.steady_seconds, "steady").splitlines(True)
    took = []
    connection = open_for_write(db)
    try:
        started = time.monotonic()
        for second in range(args.steady_seconds):
            these = lines[second * args.steady_rows : (second + 1) * args.steady_rows]
            time.sleep(max(0.0, started + second - time.monotonic()))
            began = time.monotonic()
            import_ndjson(connection, io.BytesIO(b"".join(these)))
            took.append(time.monotonic() - began)
    finally:
        connection.close()
    return took


def warm(url: str, token: str) -> None:
    """One list request, unmeasured: the first after a change counts the new total
    (`match_counter.py`), seconds at 1,000,000 rows, which no slice should hold."""
    status, body = http_get(url, token, timeout=600)
    if status != 200:
        raise RuntimeError(f"list: HTTP {status}: {body[:200]!r}")


# --------------------------------------------------------------------------- the run


@dataclass
class Run:
    imports_off: list[tuple[float, float]] = field(default_factory=list)  # (wall, CPU) s
    import_on: tuple[float, float] = (0.0, 0.0)
    burst: Delivered = field(default_factory=Delivered)
    burst_seconds: float = 0.0  # commit to the last first attempt
    wrk_ended: float = 0.0  # the last slice while delivering (time.time())
    steady: Delivered = field(default_factory=Delivered)
    steady_lag: float = 0.0  # the last steady commit to its last first attempt
    steady_import_p50: float = 0.0
    idle: WrkTarget | None = None
    delivering: WrkTarget | None = None
    verified: int = 0
    load: str = ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changed", type=int, default=100_000)
    parser.add_argument("--steady-rows", type=int, default=300, help="changed records a second")
    parser.add_argument("--steady-seconds", type=int, default=20)
    parser.add_argument("--slice", type=int, default=2, help="seconds per wrk slice")
    parser.add_argument("--idle-slices", type=int, default=3, help="before and after, each")
    parser.add_argument(
        "--delivering-slices", type=int, default=3, help="at most, from the import's commit"
    )
    parser.add_argument("--out", type=Path, help="the RESULTS.md to write the section into")
    args = parser.parse_args()
    if args.steady_rows * args.steady_seconds > args.changed:
        parser.error("--steady-rows x --steady-seconds must be at most --changed")
    raise_priority()
    ensure_wrk()
    source = ensure_database(args.rows, WORK)
    here = WORK / "webhooks"
    here.mkdir(parents=True, exist_ok=True)
    db = here / "bench.db"
    for suffix in ("", "-wal", "-shm", "-webhooks.lock"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    say(f"copying {source.name}")
    with (
        contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as src,
        contextlib.closing(sqlite3.connect(db)) as dst,
    ):
        src.backup(dst)
    token = create_token(db, "webhooks")
    file_a, file_b = here / "changed-a.ndjson", here / "changed-b.ndjson"
    say(f"writing two files of {args.changed:,} changed records")
    file_a.write_bytes(changed_lines(args.changed, "webhook bench A"))
    file_b.write_bytes(changed_lines(args.changed, "webhook bench B"))
    run = Run()
    with (
        receiving(len(SIGNING)) as receivers,
        leasestar_server("webhooks", db, WEBHOOK_ENV, work=here) as server,
        CommitWatch(db) as watch,
    ):
        list_url = f"{server.base}/v1/applicants"
        run.idle = WrkTarget("list default, idle", list_url, token)
        run.delivering = WrkTarget("list default, delivering", list_url, token)
        say("list req/s, idle")
        warm(list_url, token)
        for _ in range(args.idle_slices):
            run.idle.run(args.slice)
        say(f"import A, webhooks off ({args.changed:,} changed)")
        run.imports_off.append(timed_import(db, file_a))
        connection = open_for_write(db)
        subscriptions = [
            create_subscription(connection, receivers.url(index), signing=signing)
            for index, signing in enumerate(SIGNING)
        ]
        connection.close()
        before = change_seq(db)
        say("import B, three subscribers")
        run.import_on = timed_import(db, file_b)
        through = change_seq(db)
        say("list req/s while delivering")
        warm(list_url, token)
        expected = [args.changed] * len(SIGNING)
        for _ in range(args.delivering_slices):
            run.delivering.run(args.slice)
            if not pending(receivers, expected):
                run.delivering.slices.pop()  # it ended within the slice: not all delivering
                break
        run.wrk_ended = time.time()
        wait_delivered(receivers, expected, "import B")
        run.burst = delivered(receivers, watch, before, through, args.changed)
        run.burst_seconds = run.burst.last - watch.committed_at(through)
        say(f"import B delivered: {run.burst_seconds:.1f} s from its commit to the last")
        say("list req/s, idle again")
        warm(list_url, token)
        for _ in range(args.idle_slices):
            run.idle.run(args.slice)
        say(f"steady: {args.steady_rows} changed a second for {args.steady_seconds} s")
        steady_from = change_seq(db)
        took = steady_imports(db, args)
        steady_through = change_seq(db)
        steady_events = args.steady_rows * args.steady_seconds
        wait_delivered(receivers, [n + steady_events for n in expected], "steady phase")
        run.steady = delivered(receivers, watch, steady_from, steady_through, steady_events)
        run.steady_lag = run.steady.last - watch.committed_at(steady_through)
        run.steady_import_p50 = statistics.median(took)
        run.verified = verify_samples(receivers, [s.secret for s in subscriptions])
        connection = open_for_write(db)
        for subscription in subscriptions:
            revoke_subscription(connection, subscription.id)
        connection.close()
        say("import A again, webhooks off")
        run.imports_off.append(timed_import(db, file_a))
        run.load = loadavg()
    report = render(args, run)
    print(report)
    write_section(report, args.out or RESULTS_MD)
    say(f"wrote the webhooks section of {args.out or RESULTS_MD}")


def _rps(target: WrkTarget | None) -> Measured | None:
    return target.measured() if target is not None and target.slices else None


def render(args: argparse.Namespace, run: Run) -> str:
    off = statistics.mean(wall for wall, _ in run.imports_off)
    off_cpu = statistics.mean(cpu for _, cpu in run.imports_off)
    on, on_cpu = run.import_on
    idle, delivering = _rps(run.idle), _rps(run.delivering)
    while_delivering = "- (delivery ended within the first slice)"
    if idle is not None and delivering is not None:
        while_delivering = (
            f"{delivering.rps:,.0f} ({delivering.rps / idle.rps:.2f}x of idle, "
            f"{len(run.delivering.slices) if run.delivering else 0} slices)"
        )
    burst, steady = run.burst, run.steady
    after = [arrived for arrived in burst.arrivals if arrived > run.wrk_ended]
    unloaded = "- (delivered before wrk stopped)"
    if len(after) > 1:
        rate = len(after) / (max(after) - run.wrk_ended)
        unloaded = f"{rate:,.0f} ({rate / len(SIGNING):,.0f} per subscription)"
    ms = 1000
    rows = [
        ("import, webhooks off", f"{off:.1f} s ({off_cpu:.1f} s CPU)", "mean of "
         + ", ".join(f"{wall:.1f} s ({cpu:.1f} s CPU)" for wall, cpu in run.imports_off)),
        ("import, three subscribers", f"{on:.1f} s ({on_cpu:.1f} s CPU)",
         f"{off / on:.2f}x the speed with webhooks off, {off_cpu / on_cpu:.2f}x in CPU "
         "(target >= 0.8x)"),
        ("burst: commit to the last event delivered", f"{run.burst_seconds:.1f} s",
         f"{burst.deliveries:,} first attempts, {burst.duplicates} repeated"),
        ("burst: deliveries a second", f"{burst.deliveries / run.burst_seconds:,.0f}",
         f"{burst.deliveries / run.burst_seconds / len(SIGNING):,.0f} per subscription"),
        ("burst: deliveries a second once wrk stopped", unloaded,
         "the server delivering and nothing else"),
        ("burst: commit to first attempt, p50 / p99",
         f"{percentile(burst.latencies, 0.5):.1f} / {percentile(burst.latencies, 0.99):.1f} s",
         "the import's events queue behind each other"),
        ("steady: commit to first attempt, p50 / p99",
         f"{percentile(steady.latencies, 0.5) * ms:.0f} / "
         f"{percentile(steady.latencies, 0.99) * ms:.0f} ms",
         f"target p99 <= 1 s; {steady.deliveries:,} first attempts, "
         f"{steady.duplicates} repeated"),
        ("steady: last commit to its last event delivered", f"{run.steady_lag * ms:.0f} ms",
         f"each import took {run.steady_import_p50 * ms:.0f} ms (median)"),
        ("list req/s, idle", f"{idle.rps:,.0f}" if idle else "-",
         f"{len(run.idle.slices) if run.idle else 0} slices, before and after the burst"),
        ("list req/s while delivering", while_delivering, "target >= 0.8x of idle"),
    ]  # fmt: skip
    return section(
        "webhooks",
        table("| figure | measured | notes |", "|---|---|---|", rows),
        name="webhooks" if (args.rows, args.changed) == (1_000_000, 100_000) else
        f"webhooks-{args.rows}-{args.changed}",
        command=" ".join(["python benchmarks/webhooks.py", *sys.argv[1:]]),
        commit=git_commit(),
        when=now(),
        machine=describe_machine(),
        load=run.load,
        rows=args.rows,
        changed=args.changed,
        slice=args.slice,
        steady_rows=args.steady_rows,
        steady_seconds=args.steady_seconds,
        verified=run.verified,
        poll_ms=POLL_SECONDS * 1000,
    )  # fmt: skip


if __name__ == "__main__":
    main()
