"""Edge replicas (issue 14): lag from a primary's commit to a replica serving it, and a
replica's throughput against its primary's, caught up and while it applies an import.

1. Copies the bench database of `--rows` applicants (`databases.ensure_database`) to
   `WORK/replicas/primary.db`, runs `leasestar replicate` to a `file://` store beside it,
   and serves the primary and a replica (`serve --replica-of`) side by side on the
   server core, with wrk on the client core.
2. Lag: `--imports` imports of 100 new applicants, one after another. For each, the time
   from the primary's commit (its change sequence seen moving, polled every 5 ms) to the
   replica serving it (its `meta.total` seen moving, polled every 5 ms).
3. Throughput: list default and get by id, the primary and the caught-up replica in
   alternating slices; then the replica again, in slices, while it applies an import of
   100,000 new applicants made on the primary (slices from the store holding it to the
   replica serving it), against the primary's caught-up figure.
4. Writes the "Edge replicas" section of RESULTS.md (`--out` to write it elsewhere).

`make bench` runs it last (with its `--quick` or `--smoke DIR`); `python
benchmarks/replicas.py --rows 1000000` takes the 1M database; `--smoke DIR` runs every
step on 2,000 rows with 1 s slices and writes below DIR only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sqlite3
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from databases import create_token, ensure_database
from harness import (
    LEASESTAR,
    WORK,
    Measured,
    WrkTarget,
    ensure_wrk,
    http_get,
    leasestar_server,
    raise_priority,
    say,
)
from provenance import RESULTS_MD, describe_machine, git_commit, loadavg, write_section

IMPORT_ROWS = 100
BIG_IMPORT_ROWS = 100_000
POLL_SECONDS = 0.005


def _change_seq(connection: sqlite3.Connection) -> int:
    return int(connection.execute("SELECT change_seq FROM sync_state").fetchone()[0])


def _total(base: str, token: str) -> int:
    status, body = http_get(f"{base}/v1/applicants?limit=1", token, timeout=10)
    if status != 200:
        raise RuntimeError(f"{base}: HTTP {status}: {body[:200]!r}")
    return int(json.loads(body)["meta"]["total"])


def _health(base: str) -> dict[str, object]:
    status, body = http_get(f"{base}/health", timeout=10)
    return dict(json.loads(body)["replica"]) if status == 200 else {}


def _seed(db: Path, count: int, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(LEASESTAR), "seed", "--db", str(db), "--count", str(count), "--seed", str(seed)],
        stdout=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def _replicating(db: Path, store: Path) -> Iterator[None]:
    process = subprocess.Popen(
        [str(LEASESTAR), "replicate", "--db", str(db), "--to", store.as_uri()],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        # A finished file: litestream writes each under a temporary name first.
        while not any((store / "ltx" / "0").glob("*.ltx")):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("leasestar replicate did not ship the database")
            time.sleep(0.2)
        yield
    finally:
        process.terminate()
        process.wait(timeout=60)


def measure_lag(
    db: Path, replica: str, token: str, imports: int, first_seed: int
) -> tuple[list[float], list[float]]:
    """Seconds from each import's commit on the primary to the replica serving it, and
    the part of it the replica spent writing the change (its `/health` apply_seconds)."""
    watcher = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    lags: list[float] = []
    applies: list[float] = []
    try:
        for number in range(imports):
            before_seq, before_total = _change_seq(watcher), _total(replica, token)
            seeding = _seed(db, IMPORT_ROWS, first_seed + number)
            while _change_seq(watcher) == before_seq:
                if seeding.poll() not in (None, 0):
                    raise RuntimeError("leasestar seed failed")
                time.sleep(POLL_SECONDS)
            committed = time.monotonic()
            deadline = committed + 120
            while _total(replica, token) == before_total:
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not serve an import within 120 s")
                time.sleep(POLL_SECONDS)
            lags.append(time.monotonic() - committed)
            applies.append(float(str(_health(replica).get("apply_seconds") or 0.0)))
            seeding.wait(timeout=60)
            say(
                f"  import {number + 1}/{imports}: lag {lags[-1]:.2f} s (apply {applies[-1]:.2f} s)"
            )
    finally:
        watcher.close()
    return lags, applies


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _targets(base: str, name: str, token: str, ids: Path, some_id: str) -> list[WrkTarget]:
    return [
        WrkTarget(f"{name} list default", f"{base}/v1/applicants", token),
        WrkTarget(f"{name} get by id", f"{base}/v1/applicants/{some_id}", token, ids),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--imports", type=int, default=25)
    parser.add_argument("--seconds", type=int, default=10, help="measured seconds per target")
    parser.add_argument("--slice", type=int, default=2, help="seconds per wrk slice")
    parser.add_argument("--smoke", type=Path, help="2,000 rows, 1 s slices, files below DIR")
    parser.add_argument("--quick", action="store_true", help="20 imports, 4 s per target")
    parser.add_argument(
        "--skip-applying", action="store_true", help="no throughput during a large change"
    )
    args = parser.parse_args()
    if args.quick:
        args.imports, args.seconds = 20, 4
    results = RESULTS_MD
    work = WORK
    if args.smoke:
        args.rows, args.imports, args.seconds, args.slice = 2000, 3, 2, 1
        work, results = args.smoke, args.smoke / "RESULTS.md"
        work.mkdir(parents=True, exist_ok=True)
        if RESULTS_MD.exists() and not results.exists():
            shutil.copyfile(RESULTS_MD, results)
    raise_priority()
    ensure_wrk()
    source = ensure_database(args.rows, work)
    here = work / "replicas"
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    db = here / "primary.db"
    shutil.copyfile(source, db)
    token = create_token(db, "replica")
    ids = here / "ids.txt"
    connection = sqlite3.connect(db)
    found = [row[0] for row in connection.execute("SELECT id FROM applicants LIMIT 2000")]
    connection.close()
    ids.write_text("\n".join(found) + "\n")
    store = here / "store"
    with (
        _replicating(db, store),
        leasestar_server("replica-primary", db, work=here) as primary,
        leasestar_server(
            "replica", here / "replica.db", args=["--replica-of", store.as_uri()], work=here
        ) as replica,
    ):
        say(f"lag over {args.imports} imports of {IMPORT_ROWS} applicants")
        lags, applies = measure_lag(db, replica.base, token, args.imports, 1000)
        say("throughput, caught up: primary and replica in alternating slices")
        pairs = list(
            zip(
                _targets(primary.base, "primary", token, ids, found[0]),
                _targets(replica.base, "replica", token, ids, found[0]),
                strict=True,
            )
        )
        for _ in range(max(1, args.seconds // args.slice)):
            for target in (t for pair in pairs for t in pair):
                target.run(args.slice)
        skipped = (WrkTarget("not measured", ""), WrkTarget("not measured", ""))
        applying, applied_in = [skipped for _ in pairs], 0.0
        if not args.skip_applying:
            applying, applied_in = _while_applying(
                args, db, (primary.base, replica.base), token, ids, found[0]
            )
    report = _report(args, lags, applies, pairs, applying, applied_in)
    print(report)
    write_section(report, results)
    say(f"wrote the edge-replicas section of {results}")


def _while_applying(
    args: argparse.Namespace, db: Path, bases: tuple[str, str], token: str, ids: Path, one: str
) -> tuple[list[tuple[WrkTarget, WrkTarget]], float]:
    """Both servers in alternating slices while the replica applies a large import; and
    the seconds from the store holding it to the replica serving it."""
    primary, replica = bases
    say(f"throughput while the replica applies {BIG_IMPORT_ROWS:,} new applicants")
    before = _total(replica, token)
    if _seed(db, BIG_IMPORT_ROWS, 7).wait(timeout=1800) != 0:
        raise RuntimeError("the big import failed")
    deadline = time.monotonic() + 300
    while not int(str(_health(replica).get("transactions_behind") or 0)):
        if _total(replica, token) != before or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # The primary in alternating slices too: background load on a shared machine then
    # falls on both sides of the ratio alike.
    applying = list(
        zip(
            _targets(primary, "primary meanwhile", token, ids, one),
            _targets(replica, "replica applying", token, ids, one),
            strict=True,
        )
    )
    started = time.monotonic()
    while _total(replica, token) == before:
        for target in (t for pair in applying for t in pair):
            target.run(args.slice)
        if time.monotonic() - started > 900:
            raise RuntimeError("the replica did not apply the big import in 900 s")
    return applying, time.monotonic() - started


def _rps(measured: Measured) -> str:
    return f"{measured.rps:,.0f}"


def _report(
    args: argparse.Namespace,
    lags: list[float],
    applies: list[float],
    pairs: list[tuple[WrkTarget, WrkTarget]],
    applying: list[tuple[WrkTarget, WrkTarget]],
    applied_in: float,
) -> str:
    # /health's apply_seconds is the last change applied: where that was one of the
    # primary litestream's own small transactions (a checkpoint), it says nothing.
    written = [seconds for seconds in applies if seconds >= 0.005] or applies
    section = "edge-replicas" if args.rows == 100_000 else f"edge-replicas-{args.rows}"
    rows = []
    for (primary, replica), (primary_meanwhile, during) in zip(pairs, applying, strict=True):
        p, r = primary.measured(), replica.measured()
        case = primary.name.removeprefix("primary ")
        row = f"| {case} | {_rps(p)} | {_rps(r)} | {r.rps / p.rps:.2f}x | "
        if during.slices:
            m, d = primary_meanwhile.measured(), during.measured()
            row += f"{_rps(m)} | {_rps(d)} | {d.rps / m.rps:.2f}x |"
        else:
            row += "- | - | - |"
        rows.append(row)
    return "\n".join(
        [
            f"<!-- BEGIN {section} -->",
            f"## Edge replicas, {args.rows:,} applicants",
            "",
            f"`python benchmarks/replicas.py --rows {args.rows}` at {git_commit()}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {describe_machine()}; "
            f"load average {loadavg()} at the end (a shared machine: provisional figures).",
            "",
            f"Lag from a primary's commit to a replica serving it, {len(lags)} imports of "
            f"{IMPORT_ROWS} applicants into {args.rows:,} (leasestar's intervals: the "
            "primary's litestream looks at the WAL and ships every 250 ms; the replica's "
            "follows the store at litestream's default, every 1 s): "
            f"p50 {statistics.median(lags):.2f} s, p99 {_percentile(lags, 0.99):.2f} s, "
            f"max {max(lags):.2f} s (target: p99 <= 3 s). Of that, writing the change "
            f"into the replica's database took {statistics.median(written):.2f} s at the "
            f"median ({max(written):.2f} s at most); the rest is litestream shipping and "
            "following it (each of these imports is an LTX file of about 19 MB: 100 rows "
            "touch pages of every index).",
            "",
            "Requests a second, wrk at 16 connections on the client core, each server on "
            f"the server core, {args.slice} s slices alternating primary and replica. "
            + (
                f"Then the same while the replica applied {BIG_IMPORT_ROWS:,} new applicants "
                f"imported on the primary ({applied_in:.0f} s from the store holding them to "
                "the replica serving them; the follower runs 10 nice levels below the "
                "server, so under wrk's full load it gets little CPU and takes long)."
                if not args.skip_applying
                else "(`--skip-applying`: not measured while a large change is applied.)"
            ),
            "",
            "| case | primary | replica | replica / primary | primary meanwhile | "
            "replica applying | applying / primary |",
            "|---|---|---|---|---|---|---|",
            *rows,
            f"<!-- END {section} -->",
        ]
    )


if __name__ == "__main__":
    main()
