"""The measuring harness every benchmark uses: servers pinned to one core, wrk to the
other, slices taken in turns (method: sections.toml, RESULTS.md)."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from provenance import BENCH, ROOT, WORK, say

BIN = Path(sys.executable).parent
LEASESTAR = BIN / "leasestar"
UVICORN = BIN / "uvicorn"
WRK_SCRIPT = BENCH / "wrk.lua"

CONNECTIONS = 16
SERVER_CORE, CLIENT_CORE = "0", "1"
# Servers run with their defaults but one: a per-token rate limit would turn a load test
# into a test of the limiter (it answers 429 after a few hundred requests). LEASESTAR_*
# variables of the calling shell are not passed on, so a run measures the defaults.
SERVER_ENV = {"LEASESTAR_RATE_LIMIT": "off"}


def pinned(core: str | None) -> list[str]:
    """The `taskset -c CORE` prefix, where taskset exists and the machine has 2+ cores."""
    if core is not None and shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", core]
    return []


@contextlib.contextmanager
def on_core(core: str) -> Iterator[None]:
    if not hasattr(os, "sched_setaffinity") or not pinned(core):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(core)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@dataclass
class Measured:
    rps: float
    p50_ms: float
    p99_ms: float
    wire_bytes: float  # bytes read per response, headers included
    requests: int
    errors: int


@dataclass
class WrkTarget:
    """A URL under wrk's load, by `benchmarks/wrk.lua` unless `script` says otherwise; its
    kept slices are merged into one `Measured`."""

    name: str
    url: str
    token: str | None = None
    ids_file: Path | None = None  # each request swaps the URL's last segment for one of these
    paths_file: Path | None = None  # each request is a random line of this (path and query)
    headers: tuple[str, ...] = ()
    pid: int | None = None  # a server whose CPU time over the kept slices is added up
    cpu: float = 0.0
    slices: list[dict[str, Any]] = field(default_factory=list)
    script: Path = WRK_SCRIPT  # it prints its summary as JSON after `marker`
    script_args: tuple[str, ...] = ()
    marker: str = "WRK_JSON"
    connections: int = CONNECTIONS
    threads: int = 1
    core: str | None = CLIENT_CORE
    timeout: str = "30s"

    def wrk(self, seconds: int) -> dict[str, Any]:
        script_args = self.script_args
        if self.paths_file is not None:
            script_args = ("paths", str(self.paths_file))
        elif self.ids_file is not None:
            prefix = urllib.parse.urlsplit(self.url).path.rsplit("/", 1)[0] + "/"
            script_args = (prefix, str(self.ids_file))
        command = [*pinned(self.core), "wrk", f"-t{self.threads}", f"-c{self.connections}"]
        command += [f"-d{seconds}s", "--timeout", self.timeout, "-s", str(self.script)]
        authorization = [f"Authorization: Bearer {self.token}"] if self.token else []
        for header in (*self.headers, *authorization):
            command += ["-H", header]
        command += [self.url, *(["--", *script_args] if script_args else [])]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        match = re.search(rf"^{self.marker} (\{{.*\}})$", out, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"wrk printed no summary:\n{out}")
        return dict(json.loads(match[1]))

    def run(self, seconds: int, keep: bool = True) -> None:
        cpu = cpu_seconds(self.pid) if self.pid else 0.0
        raw = self.wrk(seconds)
        if keep:
            self.slices.append(raw)
            self.cpu += cpu_seconds(self.pid) - cpu if self.pid else 0.0

    def per_slice(self, percentile: float) -> list[float]:
        """Each slice's latency at `percentile` (a multiple of 0.5), in ms."""
        index = round(percentile * 2) - 1  # wrk.lua prints the percentiles 0.5, 1, ... 100
        return [s["percentiles"][index] / 1000 for s in self.slices]

    def cpu_us_per_request(self) -> float:
        return self.cpu / max(self.measured().requests, 1) * 1e6

    def measured(self) -> Measured:
        requests = sum(s["requests"] for s in self.slices)
        duration = sum(s["duration_us"] for s in self.slices) / 1e6
        errors = sum(
            s[k] for s in self.slices for k in ("connect", "read", "write", "status", "timeout")
        )
        if errors:
            say(f"  !! {self.name}: {errors} errors (non-2xx, timeouts or socket errors)")
        # Each slice's latency distribution, as 200 quantiles weighted by its requests.
        points = sorted(
            (value, s["requests"] / len(s["percentiles"]))
            for s in self.slices
            for value in s["percentiles"]
        )
        total_weight = sum(weight for _, weight in points) or 1.0

        def quantile(q: float) -> float:
            seen = 0.0
            for value, weight in points:
                seen += weight
                if seen >= q * total_weight:
                    return float(value) / 1000
            return float(points[-1][0]) / 1000 if points else 0.0

        rps, wire = requests / duration if duration else 0.0, sum(s["bytes"] for s in self.slices)
        quantiles = (quantile(0.5), quantile(0.99))
        return Measured(rps, *quantiles, wire / max(requests, 1), requests, errors)


