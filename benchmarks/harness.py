"""The measuring harness the benchmarks share: servers, pinning, wrk, slices.

- `leasestar_server` / `server`: a server started pinned to a core (taskset) on a free
  port, waited for until its health route answers 200, stopped with a signal.
- `ensure_wrk`, `run_wrk`, `WrkTarget`: wrk, installed if missing, pinned to the client
  core, its summary line parsed; a target's slices merged into one `Measured`.

Databases are `databases.py`'s; what a report records about the run, `provenance.py`'s.
Every path that a run writes to takes a `work` directory (default `benchmarks/work/`),
so that a development run can go to a temporary directory instead.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / "work"
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
NICE = -10

_NAMES = {"run": "bench"}


def say(message: str) -> None:
    """A progress line on stderr, named after the script that runs."""
    stem = Path(sys.argv[0]).stem
    name = _NAMES.get(stem, stem)
    print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def raise_priority() -> int:
    """Run (and start every server and wrk) at nice -10 where allowed: on a machine shared
    with other work, that keeps the measured processes from losing their cores to it."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    return os.getpriority(os.PRIO_PROCESS, 0)


# --------------------------------------------------------------------------- cores, wrk


def pinned(core: str | None) -> list[str]:
    """The `taskset -c CORE` prefix, where taskset exists and the machine has 2+ cores."""
    if core is not None and shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", core]
    return []


@contextlib.contextmanager
def on_core(core: str) -> Iterator[None]:
    """Run this process on `core` (where pinning is possible), then restore."""
    if not hasattr(os, "sched_setaffinity") or not pinned(core):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(core)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def on_server_core() -> contextlib.AbstractContextManager[None]:
    """Run this process on the server's core (for in-process timings), then restore."""
    return on_core(SERVER_CORE)


def ensure_wrk() -> str:
    """wrk's path; installed from Debian's package when missing and allowed, else exit."""
    found = shutil.which("wrk")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        say("wrk is missing: apt-get update && apt-get install -y wrk")
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False)
        found = shutil.which("wrk")
        if found:
            return found
    sys.exit(
        "wrk is required. On Debian or Ubuntu: sudo apt-get install -y wrk; "
        "on macOS: brew install wrk; elsewhere build it from its source."
    )


@dataclass
class Measured:
    """The merged slices of one wrk target."""

    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    wire_bytes: float  # bytes read per response, headers included
    requests: int
    errors: int


