"""Start to ready, and where a worker's memory goes (issue 27; docs/list-planning.md):
`python benchmarks/start_memory.py DB [--workers N] [--cold]` prints one
JSON object. The server is `python -m leasestar` from the current directory: to measure
another checkout, run from it (`cd OTHER && PYTHONPATH=$PWD python .../start_memory.py DB`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import databases
import harness

# The first requests after ready: one no statistic plans (an index serves it), one the
# copy counts (a broad filter's total), one the copy seeks (an order of its column).
LISTS = (
    "/v1/applicants?limit=25",
    "/v1/applicants?limit=25&updated_at_gte=2024-01-01T00:00:00Z",
    "/v1/applicants?limit=25&order-by=last_name&updated_at_gte=2024-01-01T00:00:00Z"
    "&integration_vendor=MRI",
)
MEMORY_FIELDS = ("Rss", "Pss", "Shared_Clean", "Private_Clean", "Private_Dirty", "Anonymous")
POLL_SECONDS = 0.02
START_TIMEOUT = 600.0


def memory_of(pid: int) -> dict[str, int]:
    """The smaps_rollup fields of `pid`, in MB: the worker's, not only the supervisor's."""
    fields = harness.proc_kib(pid, "smaps_rollup")
    return {name: kib // 1024 for name, kib in fields.items() if name in MEMORY_FIELDS}


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def serve(db: Path, workers: int, cold: bool) -> dict[str, Any]:
    """From the spawn: when `/health` changed status, when each of `LISTS` answered, and
    each process's memory once they have (a copy of DB: the server writes beside it)."""
    token = databases.create_token(db, "start")
    if cold:
        drop_caches()
    base = f"http://127.0.0.1:{harness.free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")}
    command = [sys.executable, "-m", "leasestar", "--db", str(db), "serve", "--port"]
    command += [base.rsplit(":", 1)[1], "--workers", str(workers)]
    command += ["--log-format", "off", "--rate-limit", "off"]
    health: list[tuple[float, int, str]] = []  # (seconds, status, body) when it changed
    result: dict[str, Any] = {"db": str(db), "workers": workers, "cold": cold}

    def ready() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"the server exited ({process.returncode})")
        try:
            status, body = harness.http_get(base + "/health", timeout=120)
        except OSError:
            return False
        if not health or health[-1][1] != status:
            health.append((round(time.monotonic() - started, 3), status, body.decode()[:200]))
        return status == 200

    started = time.monotonic()
    spawned = harness.running(command, env=env, stdout=subprocess.DEVNULL)
    with spawned as process, contextlib.closing(harness.KeepAlive(base)) as client:
        harness.wait_until(ready, START_TIMEOUT, "the server was not ready", POLL_SECONDS)
        result["health"], result["lists"] = health, []
        for url in LISTS:
            status, _, body, seconds = client.get(url, token)
            total = json.loads(body).get("meta", {}).get("total")
            result["lists"].append(
                {"url": url, "status": status, "seconds": round(seconds, 3), "total": total}
            )
        result["ready_to_lists_answered"] = round(time.monotonic() - started, 3)
        time.sleep(1.0)  # settled
        memory = {pid: memory_of(pid) for pid in harness.children(process.pid)}
        result["memory_mb"] = {**memory, "serve": memory_of(process.pid)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cold", action="store_true", help="drop the page cache first (root)")
    args = parser.parse_args()
    print(json.dumps(serve(args.db, args.workers, args.cold)))


if __name__ == "__main__":
    main()
