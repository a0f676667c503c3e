"""Where a request's time goes, by subtraction: `python benchmarks/ablate.py`.

Two measurements that a profile only hints at:

1. **Server switches.** The same `leasestar serve`, started side by side with different
   `LEASESTAR_*` settings (access log off, compression off, one read connection), and the
   HTTP floor, measured in interleaved slices on list default and get by id (100k rows,
   as `run.py` measures them). The difference between two rows is what that switch
   costs per request.
2. **The aiosqlite hop.** One `SELECT` by id awaited through aiosqlite (a queue to the
   connection's thread and a future back) against the same call made directly with
   sqlite3, both under uvloop on one core: the fixed cost of handing every query to a
   thread.

It reuses `run.py`'s databases and servers; run `make bench BENCH_ARGS=--quick` once
first so that the 100k database exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
import time
from pathlib import Path

import aiosqlite
import harness
import run

CONFIGS: dict[str, dict[str, str]] = {
    "default (rate limit off)": {},
    "access log off": {"LEASESTAR_LOG_FORMAT": "off"},
    "access log off, compression off": {
        "LEASESTAR_LOG_FORMAT": "off",
        "LEASESTAR_COMPRESSION": "off",
    },
    "access log off, compression off, 1 read connection": {
        "LEASESTAR_LOG_FORMAT": "off",
        "LEASESTAR_COMPRESSION": "off",
        "LEASESTAR_READ_CONNECTIONS": "1",
    },
}


def switches(settings: run.Settings) -> None:
    dataset = run.Dataset.prepare(run.SMALL)
    floor_dir = run.WORK / "floor-bodies"
    with contextlib.ExitStack() as stack:
        bases = {}
        for name, env in CONFIGS.items():
            bases[name] = stack.enter_context(
                harness.leasestar_server(f"ablate-{len(bases)}", dataset.db, env)
            ).base
        first = next(iter(bases.values()))
        floor_dir.mkdir(parents=True, exist_ok=True)
        for key in ("list_default", "get_by_id"):
            body, _ = run.served_once(first, dataset, dataset.cases[key])
            (floor_dir / f"{key}.json").write_bytes(body)
        floor_base = stack.enter_context(run.floor_server(floor_dir)).base
        for key in ("list_default", "get_by_id"):
            case = dataset.cases[key]
            targets = [run.target_for(base, dataset, case, name) for name, base in bases.items()]
            targets.append(harness.WrkTarget("HTTP floor (same body)", f"{floor_base}/floor/{key}"))
            run.interleave(settings, targets, [])
            print(f"\n{case.label}, {harness.CONNECTIONS} connections, {settings.seconds} s each")
            for target in targets:
                m = target.measured()
                print(
                    f"  {target.name:<52} {m.rps:7.0f} req/s  {1e6 / m.rps:6.0f} us/req  "
                    f"p50 {m.p50_ms:6.2f} ms  p99 {m.p99_ms:6.2f} ms"
                )


def hop(db: Path, seconds: float = 2.0) -> None:
    """Cost of one query through aiosqlite's thread against the same query done inline."""
    ids = run.data_facts(db, run.SMALL).ids
    sql = "SELECT CAST(body AS BLOB) FROM applicants WHERE id = ?"

    async def through_thread() -> float:
        async with aiosqlite.connect(harness.read_only_uri(db), uri=True) as connection:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                await connection.execute_fetchall(sql, (ids[done % len(ids)],))
                done += 1
            return (time.perf_counter() - start) / done

    async def inline() -> float:
        connection = sqlite3.connect(harness.read_only_uri(db), uri=True)
        try:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                connection.execute(sql, (ids[done % len(ids)],)).fetchall()
                done += 1
                if done % 64 == 0:
                    await asyncio.sleep(0)  # stay a good citizen of the loop
            return (time.perf_counter() - start) / done
        finally:
            connection.close()

    import uvloop

    with harness.on_server_core():
        threaded = uvloop.run(through_thread())
        direct = uvloop.run(inline())
    print(f"\nget by id, one query, uvloop, one core ({harness.SERVER_CORE}):")
    print(f"  through aiosqlite's thread  {threaded * 1e6:6.1f} us/query")
    print(f"  inline sqlite3              {direct * 1e6:6.1f} us/query")
    print(f"  the hop costs               {(threaded - direct) * 1e6:6.1f} us/query")


def main() -> int:
    quick = "--quick" in sys.argv
    settings = run.QUICK if quick else run.FULL
    harness.raise_priority()
    harness.ensure_wrk()
    db = harness.ensure_database(run.SMALL)
    hop(db)
    switches(settings)
    return 0


if __name__ == "__main__":
    os.chdir(harness.ROOT)
    sys.exit(main())
