"""The data path at scale (issue 3): seed, export and import a million applicants.

Run from the repository root:

    .venv/bin/python benchmarks/ingest.py             # 1,000,000 rows, writes RESULTS.md
    .venv/bin/python benchmarks/ingest.py --count 100000 --no-write   # a quick look

Each step is the real console script in its own process, timed from start to exit,
with that process's own peak RSS and CPU time (`os.wait4`):

1. `leasestar seed --count N --seed 0` into a new database;
2. `leasestar export` of it to an NDJSON file;
3. `leasestar import` of that file into an empty database (schema only);
4. `leasestar export` of the imported database, compared byte for byte with step 2;
5. `leasestar import` of the same file again: every record seen again, unchanged.

It then writes the `ingest` section of `benchmarks/RESULTS.md` (only the text between
`<!-- BEGIN ingest -->` and `<!-- END ingest -->`; the rest of the file is kept). The
work files go to `benchmarks/work/ingest/` (ignored by git) and are removed afterwards
unless `--keep`. The machine is shared: the load average before and after is recorded
with the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import pty
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import provenance
from harness import BENCH, LEASESTAR, ROOT

from leasestar.database import open_for_write

BEGIN, END = "<!-- BEGIN ingest -->", "<!-- END ingest -->"
LIMIT_SECONDS = 120
LIMIT_RSS_MB = 500
# The phase shown on the progress line (commands.Progress.phase): "import: committing...".
PHASE = re.compile(r"\x1b\[K\w+: (building indexes \d+/\d+|committing)\.\.\.")


@dataclass
class Step:
    name: str
    command: list[str]
    seconds: float
    rss_mb: float
    cpu_seconds: float
    rows: int
    phases: dict[str, float]
    db_bytes: int | None = None

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    def split(self) -> str:
        """Seconds in each phase: rows, index builds, commit (with its checkpoint)."""
        marks = [self.phases.get("building indexes"), self.phases.get("committing")]
        known = [mark for mark in marks if mark is not None]
        if not known:
            return ""
        rows_end = known[0]
        indexes = marks[1] - marks[0] if marks[0] is not None and marks[1] is not None else 0
        commit = self.seconds - marks[1] if marks[1] is not None else 0
        return f"{rows_end:.0f} / {indexes:.0f} / {commit:.0f}"


def watch_phases(master: int, started: float, phases: dict[str, float]) -> None:
    """Note when the progress line on the pseudo-terminal first shows each phase."""
    pending = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the command exited and closed the terminal
            return
        if not chunk:
            return
        pending = (pending + chunk)[-4096:]
        for match in PHASE.finditer(pending.decode(errors="replace")):
            label = "building indexes" if match[1].startswith("building") else match[1]
            phases.setdefault(label, time.monotonic() - started)


def run_step(name: str, command: list[str], rows: int) -> Step:
    """Run one command to completion; its wall time, peak RSS and CPU, from wait4.

    stderr is a pseudo-terminal, so the command draws its progress line, from which the
    time each phase (row writes, index builds, commit) starts is read.
    """
    print(f"{name}: {' '.join(shown(command))}", flush=True)
    master, slave = pty.openpty()
    phases: dict[str, float] = {}
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    watcher = threading.Thread(target=watch_phases, args=(master, started, phases))
    watcher.start()
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.monotonic() - started
    watcher.join(5)
    os.close(master)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{name} failed with exit code {process.returncode}")
    step = Step(
        name=name,
        command=command,
        seconds=seconds,
        rss_mb=usage.ru_maxrss / 1024,
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        rows=rows,
        phases=phases,
    )
    print(
        f"  {seconds:.1f} s, {step.rate:,.0f} rows/s, peak RSS {step.rss_mb:.0f} MB, "
        f"CPU {step.cpu_seconds:.1f} s  {output.decode().strip()}",
        flush=True,
    )
    return step


def shown(command: list[str]) -> list[str]:
    """The command as a reader would type it from the repository root."""
    return [os.path.relpath(part, ROOT) if part.startswith(str(ROOT)) else part for part in command]


def database_bytes(path: Path) -> int:
    return sum(
        candidate.stat().st_size
        for candidate in (path, path.with_name(path.name + "-wal"))
        if candidate.exists()
    )


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fresh(path: Path) -> Path:
    for suffix in ("", "-wal", "-shm", ".partial"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    return path


def verdict(step: Step, timed: bool) -> str:
    checks = [step.rss_mb < LIMIT_RSS_MB]
    if timed:
        checks.append(step.seconds <= LIMIT_SECONDS)
    return "PASS" if all(checks) else "MISS"


def report(steps: list[Step], count: int, identical: bool, load_before: str, argv: str) -> str:
    by_name = {step.name: step for step in steps}
    lines = [
        BEGIN,
        "## Data in and out at scale (issue 3)",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on commit `{provenance.git_commit()}` "
        f"with `{argv}`.",
        "",
        f"**Machine**: {provenance.describe_machine()}; load average before {load_before}, "
        f"after {provenance.loadavg()}. "
        "The machine is shared with other work, which shows in the wall times.",
        "",
        f"**Versions**: python {platform.python_version()}, sqlite {sqlite3.sqlite_version}.",
        "",
        "Each step is the console script in its own process (`os.wait4`): peak RSS is the "
        "larger of that process and its worker process (import and seed parse or generate "
        "in one), CPU is both together. The phases are read from its progress line (stderr is "
        "a pseudo-terminal): writing the rows, rebuilding the secondary indexes (bulk "
        "mode), and COMMIT with its WAL checkpoint. The database size is the file plus its "
        "WAL when the step ends.",
        "",
        "| step | command | wall s | rows / indexes / commit s | rows/s | peak RSS MB "
        "| CPU s | database MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for step in steps:
        size = f"{step.db_bytes / 2**20:,.0f}" if step.db_bytes is not None else ""
        lines.append(
            f"| {step.name} | `{' '.join(shown(step.command))}` | {step.seconds:.1f} | "
            f"{step.split()} | {step.rate:,.0f} | {step.rss_mb:.0f} | {step.cpu_seconds:.1f} "
            f"| {size} |"
        )
    seed, load_step = by_name["seed"], by_name["import into an empty database"]
    lines += [
        "",
        f"Export, import into an empty database, export again: byte-identical "
        f"({'yes' if identical else 'NO'}; sha256 of both {count:,}-line files compared).",
        "",
        "| target (issue 3, item 4) | measured | needs | verdict |",
        "|---|---:|---:|---|",
        f"| `seed --count {count:,}` wall time | {seed.seconds:.0f} s | <= {LIMIT_SECONDS} s | "
        f"{'PASS' if seed.seconds <= LIMIT_SECONDS else 'MISS'} |",
        f"| `seed` peak RSS | {seed.rss_mb:.0f} MB | < {LIMIT_RSS_MB} MB | "
        f"{'PASS' if seed.rss_mb < LIMIT_RSS_MB else 'MISS'} |",
        f"| `import` of {count:,} lines wall time | {load_step.seconds:.0f} s | "
        f"<= {LIMIT_SECONDS} s | {'PASS' if load_step.seconds <= LIMIT_SECONDS else 'MISS'} |",
        f"| `import` peak RSS | {load_step.rss_mb:.0f} MB | < {LIMIT_RSS_MB} MB | "
        f"{'PASS' if load_step.rss_mb < LIMIT_RSS_MB else 'MISS'} |",
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="applicants (1,000,000)")
    parser.add_argument("--workdir", type=Path, default=BENCH / "work" / "ingest")
    parser.add_argument("--keep", action="store_true", help="keep the databases and files")
    parser.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args()
    argv = " ".join([".venv/bin/python", "benchmarks/ingest.py", *sys.argv[1:]])
    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    seeded, imported = fresh(work / "seeded.db"), fresh(work / "imported.db")
    dump, again = work / "export.ndjson", work / "export-again.ndjson"
    load_before = provenance.loadavg()
    steps = []
    count = args.count
    step = run_step(
        "seed",
        [str(LEASESTAR), "seed", "--db", str(seeded), "--count", str(count), "--seed", "0"],
        count,
    )
    step.db_bytes = database_bytes(seeded)
    steps.append(step)
    steps.append(
        run_step("export", [str(LEASESTAR), "export", "--db", str(seeded), str(dump)], count)
    )
    open_for_write(imported).close()  # an empty database: the schema and nothing else
    step = run_step(
        "import into an empty database",
        [str(LEASESTAR), "import", "--db", str(imported), str(dump)],
        count,
    )
    step.db_bytes = database_bytes(imported)
    steps.append(step)
    steps.append(
        run_step(
            "export the imported database",
            [str(LEASESTAR), "export", "--db", str(imported), str(again)],
            count,
        )
    )
    identical = file_digest(dump) == file_digest(again)
    print(f"export -> import -> export byte-identical: {identical}")
    step = run_step(
        "import the same file again (all unchanged)",
        [str(LEASESTAR), "import", "--db", str(imported), str(dump)],
        count,
    )
    step.db_bytes = database_bytes(imported)
    steps.append(step)
    section = report(steps, count, identical, load_before, argv)
    print(section)
    if not args.no_write:
        provenance.write_section(section)
        print(f"wrote the ingest section of {provenance.shown(provenance.RESULTS_MD)}")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