def run_wrk(
    url: str,
    seconds: int,
    *,
    token: str | None = None,
    headers: Sequence[str] = (),
    script: Path = WRK_SCRIPT,
    script_args: Sequence[str] = (),
    connections: int = CONNECTIONS,
    threads: int = 1,
    core: str | None = CLIENT_CORE,
    timeout: str = "30s",
    marker: str = "WRK_JSON",
) -> dict[str, Any]:
    """One wrk run, pinned to `core`; the JSON its script prints after `marker`."""
    command = [
        *pinned(core),
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        timeout,
        "-s",
        str(script),
    ]
    for header in (*headers, *([f"Authorization: Bearer {token}"] if token else [])):
        command += ["-H", header]
    command.append(url)
    if script_args:
        command += ["--", *script_args]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    match = re.search(rf"^{marker} (\{{.*\}})$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    return dict(json.loads(match[1]))


@dataclass
class WrkTarget:
    """A URL under load with `benchmarks/wrk.lua`; its slices are merged into one `Measured`."""

    name: str
    url: str
    token: str | None = None
    ids_file: Path | None = None  # each request swaps the URL's last segment for one of these
    paths_file: Path | None = None  # each request is a random line of this (path and query)
    headers: tuple[str, ...] = ()
    slices: list[dict[str, Any]] = field(default_factory=list)

    def run(self, seconds: int, keep: bool = True) -> None:
        script_args: tuple[str, ...] = ()
        if self.paths_file is not None:
            script_args = ("paths", str(self.paths_file))
        elif self.ids_file is not None:
            prefix = urllib.parse.urlsplit(self.url).path.rsplit("/", 1)[0] + "/"
            script_args = (prefix, str(self.ids_file))
        raw = run_wrk(
            self.url, seconds, token=self.token, headers=self.headers, script_args=script_args
        )
        if keep:
            self.slices.append(raw)

    def per_slice(self, percentile: float) -> list[float]:
        """Each slice's latency at `percentile` (a multiple of 0.5), in ms."""
        index = round(percentile * 2) - 1  # wrk.lua prints the percentiles 0.5, 1, ... 100
        return [s["percentiles"][index] / 1000 for s in self.slices]

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

        return Measured(
            rps=requests / duration if duration else 0.0,
            p50_ms=quantile(0.5),
            p90_ms=quantile(0.9),
            p99_ms=quantile(0.99),
            wire_bytes=sum(s["bytes"] for s in self.slices) / max(requests, 1),
            requests=requests,
            errors=errors,
        )


# --------------------------------------------------------------------------- servers


def rss_kib(pid: int) -> int:
    """The process's resident set, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def serving_pid(pid: int) -> int:
    """The process that serves: `pid` itself, or the one worker `leasestar serve --workers
    1` forks and only waits for (leasestar/supervision.py), whose memory and CPU are the
    server's."""
    forked = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # (a process that ended meanwhile)
            if stat.read_text().rpartition(")")[2].split()[1] == str(pid):
                forked.append(int(stat.parent.name))
    return forked[0] if len(forked) == 1 else pid


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, every thread's (utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_get(url: str, token: str | None = None, timeout: float = 60) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


class KeepAlive:
    """One keep-alive HTTP/1.1 connection, as a sequential client holds it: each `get` is
    timed from sending the request to the last byte of the body (http.client, the
    lightest client at hand, so the client's own cost stays out of the latency)."""

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


@dataclass
class Server:
    """A running server: its base URL and pid; `returncode` once it is stopped."""

    name: str
    base: str
    pid: int
    returncode: int | None = None


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
) -> Iterator[Server]:
    """Start a server pinned to `core` on a free port (`{port}` in `command`), wait for
    `health` to answer 200, and stop it with `stop` on the way out.

    taskset execs the server, so the pid is the server's own (or its one worker's:
    `serving_pid`). Its output goes to
    `WORK/server-NAME.log` (the last run's, for a failed start).
    """
    port = free_port()
    full = [*pinned(core), *(part.replace("{port}", str(port)) for part in command)]
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")}
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / f"server-{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            full, cwd=ROOT, env={**inherited, **(env or {})}, stdout=log, stderr=log
        )
        running = Server(name, f"http://127.0.0.1:{port}", process.pid)
        try:
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} server exited ({process.returncode}); see {log_path}"
                    )
                with contextlib.suppress(OSError):
                    if http_get(running.base + health, timeout=2)[0] == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} server did not answer within 120 s; see {log_path}")
                time.sleep(0.2)
            running.pid = serving_pid(process.pid)
            yield running
        finally:
            if process.poll() is None:
                process.send_signal(stop)
            try:
                running.returncode = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                running.returncode = process.wait()


def leasestar_server(
    name: str,
    db: Path,
    env: dict[str, str] | None = None,
    *,
    args: Sequence[str] = (),
    core: str | None = SERVER_CORE,
    work: Path = WORK,
    stop: signal.Signals = signal.SIGINT,
) -> contextlib.AbstractContextManager[Server]:
    """`leasestar serve` (uvicorn, one worker, `SERVER_ENV` over its defaults) on `db`."""
    command = [str(LEASESTAR), "serve", "--db", str(db), "--host", "127.0.0.1", "--port", "{port}"]
    return server(
        name,
        [*command, *args],
        "/health",
        {**SERVER_ENV, **(env or {})},
        core=core,
        work=work,
        stop=stop,
    )