# The reads compared across servers alike but for one setting (the rate limit's cost, a
# replica's throughput): (label, path after /v1/applicants, `{id}` a random one of a file).
READS = (("list default", ""), ("get by random id", "/{id}"))


def reads(
    servers: dict[str, Server], token: str, ids: list[str], ids_file: Path
) -> list[list[WrkTarget]]:
    """Per read of READS, a target on each server (named `server read`), its CPU counted."""
    found = []
    for read, path in READS:
        url, by_id = "/v1/applicants" + path.format(id=ids[0]), ids_file if path else None
        targets = [
            WrkTarget(f"{name} {read}", s.base + url, token, by_id, pid=s.pid)
            for name, s in servers.items()
        ]
        found.append(targets)
    return found


def interleave(
    targets: Sequence[WrkTarget],
    slices: int,
    seconds: int,
    warmup: int = 0,
    *,
    order: Literal["reverse", "rotate", "same"] = "reverse",
    start: int = 0,
    settle: float = 0.0,
    after_round: Callable[[int], None] | None = None,
) -> None:
    """Warm-up, then the targets in turns, slice by slice, so that background load hits
    them alike: every other round reversed, or rotated from `start`, or the same order;
    `settle` seconds before each slice, `after_round(number)` after each round."""
    targets = list(targets)
    for target in targets if warmup else ():
        target.run(warmup, keep=False)
    for number in range(slices):
        turn = (start + number) % len(targets) if order == "rotate" else 0
        ordered = targets[turn:] + targets[:turn]
        if order == "reverse" and number % 2:
            ordered.reverse()
        for target in ordered:
            time.sleep(settle)
            target.run(seconds)
        if after_round is not None:
            after_round(number)


def wait_until(
    check: Callable[[], object], seconds: float, failure: str, every: float = 0.2
) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(every)


