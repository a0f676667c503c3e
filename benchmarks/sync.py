"""Sync clients (issue 13): the NDJSON stream against `leasestar export`, and the long
poll's wake-up latency with hundreds of waiting clients.

- Stream: bytes per second of `GET /v1/applicants` with `Accept: application/x-ndjson`
  (curl, identity and gzip) against `leasestar export` of the same database to
  /dev/null, best of three each; the server's RSS sampled every 20 ms during the stream,
  against its RSS at idle.
- Long poll: N clients (raw asyncio sockets, one request each) wait with
  `changed_since=<high-water>&wait=30`; one record is written in this process and
  committed; each client's latency is from the commit's return to its complete answer.
  The server's CPU time over 5 s while they all wait is the idle cost.

Writes the `sync` section of benchmarks/RESULTS.md. `python benchmarks/sync.py --quick`
runs on 100,000 rows with 200 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import subprocess
import threading
import time
from pathlib import Path

import databases
import harness
import msgspec
import provenance

from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant
from leasestar.database import open_for_write

CLIENT_CORE = "1"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def _sample_rss(pid: int, stop: threading.Event, into: list[int]) -> None:
    while not stop.is_set():
        into.append(_rss_kib(pid))
        time.sleep(0.02)


def _export_bytes(db: Path) -> int:
    """Bytes `leasestar export` writes: every stored body and its newline."""
    with sqlite3.connect(db) as connection:
        (size,) = connection.execute(
            "SELECT sum(length(CAST(body AS BLOB)) + 1) FROM applicants"
        ).fetchone()
    return int(size)


def _export_rate(db: Path, size: int) -> float:
    """Bytes/s of `leasestar export` to /dev/null, best of three."""
    command = [str(harness.LEASESTAR), "export", "--db", str(db)]
    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run(
            [*harness.pinned(harness.SERVER_CORE), *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        best = max(best, size / (time.perf_counter() - started))
    return best


def _stream_rate(server: harness.Server, token: str, encoding: str) -> tuple[float, int, int]:
    """(whole streams per second, bytes on the wire, peak RSS KiB) of a curl stream of the
    whole table in id order (the export's order and bytes), best of three."""
    best = 0.0
    wire = 0
    peak = 0
    for _ in range(3):
        stop = threading.Event()
        samples: list[int] = []
        sampler = threading.Thread(target=_sample_rss, args=(server.pid, stop, samples))
        sampler.start()
        started = time.perf_counter()
        done = subprocess.run(
            [
                *harness.pinned(CLIENT_CORE),
                *("curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}"),
                *("-H", f"Authorization: Bearer {token}", "-H", "Accept: application/x-ndjson"),
                *("-H", f"Accept-Encoding: {encoding}", f"{server.base}/v1/applicants?order-by="),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.perf_counter() - started
        stop.set()
        sampler.join()
        wire = int(done.stdout)
        peak = max(peak, *samples)
        best = max(best, 1 / elapsed)
    return best, wire, peak


async def _long_poll(port: int, token: str, since: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /v1/applicants?changed_since={since}&wait=30 HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode()
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def _wake_up(server: harness.Server, db: Path, token: str, clients: int) -> dict[str, float]:
    port = int(server.base.rsplit(":", 1)[1])
    with sqlite3.connect(db) as connection:
        (since,) = connection.execute("SELECT max(change_seq) FROM applicants").fetchone()
        (body,) = connection.execute("SELECT body FROM applicants LIMIT 1").fetchone()
    done: list[float] = []

    async def one() -> None:
        answer = await _long_poll(port, token, since)
        done.append(time.perf_counter())
        if b" 200 " not in answer.split(b"\r\n", 1)[0] or b'"results":[{' not in answer:
            raise RuntimeError(f"a long poll answered {answer[:200]!r}")

    tasks = [asyncio.create_task(one()) for _ in range(clients)]
    await asyncio.sleep(3)  # every client connected and waiting
    cpu_before = _cpu_seconds(server.pid)
    await asyncio.sleep(5)
    idle_cpu = (_cpu_seconds(server.pid) - cpu_before) / 5
    record = msgspec.json.decode(body, type=Applicant)
    writer = open_for_write(db)
    try:
        write_records(writer, [msgspec.structs.replace(record, first_name="Woken")])
        committed = time.perf_counter()
    finally:
        writer.close()
    await asyncio.gather(*tasks)
    latencies = sorted(moment - committed for moment in done)
    return {
        "p50": statistics.median(latencies),
        "p99": latencies[max(0, int(len(latencies) * 0.99) - 1)],
        "max": latencies[-1],
        "idle_cpu": idle_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 200 clients")
    args = parser.parse_args()
    rows, clients = (100_000, 200) if args.quick else (1_000_000, 500)
    db = databases.ensure_database(rows)
    export_bytes = _export_bytes(db)
    export_rate = _export_rate(db, export_bytes)
    token = databases.create_token(db, "sync")
    results: dict[str, tuple[float, int, int]] = {}
    with harness.leasestar_server("sync", db, {"LEASESTAR_LOG_FORMAT": "off"}) as server:
        idle = _rss_kib(server.pid)
        for encoding in ("identity", "gzip"):
            per_second, wire, peak = _stream_rate(server, token, encoding)
            results[encoding] = (per_second * export_bytes, wire, peak)
    poll_db = harness.WORK / "sync-long-poll.db"
    with sqlite3.connect(db) as source, sqlite3.connect(poll_db) as target:
        source.backup(target)
    poll_token = databases.create_token(poll_db, "poll")
    with harness.leasestar_server("sync-poll", poll_db, {"LEASESTAR_LOG_FORMAT": "off"}) as server:
        wake = asyncio.run(_wake_up(server, poll_db, poll_token, clients))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{poll_db}{suffix}").unlink(missing_ok=True)
    lines = [
        "<!-- BEGIN sync -->",
        "## Sync clients: NDJSON streams and long polls (issue 13)",
        "",
        f"`python benchmarks/sync.py{' --quick' if args.quick else ''}` at "
        f"{provenance.git_commit()}, {rows:,} applicants; {provenance.describe_machine()}",
        "",
        "| what | bytes/s | vs export | on the wire | server RSS peak over idle |",
        "|---|---:|---:|---:|---:|",
        f"| `leasestar export` to /dev/null | {export_rate / 1e6:,.0f} MB/s | 1.00x "
        f"| {export_bytes / 1e6:,.0f} MB | |",
    ]
    for encoding, (rate, wire, peak) in results.items():
        lines.append(
            f"| stream, `Accept-Encoding: {encoding}` | {rate / 1e6:,.0f} MB/s "
            f"| {rate / export_rate:.2f}x | {wire / 1e6:,.0f} MB | {(peak - idle) / 1024:,.0f} MB |"
        )
    lines += [
        "",
        f"Long poll, {clients} clients waiting, one write committed: wake-up p50 "
        f"{wake['p50'] * 1000:,.0f} ms, p99 {wake['p99'] * 1000:,.0f} ms, max "
        f"{wake['max'] * 1000:,.0f} ms (target p99 <= 1 s); server CPU while they wait "
        f"{wake['idle_cpu'] * 100:.1f}% of a core.",
        "<!-- END sync -->",
    ]
    section = "\n".join(lines)
    print(section)
    provenance.write_section(section)


if __name__ == "__main__":
    main()
