"""Sync clients (issue 13): the NDJSON stream against `leasestar export` in turns, and
the long poll's wake-up with hundreds of clients waiting. Method: sections.toml, RESULTS.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import databases
import harness
import provenance
from harness import CLIENT_CORE, SERVER_CORE, percentile, pinned

from leasestar.applicants.pipeline import import_ndjson
from leasestar.database import open_for_write

ENCODINGS = ("identity", "gzip")
QUIET = {"LEASESTAR_LOG_FORMAT": "off"}


@dataclass
class Run:
    seconds: float
    cpu: float  # CPU seconds of the exporting or serving process
    wire: int = 0  # bytes on the wire (a stream)
    peak_kib: int = 0  # the server's peak RSS during the stream
    before_kib: int = 0  # the server's RSS just before it


def _stream_once(server: harness.Server, token: str, encoding: str) -> Run:
    """One curl stream of the table in id order (the export's order and bytes); the server's
    CPU time, its RSS sampled every 20 ms."""
    before = harness.proc_kib(server.pid)["VmRSS"]
    with harness.rss_samples(server.pid, 0.02) as samples:
        cpu, started = harness.cpu_seconds(server.pid), time.perf_counter()
        done = subprocess.run([
            *pinned(CLIENT_CORE), "curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}",
            "-H", f"Authorization: Bearer {token}", "-H", "Accept: application/x-ndjson",
            "-H", f"Accept-Encoding: {encoding}", f"{server.base}/v1/applicants?order-by=",
        ], capture_output=True, text=True, check=True)  # fmt: skip
        elapsed = time.perf_counter() - started
    cpu = harness.cpu_seconds(server.pid) - cpu
    return Run(elapsed, cpu, int(done.stdout), max([before, *samples]), before)


def _alternate(db: Path, rounds: int, work: Path) -> tuple[list[Run], dict[str, list[Run]], int]:
    """(exports, streams by encoding, idle RSS): each taken in turn, `rounds` times, so that
    other work on a shared machine weighs on each alike."""
    token = databases.create_token(db, "sync")
    # To /dev/null on the server's core (taskset execs it: its CPU time is the export's own).
    export = [*pinned(SERVER_CORE), str(harness.LEASESTAR), "export", "--db", str(db)]
    exports: list[Run] = []
    streams: dict[str, list[Run]] = {encoding: [] for encoding in ENCODINGS}
    with harness.leasestar_server("sync", db, QUIET, work=work) as server:
        idle = harness.proc_kib(server.pid)["VmRSS"]
        # Unmeasured: the first export after the server started had it build its columnar
        # copy of the table meanwhile (~100 MB and 3.5 s of the export's core, once).
        harness.timed_run(export)
        for number in range(1, rounds + 1):
            exports.append(Run(*harness.timed_run(export)))
            for encoding in ENCODINGS:
                streams[encoding].append(_stream_once(server, token, encoding))
            harness.say(f"round {number}/{rounds} done; load {provenance.loadavg()}")
    return exports, streams, idle


async def _wake_up(server: harness.Server, db: Path, token: str, clients: int) -> str:
    """`clients` long polls waiting, then one write committed: the section's text of it."""
    request = (
        f"GET /v1/applicants?changed_since={databases.change_seq(db)}&wait=30 HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    ).encode()
    done: list[float] = []
    empty = 0

    async def one() -> None:
        nonlocal empty
        port = int(server.base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        answer = await reader.read()
        writer.close()
        if b" 200 " not in answer.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"a long poll answered {answer[:200]!r}")
        if b'"results":[{' in answer:
            done.append(time.perf_counter())
        else:  # its wait ran out before it saw the write: counted, not timed
            empty += 1

    # A just-started server's first broad filter reads its columnar copy (seconds at 1M):
    # done first, or it would count as the waiting clients' cost.
    url = f"{server.base}/v1/applicants?limit=1&updated_at_gte=1970-01-01"
    if b'"total":' not in await asyncio.to_thread(harness.get_ok, url, token, 600):
        raise RuntimeError("the server's first list answered no total")
    tasks = [asyncio.create_task(one()) for _ in range(clients)]
    await asyncio.sleep(3)  # every client connected and waiting
    cpu_before = harness.cpu_seconds(server.pid)
    await asyncio.sleep(5)
    idle_cpu = (harness.cpu_seconds(server.pid) - cpu_before) / 5
    # The first seeded record, changed.
    with contextlib.closing(open_for_write(db)) as writer:
        import_ndjson(writer, io.BytesIO(databases.ndjson(1, 0, "woken")))
        committed = time.perf_counter()
    await asyncio.gather(*tasks)
    ms = [(moment - committed) * 1000 for moment in done]
    woken = "none woken"
    if ms:
        woken = provenance.text(
            "sync", "woken", p50=statistics.median(ms), p99=percentile(ms, 0.99), max=max(ms)
        )
    empty_text = provenance.text("sync", "empty", empty=empty) if empty else ""
    return provenance.text(
        "sync", "poll", clients=clients, woken=woken, empty=empty_text, idle_cpu=idle_cpu * 100
    )


def _stream_table(exports: list[Run], streams: dict[str, list[Run]], size: int, idle: int) -> str:
    def share(runs: list[Run]) -> float:
        # The median share of a core a pass had: CPU time over wall time.
        return statistics.median(run.cpu / run.seconds for run in runs)

    export_seconds = statistics.median(run.seconds for run in exports)
    export_cpu = statistics.median(run.cpu for run in exports)
    lines = [
        provenance.text(
            "sync", "table", export_rate=size / export_seconds / 1e6, export_cpu=export_cpu,
            export_share=share(exports), size=size / 1e6,
        )
    ]  # fmt: skip
    for encoding, runs in streams.items():
        seconds = statistics.median(run.seconds for run in runs)
        # Each round's stream against that round's export: a passing load weighs on both.
        paired = statistics.median(
            export.seconds / run.seconds for export, run in zip(exports, runs, strict=True)
        )
        cpu = statistics.median(run.cpu for run in runs)
        # The stream's own memory: over the RSS just before it (not the columnar copy's).
        peak = max(run.peak_kib - run.before_kib for run in runs)
        highest = max(run.peak_kib for run in runs)
        lines.append(
            provenance.text(
                "sync", "stream", encoding=encoding, rate=size / seconds / 1e6,
                speed=export_seconds / seconds, paired=paired, cpu=cpu, cpu_speed=export_cpu / cpu,
                share=share(runs), wire=runs[-1].wire / 1e6, peak=peak / 1024,
                over_start=(highest - idle) / 1024,
            )
        )  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="export and streams in turn")
    parser.add_argument("--clients", type=int, default=500, help="long polls")
    smoke = {"rows": 2_000, "clients": 20, "rounds": 2}
    quick = {"rows": 100_000, "clients": 200}
    args, outputs = provenance.options(parser, smoke, rows=1_000_000, quick=quick)
    rows = args.rows
    db = databases.ensure_database(rows, outputs.work)
    with contextlib.closing(databases.read_only(db)) as connection:
        # Bytes `leasestar export` writes: every stored body and its newline.
        sql = "SELECT sum(length(CAST(body AS BLOB)) + 1) FROM applicants"
        export_bytes = int(connection.execute(sql).fetchone()[0])
    load_before, started = provenance.loadavg(), time.monotonic()
    exports, streams, idle = _alternate(db, args.rounds, outputs.work)
    minutes, load_after = (time.monotonic() - started) / 60, provenance.loadavg()
    here, poll_db, poll_token = databases.workspace(rows, outputs.work, "sync-long-poll")
    with harness.leasestar_server("sync-poll", poll_db, QUIET, work=here) as server:
        poll = asyncio.run(_wake_up(server, poll_db, poll_token, args.clients))
    databases.remove_database(poll_db)
    section = provenance.section(
        "sync", _stream_table(exports, streams, export_bytes, idle), poll,
        rows=rows, rounds=args.rounds, minutes=minutes,
        load_before=load_before, load_after=load_after, server_core=SERVER_CORE,
        client_core=CLIENT_CORE,
    )  # fmt: skip
    provenance.publish(section, outputs.results_md)


if __name__ == "__main__":
    main()
