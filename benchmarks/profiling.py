"""`make bench BENCH_ARGS=--profile`: py-spy on the server, and where a request's time goes.

The list-default and get-by-id cases are served under py-spy; each sample's time goes
to the innermost frame that matches a rule of `COMPONENTS`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import harness
from cases import Dataset, Settings, target_for
from harness import BIN, CLIENT_CORE, WORK, pinned, say


def profile(settings: Settings, work: Path = WORK) -> None:
    """py-spy on the served list-default and get-by-id cases: where a request's time goes."""
    spy = BIN / "py-spy"
    if not spy.exists():
        subprocess.run(
            [str(BIN / "python"), "-m", "pip", "install", "--quiet", "py-spy"], check=True
        )
    dataset = Dataset.prepare(settings.small, work)
    seconds = settings.seconds
    with harness.leasestar_server("profile", dataset.db, {}, work=work) as served:
        base, pid = served.base, served.pid
        for key in ("list_default", "get_by_id"):
            target = target_for(base, dataset, dataset.cases[key], key)
            target.run(settings.warmup, keep=False)
            out = work / f"profile-{key}.txt"
            recorder = subprocess.Popen(
                [
                    *pinned(CLIENT_CORE),
                    str(spy),
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--duration",
                    str(seconds + 1),
                    "--threads",
                    "--nonblocking",
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
            target.run(seconds)
            recorder.wait()
            m = target.measured()
            say(f"profile {key}: {m.rps:,.0f} req/s under py-spy; stacks in {out}")
            summarise_profile(out)


# Where a sample's time belongs: the innermost frame that matches a rule decides.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("aiosqlite/core.py:147", "SQLite: executing the statement (connection thread)"),
    ("aiosqlite/core.py:148", "SQLite: fetching the rows (connection thread)"),
    ("aiosqlite/core.py:158", "aiosqlite: handing the call to its thread"),
    ("aiosqlite/", "aiosqlite: thread and future plumbing"),
    ("uuid.py", "observability: request id (uuid4)"),
    ("logging/", "observability: access log (logging)"),
    ("prometheus_client/", "observability: metrics"),
    ("leasestar/observability.py", "observability: middleware"),
    ("leasestar/hygiene.py", "hygiene middleware"),
    ("litestar/middleware/compression", "compression middleware"),
    ("litestar/middleware/authentication", "auth middleware (Litestar)"),
    ("leasestar/auth.py", "auth: token lookup"),
    ("leasestar/applicants/cursors.py", "handler: next-page cursor"),
    ("leasestar/applicants/query.py", "handler: query parsing and SQL building"),
    ("leasestar/applicants/filters.py", "handler: query parsing and SQL building"),
    ("leasestar/applicants/ordering.py", "handler: query parsing and SQL building"),
    ("leasestar/applicants/plan.py", "handler: query parsing and SQL building"),
    ("leasestar/instants.py", "handler: query parsing and SQL building"),
    ("leasestar/applicants/storage.py", "handler: storage (Python side)"),
    ("leasestar/applicants/controller.py", "handler: controller, meta, ETag"),
    ("litestar/", "Litestar: routing, request, response"),
    ("uvicorn/", "uvicorn: HTTP protocol"),
    ("asyncio/", "event loop (uvloop, sockets)"),
)


def component(frames: list[str]) -> str:
    for frame in reversed(frames):
        for pattern, name in COMPONENTS:
            if pattern in frame:
                return name
    return "other"


def summarise_profile(path: Path, top: int = 25) -> None:
    """Print shares per component and per function from py-spy's collapsed stacks."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    parts: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        name = component(frames)
        parts[name] = parts.get(name, 0) + count
    total = max(total, 1)
    print(f"--- {path.name}: {total} samples of busy threads, by component")
    for name, count in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"{count / total:6.1%}  {name}")
    print(f"--- {path.name}: self, top {top}")
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{count / total:6.1%}  {frame}")
    print(f"--- {path.name}: inclusive, top {top}")
    for frame, count in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{count / total:6.1%}  {frame}")
