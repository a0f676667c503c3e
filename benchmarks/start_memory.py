"""Start to ready, and where a worker's memory goes (issue 27).

    python benchmarks/start_memory.py DB [--workers N] [--cold] [--components]

Starts `leasestar serve` on DB (a copy: the server writes `<DB>-columns` beside it and a
token into it), then from the spawn: when `/health` first answers 200, when each of the
first list requests below answers, and each worker's memory once they have (from
`/proc/PID/smaps_rollup`: the worker, not the `serve` process that supervises it).
`--cold` drops the page cache first (root). `--components` instead loads the columnar
copy in this process and reports each part's size and time. One JSON object on stdout.

The server is `python -m leasestar`, which imports from the current directory first: to
measure another checkout, run from it (`cd OTHER && PYTHONPATH=$PWD python
/path/to/start_memory.py DB`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
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
    """The smaps_rollup fields of `pid`, in MB."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        if name in MEMORY_FIELDS:
            found[name] = int(value.split()[0]) // 1024
    return found


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return sorted(found)


def token_for(db: Path) -> str:
    name = f"start-{os.getpid()}-{time.time_ns()}"
    made = subprocess.run(
        [sys.executable, "-m", "leasestar", "--db", str(db), "token", "create", "--name", name],
        capture_output=True,
        text=True,
        check=True,
    )
    return next(word for word in made.stdout.split() if word.startswith("lst_"))


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def serve(db: Path, workers: int, cold: bool) -> dict[str, Any]:
    token = token_for(db)
    if cold:
        drop_caches()
    port = 18000 + os.getpid() % 1000
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")}
    command = [sys.executable, "-m", "leasestar", "--db", str(db), "serve", "--port", str(port)]
    command += ["--workers", str(workers), "--log-format", "off", "--rate-limit", "off"]
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    result: dict[str, Any] = {"db": str(db), "workers": workers, "cold": cold}
    try:
        health: list[tuple[float, int, str]] = []  # (seconds, status, body) when it changed
        with httpx.Client(base_url=base, timeout=120) as http:
            while time.monotonic() - started < START_TIMEOUT:
                if process.poll() is not None:
                    raise SystemExit(f"server exited: {process.stderr.read().decode()}")  # type: ignore[union-attr]
                try:
                    answer = http.get("/health")
                except httpx.TransportError:
                    time.sleep(POLL_SECONDS)
                    continue
                seconds = round(time.monotonic() - started, 3)
                if not health or health[-1][1] != answer.status_code:
                    health.append((seconds, answer.status_code, answer.text[:200]))
                if answer.status_code == 200:
                    break
                time.sleep(POLL_SECONDS)
            result["health"] = health
            lists = []
            for url in LISTS:
                sent = time.monotonic()
                answer = http.get(url, headers={"Authorization": f"Bearer {token}"})
                lists.append(
                    {
                        "url": url,
                        "status": answer.status_code,
                        "seconds": round(time.monotonic() - sent, 3),
                        "total": answer.json().get("meta", {}).get("total"),
                    }
                )
            result["lists"] = lists
            result["ready_to_lists_answered"] = round(time.monotonic() - started, 3)
        time.sleep(1.0)  # settled
        result["memory_mb"] = {pid: memory_of(pid) for pid in children(process.pid)}
        result["memory_mb"]["serve"] = memory_of(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return result


def components(db: Path) -> dict[str, Any]:
    """The copy loaded here: the size and time of each part."""
    import asyncio
    import resource

    import numpy as np

    from leasestar.applicants.columnar_copy import COLUMNS
    from leasestar.applicants.match_counter import MatchCounter

    def rss() -> int:
        return memory_of(os.getpid())["Rss"]

    found: dict[str, Any] = {"python_rss_mb": rss()}
    counter = MatchCounter(db)
    started = time.monotonic()
    asyncio.run(counter.catch_up())
    found["copy_seconds"] = round(time.monotonic() - started, 3)
    mine = memory_of(os.getpid())
    found["after_copy_private_dirty_mb"] = mine["Private_Dirty"]
    found["after_copy_anonymous_mb"] = mine["Anonymous"]
    found["rows"] = counter.rows
    found["copy_columns_mb"] = round(
        (sum(a.nbytes for a in counter._columns.values()) + counter._present.nbytes) / 1e6, 1
    )
    found["code_table_values"] = {c: len(codes._codes) for c, codes in counter._codes.items()}
    found["rss_after_copy_mb"] = rss()
    orders: dict[str, Any] = {}
    for column in COLUMNS:
        started = time.monotonic()
        rowids, keys = counter._in_order(column, counter._order_of(column))
        orders[column] = {
            "seconds": round(time.monotonic() - started, 3),
            "mb": round((rowids.nbytes + keys.nbytes) / 1e6, 1),
        }
    found["orders"] = orders
    found["rss_after_orders_mb"] = rss()
    started = time.monotonic()
    starts, instants = counter._by_group("integration_id", "updated_at")
    found["group_integration_id_updated_at"] = {
        "seconds": round(time.monotonic() - started, 3),
        "mb": round((starts.nbytes + instants.nbytes) / 1e6, 1),
    }
    found["rss_end_mb"] = rss()
    found["end_anonymous_mb"] = memory_of(os.getpid())["Anonymous"]
    found["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    found["numpy"] = np.__version__
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--components", action="store_true")
    args = parser.parse_args()
    if args.components:
        if args.cold:
            drop_caches()
        print(json.dumps(components(args.db)))
    else:
        print(json.dumps(serve(args.db, args.workers, args.cold)))


if __name__ == "__main__":
    main()