def percentile(values: Iterable[float], fraction: float) -> float:
    """By nearest rank: with fewer than 100 values p99 is the largest (none: NaN)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)] if ordered else math.nan


def proc_kib(pid: int, file: str = "status") -> dict[str, int]:
    """The fields in kB of `/proc/PID/FILE` (status: `VmRSS`; smaps_rollup)."""
    found = {}
    for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.endswith(" kB"):
            found[name] = int(value.split()[0])
    return found


def children(pid: int) -> list[int]:
    """The live processes `pid` forked (leasestar/supervision.py's workers)."""
    forked = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # (a process that ended meanwhile)
            state, parent = stat.read_text().rpartition(")")[2].split()[:2]
            if parent == str(pid) and state != "Z":
                forked.append(int(stat.parent.name))
    return sorted(forked)


@contextlib.contextmanager
def in_background(work: Callable[[threading.Event], None]) -> Iterator[None]:
    """`work(stop)` in a thread while the block runs; `stop` is set at its end."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def rss_samples(pid: int, every: float) -> Iterator[list[int]]:
    """The process's RSS (KiB) every `every` seconds while the block runs."""
    samples: list[int] = []

    def sample(stop: threading.Event) -> None:
        while not stop.wait(every):
            samples.append(proc_kib(pid)["VmRSS"])

    with in_background(sample):
        yield samples


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_run(command: list[str]) -> tuple[float, float]:
    """`command` run to its end, its output discarded: its seconds and its CPU seconds
    (its own and its children's, which other work on the machine moves least)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_get(url: str, token: str | None = None, timeout: float = 60) -> tuple[int, bytes]:
    path = urllib.parse.urlsplit(url)._replace(scheme="", netloc="").geturl()
    with contextlib.closing(KeepAlive(url, timeout)) as client:
        status, _, body, _ = client.get(path, token)
    return status, body


def get_ok(url: str, token: str | None = None, timeout: float = 60) -> bytes:
    """The body of a GET that must answer 200: anything else fails the run."""
    status, body = http_get(url, token, timeout)
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {body[:300]!r}")
    return body


class KeepAlive:
    """One keep-alive connection; each `get` timed from request to the body's last byte
    (http.client: the lightest client at hand, its own cost out of the latency)."""

    def __init__(self, base: str, timeout: float = 120) -> None:
        split = urllib.parse.urlsplit(base)
        self._connection = http.client.HTTPConnection(
            split.hostname or "127.0.0.1", split.port, timeout=timeout
        )

    def get(
        self, path: str, token: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes, float]:
        """(status, response headers lower-cased, body, seconds)."""
        sent = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
        started = time.perf_counter()
        self._connection.request("GET", path, headers=sent)
        response = self._connection.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - started
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body, elapsed

    def close(self) -> None:
        self._connection.close()


@contextlib.contextmanager
def running(
    command: list[str], stop: signal.Signals = signal.SIGTERM, **popen: Any
) -> Iterator[subprocess.Popen[Any]]:
    """`command` running while the block runs, then sent `stop` (killed after 60 s more)."""
    process = subprocess.Popen(command, **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(stop)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Server:
    name: str
    base: str
    pid: int
    process: subprocess.Popen[Any]  # its returncode, once stopped


@contextlib.contextmanager
def server(
    name: str,
    command: list[str],
    health: str,
    env: dict[str, str] | None = None,
    *,
    core: str | None = SERVER_CORE,
    work: Path = WORK,
    stop: signal.Signals = signal.SIGINT,
    wait: float = 120,
) -> Iterator[Server]:
    """A server pinned to `core` on a free port (`{port}` in `command`), once `health`
    answers 200; its pid the server's own (taskset execs it), its output in
    `work/server-NAME.log`."""
    port = free_port()
    full = [*pinned(core), *(part.replace("{port}", str(port)) for part in command)]
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")}
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / f"server-{name}.log"
    environment = {**inherited, **(env or {})}
    with (
        log_path.open("wb") as log,
        running(full, stop, cwd=ROOT, env=environment, stdout=log, stderr=log) as process,
    ):
        served = Server(name, f"http://127.0.0.1:{port}", process.pid, process)

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}); see {log_path}")
            with contextlib.suppress(OSError):
                return http_get(served.base + health, timeout=2)[0] == 200
            return False

        wait_until(answers, wait, f"{name} did not answer in {wait:.0f} s; see {log_path}")
        # The server's, or the one worker it forked and waits for.
        forked = children(process.pid)
        served.pid = forked[0] if len(forked) == 1 else process.pid
        yield served


def leasestar_server(
    name: str,
    db: Path,
    env: dict[str, str] | None = None,
    *,
    args: Sequence[str] = (),
    **options: Any,
) -> contextlib.AbstractContextManager[Server]:
    """`leasestar serve` on `db`, `SERVER_ENV` over its defaults."""
    command = [str(LEASESTAR), "serve", "--db", str(db), "--host", "127.0.0.1", "--port", "{port}"]
    return server(name, [*command, *args], "/health", {**SERVER_ENV, **(env or {})}, **options)
