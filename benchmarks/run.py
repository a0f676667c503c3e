"""`make bench`: leasestar's list path under wrk, each case against its floors (issue 4).

What it does, in order:

1. Installs wrk if it is missing (Debian's `wrk`), or says how.
2. Builds databases of 100,000 and 1,000,000 applicants with `leasestar seed` in
   `benchmarks/work/` (reused while they hold the right row count and were built from the
   current schema and generator) and creates two tokens in each: one unscoped, one
   scoped to a single integration.
3. Serves each database as a user would (`leasestar serve`: uvicorn, one worker) pinned
   to core 0 with `taskset`, and drives it with wrk (one thread, 16 connections) pinned to
   core 1: a warm-up, then the measured seconds.
4. Measures the floors in the same run: the *HTTP floor*, a bare Litestar app under the
   same uvicorn settings answering the case's exact body (`floor_app.py`), and the
   *in-process floor*, the same page's SQL and byte assembly with sqlite3 in a loop, no
   HTTP, on the server's core. Composite floor = 1 / (1/HTTP + 1/in-process).
5. Prints every case as a ratio to its floors, checks issue 4's targets, and writes the
   list section of `benchmarks/RESULTS.md`, `benchmarks/list-results.json` and
   `benchmarks/list-bench.png`.

Also: p50 against offset depth; issue 7's cursor walks, the page at a cursor 10%, 50% and
90% deep into the 1,000,000 rows against the first page (`cursor_depth.py`, on the same
1M server; its own section of RESULTS.md); and issue 2's question, one read connection
against a small pool (`LEASESTAR_READ_CONNECTIONS` = 1, 2, 4).

What every benchmark here shares (seeding, servers, tokens, wrk, the machine's
description, writing a section of RESULTS.md) is in `harness.py`.

The machine is shared, so background load comes and goes. Figures that are compared
with each other are therefore measured *interleaved*: every server stays up side by side
on the server core (only the one under load uses it), and a case, its HTTP floor and its
in-process floor take turns in short slices until each has its measured seconds. A
burst of background load then hits all of them alike, and their ratio holds.

`--quick` is for development: 100k rows only, 3 measured seconds per case, no cursor
walks. `--smoke DIR` checks the whole run end to end in about two minutes: every step on
2,000 and 10,000 rows with 1 s slices, every file written below DIR (a copy of
RESULTS.md included), nothing in `benchmarks/` touched.
`--profile` runs py-spy on the server during the list-default and get-by-id cases
instead, and prints where the time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import cursor_depth
import harness
from harness import (
    BENCH,
    BIN,
    CLIENT_CORE,
    CONNECTIONS,
    SERVER_CORE,
    SERVER_ENV,
    UVICORN,
    WrkTarget,
    http_get,
    on_server_core,
    pinned,
    read_only,
    say,
)

WORK = harness.WORK
RESULTS_MD = harness.RESULTS_MD
RESULTS_JSON = BENCH / "list-results.json"
CHART = BENCH / "list-bench.png"
NOTES = BENCH / "list-notes.md"
BEGIN, END = "<!-- BEGIN list -->", "<!-- END list -->"

SCOPED_INTEGRATION = "int_yardi_01"
SMALL, BIG = 100_000, 1_000_000
POOL_SIZES = (1, 2, 4)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Settings:
    sizes: tuple[int, ...]
    slices: int  # each measurement is this many interleaved slices...
    slice_seconds: int  # ...of this many seconds (wrk takes whole seconds)
    warmup: int
    inprocess_seconds: float
    offsets: dict[int, tuple[float, ...]]  # offset depths (fractions of rows) per size
    quick: bool
    cursors: bool  # cursor walks at 10/50/90% depth of the big database (issue 7)

    @property
    def seconds(self) -> int:
        return self.slices * self.slice_seconds


FULL = Settings(
    sizes=(SMALL, BIG),
    slices=5,
    slice_seconds=2,
    warmup=3,
    inprocess_seconds=2.0,
    offsets={SMALL: (0.1, 0.25, 0.5, 0.75), BIG: (0.25, 0.5, 0.75)},
    quick=False,
    cursors=True,
)
QUICK = Settings(
    sizes=(SMALL,),
    slices=3,
    slice_seconds=1,
    warmup=1,
    inprocess_seconds=0.75,
    offsets={SMALL: (0.1, 0.5)},
    quick=True,
    cursors=False,
)
# `--smoke DIR`: every step of a full run, on small databases and 1 s slices, writing
# only below DIR. It proves the harness end to end in about two minutes; its figures
# mean nothing.
SMOKE = Settings(
    sizes=(2_000, 10_000),
    slices=1,
    slice_seconds=1,
    warmup=1,
    inprocess_seconds=0.2,
    offsets={2_000: (0.5,), 10_000: (0.5,)},
    quick=False,
    cursors=True,
)


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One benchmark case: the request, and the same page's SQL for its in-process floor.

    The floor SQL is written here, independently of `leasestar/`, from the contract: it is
    what any implementation must at least run to answer the request.
    """

    key: str
    label: str
    path: str  # path and query string; for by_id, the path the id is appended to
    where: str = ""
    params: tuple[Any, ...] = ()
    order: str = "created_at DESC, id DESC"
    limit: int = 100
    offset: int = 0
    scoped: bool = False
    by_id: bool = False


@dataclass(frozen=True)
class DataFacts:
    """What the cases need to know about one database."""

    rows: int
    window: tuple[int, int]  # updated_at bounds, microseconds, holding ~10% of rows
    window_rows: int
    property_id: str
    property_rows: int
    scoped_rows: int
    ids: list[str]


def iso(micros: int) -> str:
    return (EPOCH + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_cases(facts: DataFacts) -> dict[str, Case]:
    n = facts.rows
    low, high = facts.window
    cases = [
        Case("list_default", "list default", "/v1/applicants"),
        Case("limit_250", "limit=250", "/v1/applicants?limit=250", limit=250),
        Case(
            "offset_90",
            f"offset={int(n * 0.9):,} (90%)",
            f"/v1/applicants?offset={int(n * 0.9)}",
            offset=int(n * 0.9),
        ),
        Case(
            "order_two_keys",
            "order-by=last_name,first_name",
            "/v1/applicants?order-by=last_name:asc,first_name:asc",
            order="last_name ASC, first_name ASC, id ASC",
        ),
        Case(
            "updated_window",
            f"updated_at window ({facts.window_rows / n:.0%} of rows)",
            f"/v1/applicants?updated_at_gte={iso(low)}&updated_at_lte={iso(high)}",
            where="updated_at >= ? AND updated_at <= ?",
            params=(low, high),
        ),
        Case(
            "property_filter",
            f"property_id filter ({facts.property_rows} rows)",
            f"/v1/applicants?property_id={facts.property_id}",
            where="property_id = ?",
            params=(facts.property_id,),
        ),
        Case("get_by_id", "get by random id", "/v1/applicants/", by_id=True),
        Case(
            "scoped_token",
            f"list, token scoped to {SCOPED_INTEGRATION}",
            "/v1/applicants",
            where="integration_id IN (?)",
            params=(SCOPED_INTEGRATION,),
            scoped=True,
        ),
    ]
    return {case.key: case for case in cases}


def offset_case(n: int, fraction: float) -> Case:
    offset = int(n * fraction)
    return Case(
        f"offset_{round(fraction * 100)}",
        f"offset={offset:,} ({fraction:.0%})",
        f"/v1/applicants?offset={offset}",
        offset=offset,
    )


# --------------------------------------------------------------------------- setup


def data_facts(db: Path, rows: int) -> DataFacts:
    """Filter values chosen from the data: a ~10% updated_at window, a median property."""
    with contextlib.closing(read_only(db)) as conn:

        def nth_updated(k: int) -> int:
            return int(
                conn.execute(
                    "SELECT updated_at FROM applicants ORDER BY updated_at LIMIT 1 OFFSET ?", (k,)
                ).fetchone()[0]
            )

        low, high = nth_updated(int(rows * 0.45)), nth_updated(int(rows * 0.55))
        (window_rows,) = conn.execute(
            "SELECT count(*) FROM applicants WHERE updated_at BETWEEN ? AND ?", (low, high)
        ).fetchone()
        by_property = conn.execute(
            "SELECT property_id, count(*) AS c FROM applicants GROUP BY property_id "
            "ORDER BY c, property_id"
        ).fetchall()
        property_id, property_rows = by_property[len(by_property) // 2]
        (scoped_rows,) = conn.execute(
            "SELECT count(*) FROM applicants WHERE integration_id = ?", (SCOPED_INTEGRATION,)
        ).fetchone()
        ids = [row[0] for row in conn.execute("SELECT id FROM applicants")]
    sample = random.Random(0).sample(ids, min(len(ids), 20_000))
    return DataFacts(
        rows, (low, high), window_rows, property_id, property_rows, scoped_rows, sample
    )


@dataclass
class Dataset:
    """One seeded database, with what the benchmark needs of it."""

    rows: int
    db: Path
    facts: DataFacts
    cases: dict[str, Case]
    tokens: dict[bool, str]  # scoped? -> token
    ids_file: Path

    @classmethod
    def prepare(cls, rows: int) -> Dataset:
        db = harness.ensure_database(rows, WORK)
        facts = data_facts(db, rows)
        say(
            f"{rows:,} rows: updated_at window {iso(facts.window[0])}..{iso(facts.window[1])} "
            f"({facts.window_rows:,} rows), {facts.property_id} ({facts.property_rows} rows), "
            f"{SCOPED_INTEGRATION} ({facts.scoped_rows:,} rows)"
        )
        tokens = {
            False: harness.create_token(db, "all"),
            True: harness.create_token(db, "scoped", SCOPED_INTEGRATION),
        }
        ids_file = WORK / f"ids-{rows}.txt"
        ids_file.write_text("\n".join(facts.ids) + "\n")
        return cls(rows, db, facts, build_cases(facts), tokens, ids_file)


# --------------------------------------------------------------------------- servers


def leasestar_server(
    name: str, db: Path, read_connections: int | None = None
) -> contextlib.AbstractContextManager[harness.Server]:
    env = {"LEASESTAR_READ_CONNECTIONS": str(read_connections)} if read_connections else {}
    return harness.leasestar_server(name, db, env, work=WORK)


def floor_server(bodies: Path) -> contextlib.AbstractContextManager[harness.Server]:
    # `leasestar serve` runs uvicorn.run(factory=True, workers=1, log_level="info",
    # access_log=False) with uvicorn's default loop and HTTP parser: the same here.
    command = [
        str(UVICORN),
        "floor_app:create_floor_app",
        "--factory",
        "--app-dir",
        str(BENCH),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--workers",
        "1",
        "--log-level",
        "info",
        "--no-access-log",
    ]
    return harness.server(
        "floor", command, "/floor/tiny", {"BENCH_FLOOR_DIR": str(bodies)}, work=WORK
    )


# --------------------------------------------------------------------------- measuring


def split_meta(body: bytes) -> bytes:
    """The meta object of a response body (the floor splices it exactly as served)."""
    return body[len(b'{"meta":') : body.index(b',"results":')]


class InProcessFloor:
    """The case's page read and byte assembly with sqlite3 in a loop: pages per second.

    The floor is the fastest way found to produce the served bytes, so every variant's
    bytes must equal the served body. Plans: the plain statement (SQLite's planner
    chooses the index); for a filtered case, the ordering's index walked with the filter
    applied row by row (`+column` keeps the filter off its index); and, for a filter or
    an offset on the default order, a keyset seek to the page's first row, whose sort key
    is looked up once beforehand (as a cache of such anchors would). Assembly: rows
    joined in Python or SQLite's `group_concat`, each as text (decoded, then encoded
    again) or as the stored UTF-8 bytes (`CAST(... AS BLOB)`). The best plan is picked
    first, then the best assembly.
    """

    def __init__(self, db: Path, case: Case, body: bytes, ids: list[str]) -> None:
        self.name = f"in-process {case.key}"
        self._conn = read_only(db)
        self._ids = ids
        self._picks: Iterator[str] = iter(())
        meta = split_meta(body)
        if case.by_id:
            variants = self._by_id_variants(b'{"meta":' + meta + b',"results":')
        else:
            head, tail = b'{"meta":' + meta + b',"results":[', b"]}"
            plans = self._plans(case)
            with on_server_core():
                plan_rates = {
                    name: self._trial(
                        self._assemblies(head, tail, *plan)["group_concat, blob"], body
                    )
                    for name, plan in plans.items()
                }
            best_plan = max(plan_rates, key=plan_rates.__getitem__)
            variants = {
                f"{best_plan}; {name}": produce
                for name, produce in self._assemblies(head, tail, *plans[best_plan]).items()
            }
        with on_server_core():
            trials = {name: self._trial(produce, body) for name, produce in variants.items()}
        self.variant = max(trials, key=trials.__getitem__)
        self._produce = variants[self.variant]
        self.calls = 0
        self.elapsed = 0.0

    def _plans(self, case: Case) -> dict[str, tuple[str, tuple[Any, ...]]]:
        """Plan name -> (page SQL selecting {column}, its parameters)."""
        tail = f"ORDER BY {case.order} LIMIT ? OFFSET ?"
        filters = {"": case.where}
        if case.where:
            filters["order walk"] = re.sub(
                r"\b(updated_at|property_id|integration_id)\b", r"+\1", case.where
            )
        plans = {}
        for name, where in filters.items():
            clause = f"WHERE {where}" if where else ""
            plans[name or "plain"] = (
                f"SELECT {{column}} FROM applicants {clause} {tail}",
                (*case.params, case.limit, case.offset),
            )
            if case.order != "created_at DESC, id DESC" or not (case.where or case.offset):
                continue
            anchor = self._conn.execute(
                f"SELECT created_at, id FROM applicants {clause} {tail}",
                (*case.params, 1, case.offset),
            ).fetchone()
            if anchor is not None:
                seek = f"{where} AND " if where else ""
                plans[f"{name or 'plain'}, keyset seek"] = (
                    f"SELECT {{column}} FROM applicants WHERE {seek}(created_at, id) <= (?, ?) "
                    f"{tail}",
                    (*case.params, *anchor, case.limit, 0),
                )
        return plans

    def _assemblies(
        self, head: bytes, tail: bytes, template: str, params: tuple[Any, ...]
    ) -> dict[str, Callable[[], bytes]]:
        conn = self._conn
        text_rows = template.format(column="body")
        blob_rows = template.format(column="CAST(body AS BLOB)")
        joined = "coalesce(group_concat(body, ','), '')"
        text_concat = f"SELECT {joined} FROM ({text_rows})"
        blob_concat = f"SELECT CAST({joined} AS BLOB) FROM ({text_rows})"

        def rows_text() -> bytes:
            text = ",".join([row[0] for row in conn.execute(text_rows, params)])
            return b"".join((head, text.encode(), tail))

        def rows_blob() -> bytes:
            rows = [row[0] for row in conn.execute(blob_rows, params)]
            return b"".join((head, b",".join(rows), tail))

        def concat_text() -> bytes:
            (text,) = conn.execute(text_concat, params).fetchone()
            return b"".join((head, text.encode(), tail))

        def concat_blob() -> bytes:
            (blob,) = conn.execute(blob_concat, params).fetchone()
            return b"".join((head, blob, tail))

        return {
            "rows+join, text": rows_text,
            "rows+join, blob": rows_blob,
            "group_concat, text": concat_text,
            "group_concat, blob": concat_blob,
        }

    def _by_id_variants(self, head: bytes) -> dict[str, Callable[[], bytes]]:
        conn = self._conn

        def by_id_text() -> bytes:
            (text,) = conn.execute(
                "SELECT body FROM applicants WHERE id = ?", (self._next_id(),)
            ).fetchone()
            return b"".join((head, text.encode(), b"}"))

        def by_id_blob() -> bytes:
            (blob,) = conn.execute(
                "SELECT CAST(body AS BLOB) FROM applicants WHERE id = ?", (self._next_id(),)
            ).fetchone()
            return b"".join((head, blob, b"}"))

        return {"row, text": by_id_text, "row, blob": by_id_blob}

    def _trial(self, produce: Callable[[], bytes], body: bytes) -> float:
        """A short timing of one variant, after checking it makes the served bytes."""
        self._picks = iter(())  # by id: the first id is the one whose body was served
        if produce() != body:
            raise RuntimeError(f"{self.name}: a floor variant differs from the served body")
        calls, elapsed = loop(produce, 0.15)
        return calls / elapsed

    def _next_id(self) -> str:
        try:
            return next(self._picks)
        except StopIteration:
            self._picks = iter(self._ids)
            return next(self._picks)

    def run(self, seconds: float) -> None:
        with on_server_core():
            calls, elapsed = loop(self._produce, seconds)
        self.calls += calls
        self.elapsed += elapsed

    @property
    def rate(self) -> float:
        return self.calls / self.elapsed if self.elapsed else 0.0

    def close(self) -> None:
        self._conn.close()


def loop(produce: Callable[[], bytes], seconds: float) -> tuple[int, float]:
    """(calls, elapsed) of `produce` called for at least `seconds`, after one warm call."""
    produce()
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        produce()
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls, now - start


def interleave(
    settings: Settings, wrk_targets: list[WrkTarget], floors: list[InProcessFloor]
) -> None:
    """Warm every target up, then measure them in turns, slice by slice."""
    for target in wrk_targets:
        target.run(settings.warmup, keep=False)
    for _ in range(settings.slices):
        for target in wrk_targets:
            target.run(settings.slice_seconds)
        for floor in floors:
            floor.run(settings.inprocess_seconds / settings.slices)


def check_body(db: Path, case: Case, body: bytes) -> list[str]:
    """`meta.total` and the page length against a direct count: wrong answers void a run."""
    document = json.loads(body)
    if case.by_id:
        return [] if document["meta"]["total"] == 1 else [f"{case.key}: meta.total != 1"]
    with contextlib.closing(read_only(db)) as conn:
        where = f"WHERE {case.where}" if case.where else ""
        (total,) = conn.execute(f"SELECT count(*) FROM applicants {where}", case.params).fetchone()
    problems = []
    if document["meta"]["total"] != total:
        problems.append(f"{case.key}: meta.total {document['meta']['total']} != count {total}")
    expected = max(0, min(case.limit, total - case.offset))
    if len(document["results"]) != expected:
        problems.append(f"{case.key}: {len(document['results'])} results, expected {expected}")
    return problems


# --------------------------------------------------------------------------- results


@dataclass
class CaseResult:
    case: Case
    rows: int
    body_bytes: int = 0
    served: harness.Measured | None = None
    http_floor: harness.Measured | None = None
    inprocess_rps: float | None = None
    inprocess_variant: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def composite(self) -> float | None:
        if self.http_floor is None or not self.http_floor.rps or not self.inprocess_rps:
            return None
        return 1 / (1 / self.http_floor.rps + 1 / self.inprocess_rps)

    @property
    def ratio(self) -> float | None:
        composite = self.composite
        return self.served.rps / composite if self.served and composite else None

    def line(self) -> str:
        m = self.served
        assert m is not None
        text = (
            f"{self.rows:>9,} {self.case.label:<38} {m.rps:7.0f} req/s  p50 {m.p50_ms:7.2f} ms  "
            f"p99 {m.p99_ms:7.2f} ms  {self.body_bytes:>7,} B"
        )
        if self.http_floor:
            text += f" | HTTP floor {self.http_floor.rps:6.0f}"
        if self.inprocess_rps:
            text += f" | in-process {self.inprocess_rps:6.0f} ({self.inprocess_variant})"
        if self.ratio:
            text += f" | {self.ratio:.2f}x composite"
        return text


@dataclass
class Run:
    """Everything measured, as the report needs it."""

    cases: dict[int, list[CaseResult]] = field(default_factory=dict)
    depth: dict[int, list[CaseResult]] = field(default_factory=dict)
    scale: list[CaseResult] = field(default_factory=list)  # 100k and 1M, interleaved
    pool: list[dict[str, Any]] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)
    cursors: cursor_depth.Walk | None = None  # on the big database, in a full run


def served_once(base: str, dataset: Dataset, case: Case) -> tuple[bytes, list[str]]:
    url = base + case.path + (dataset.facts.ids[0] if case.by_id else "")
    status, body = http_get(url, dataset.tokens[case.scoped])
    if status != 200:
        raise RuntimeError(f"{case.key}: HTTP {status}: {body[:300]!r}")
    problems = check_body(dataset.db, case, body)
    for problem in problems:
        say(f"  !! {problem}")
    return body, problems


def target_for(base: str, dataset: Dataset, case: Case, name: str) -> WrkTarget:
    return WrkTarget(
        name,
        base + case.path + (dataset.facts.ids[0] if case.by_id else ""),
        dataset.tokens[case.scoped],
        dataset.ids_file if case.by_id else None,
    )


def measure_cases(
    settings: Settings,
    dataset: Dataset,
    base: str,
    cases: list[Case],
    floor_base: str | None,
    floor_dir: Path | None,
) -> list[CaseResult]:
    """Each case interleaved with its HTTP floor (when a floor server runs) and in-process floor."""
    results = []
    for case in cases:
        result = CaseResult(case, dataset.rows)
        body, result.notes = served_once(base, dataset, case)
        result.body_bytes = len(body)
        served = target_for(base, dataset, case, f"{dataset.rows} {case.key}")
        targets = [served]
        http = None
        if floor_base and floor_dir and (floor_dir / f"{case.key}.json").exists():
            http = WrkTarget(f"HTTP floor {case.key}", f"{floor_base}/floor/{case.key}")
            targets.append(http)
        floor = InProcessFloor(dataset.db, case, body, dataset.facts.ids)
        try:
            interleave(settings, targets, [floor])
        finally:
            floor.close()
        result.served = served.measured()
        result.http_floor = http.measured() if http else None
        result.inprocess_rps, result.inprocess_variant = floor.rate, floor.variant
        say(result.line())
        results.append(result)
    return results


def run_benchmark(settings: Settings) -> Run:
    run = Run()
    small = Dataset.prepare(SMALL)
    big = Dataset.prepare(BIG) if BIG in settings.sizes else None
    floor_dir = WORK / "floor-bodies"
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(leasestar_server("leasestar-100k", small.db)).base
        # The HTTP floor answers each case's exact body, so fetch them first.
        shutil.rmtree(floor_dir, ignore_errors=True)
        floor_dir.mkdir(parents=True)
        for case in small.cases.values():
            body, _ = served_once(base, small, case)
            (floor_dir / f"{case.key}.json").write_bytes(body)
        floor_base = stack.enter_context(floor_server(floor_dir)).base
        big_base = (
            stack.enter_context(leasestar_server("leasestar-1m", big.db)).base if big else None
        )

        say(f"{SMALL:,} rows: every case against its floors")
        run.cases[SMALL] = measure_cases(
            settings, small, base, list(small.cases.values()), floor_base, floor_dir
        )
        tiny = WrkTarget("HTTP floor, 2-byte body", f"{floor_base}/floor/tiny")
        gzip = target_for(base, small, small.cases["list_default"], "list default, gzip")
        gzip.headers = ("Accept-Encoding: gzip",)
        interleave(settings, [tiny, gzip], [])
        gzip_bytes = gzip.measured().wire_bytes
        for target, note in (
            (tiny, "a bare Litestar app answering a 2-byte body"),
            (
                gzip,
                "list default with Accept-Encoding: gzip (what browsers and most HTTP "
                f"clients send); {gzip_bytes:,.0f} B per response on the wire",
            ),
        ):
            m = target.measured()
            run.extras.append({"name": target.name, "note": note, **asdict(m)})
            say(
                f"  {target.name}: {m.rps:7.0f} req/s  p50 {m.p50_ms:.2f} ms  p99 {m.p99_ms:.2f} ms"
            )

        if big and big_base:
            say(f"{BIG:,} rows against {SMALL:,}, interleaved")
            by_key = {r.case.key: r for r in run.cases[SMALL]}
            paired = CaseResult(
                small.cases["list_default"], SMALL, by_key["list_default"].body_bytes
            )
            big_results = [
                CaseResult(big.cases[key], BIG)
                for key in ("list_default", "offset_90", "get_by_id")
            ]
            targets = [target_for(base, small, paired.case, "100k list_default")]
            floors = []
            for result in big_results:
                body, result.notes = served_once(big_base, big, result.case)
                result.body_bytes = len(body)
                targets.append(target_for(big_base, big, result.case, f"1m {result.case.key}"))
                floors.append(InProcessFloor(big.db, result.case, body, big.facts.ids))
            try:
                interleave(settings, targets, floors)
            finally:
                for floor in floors:
                    floor.close()
            paired.served = targets[0].measured()
            for result, target, floor in zip(big_results, targets[1:], floors, strict=True):
                result.served = target.measured()
                result.inprocess_rps, result.inprocess_variant = floor.rate, floor.variant
                # The HTTP floor depends on the body's size only; offset 90% differs.
                if result.case.key in by_key and result.case.key != "offset_90":
                    result.http_floor = by_key[result.case.key].http_floor
            run.cases[BIG] = big_results
            run.scale = [paired, *big_results]
            for result in run.scale:
                say(result.line())

        for dataset, dataset_base in ((small, base), (big, big_base)):
            if dataset is None or dataset_base is None:
                continue
            say(f"{dataset.rows:,} rows: p50 against offset depth")
            cases = [offset_case(dataset.rows, f) for f in settings.offsets[dataset.rows]]
            measured = measure_cases(settings, dataset, dataset_base, cases, None, None)
            known = {r.case.key: r for r in run.cases[dataset.rows]}
            run.depth[dataset.rows] = sorted(
                [known["list_default"], known["offset_90"], *measured], key=lambda r: r.case.offset
            )

        if settings.cursors and big and big_base:
            say(f"{BIG:,} rows: cursor walks at 10%, 50% and 90% depth (issue 7)")
            started = time.monotonic()
            run.cursors = cursor_depth.walk(
                big.db,
                BIG,
                big_base,
                big.tokens[False],
                slices=settings.slices,
                slice_seconds=settings.slice_seconds,
                warmup=settings.warmup,
            )
            say(
                f"cursor walks took {time.monotonic() - started:.0f} s: p50 at 90% depth "
                f"{run.cursors.ratio:.2f}x the first page's (needs <= {cursor_depth.TARGET}x)"
            )

    say(f"{SMALL:,} rows: one read connection or a pool (LEASESTAR_READ_CONNECTIONS)")
    with contextlib.ExitStack() as stack:
        bases = {
            size: stack.enter_context(leasestar_server(f"pool-{size}", small.db, size)).base
            for size in POOL_SIZES
        }
        for key in ("list_default", "get_by_id"):
            case = small.cases[key]
            targets = [
                target_for(bases[size], small, case, f"pool {size} {key}") for size in POOL_SIZES
            ]
            interleave(settings, targets, [])
            for size, target in zip(POOL_SIZES, targets, strict=True):
                m = target.measured()
                run.pool.append({"read_connections": size, "case": key, **asdict(m)})
                say(
                    f"  read connections {size}: {case.label:<18} {m.rps:7.0f} req/s  "
                    f"p50 {m.p50_ms:6.2f} ms  p99 {m.p99_ms:6.2f} ms"
                )
    return run


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    name: str
    measured: float
    need: float

    @property
    def passed(self) -> bool:
        return self.measured >= self.need

    def verdict(self) -> str:
        if self.passed:
            return "PASS"
        if self.measured <= 0:
            return "MISS (nothing served)"
        return f"MISS ({(self.need - self.measured) / self.need:.0%} short)"


def evaluate(run: Run) -> list[Target]:
    targets: list[Target] = []
    by_key = {r.case.key: r for r in run.cases[SMALL]}
    for key, need in (("list_default", 0.7), ("limit_250", 0.7), ("get_by_id", 0.5)):
        ratio = by_key[key].ratio
        if ratio is not None:
            targets.append(Target(f"{by_key[key].case.label} vs its composite floor", ratio, need))
    base = by_key["list_default"].served
    assert base is not None
    for key in ("updated_window", "property_filter", "order_two_keys", "scoped_token"):
        served = by_key[key].served
        assert served is not None
        targets.append(
            Target(f"{by_key[key].case.label} vs list default", served.rps / base.rps, 0.5)
        )
    if run.scale:
        paired, big_default, big_deep = run.scale[0], run.scale[1], run.scale[2]
        assert paired.served
        assert big_default.served
        assert big_deep.served
        targets.append(
            Target(
                f"list default at {BIG:,} rows vs at {SMALL:,} (interleaved)",
                big_default.served.rps / paired.served.rps,
                0.85,
            )
        )
        targets.append(
            Target(
                f"offset 90% at {BIG:,} rows vs offset 0",
                big_deep.served.rps / big_default.served.rps,
                0.2,
            )
        )
    return targets


# --------------------------------------------------------------------------- report


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def case_table(results: list[CaseResult], with_rows: bool = False) -> list[str]:
    lines = [
        ("| rows " if with_rows else "")
        + "| case | req/s | p50 ms | p99 ms | body B | wire B/resp | in-process /s "
        "| HTTP floor /s | composite /s | x composite |",
        ("|---:" if with_rows else "") + "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        m = r.served
        assert m is not None
        lines.append(
            (f"| {r.rows:,} " if with_rows else "")
            + f"| {r.case.label} | {fmt(m.rps)} | {m.p50_ms:.2f} | {m.p99_ms:.2f} | "
            f"{r.body_bytes:,} | {m.wire_bytes:,.0f} | {fmt(r.inprocess_rps)} | "
            f"{fmt(r.http_floor.rps if r.http_floor else None)} | {fmt(r.composite)} | "
            f"{fmt(r.ratio, 2)} |"
        )
    return lines


def markdown(report: dict[str, Any], run: Run, targets: list[Target]) -> str:
    s = report["settings"]
    server_env = ", ".join(f"`{k}={v}`" for k, v in SERVER_ENV.items())
    lines = [
        BEGIN,
        "## List path against its floors (issue 4)",
        "",
        f"Run {report['when']} on commit `{report['commit']}` with `{report['command']}`: "
        f"{s['seconds']} measured seconds per case ({s['slices']} interleaved slices of "
        f"{s['slice_seconds']} s) after a {s['warmup']} s warm-up, every process at nice "
        f"{s['nice']}; {report['elapsed']}.",
        "",
        "**Machine**: "
        + ", ".join(f"{k} {v}" for k, v in report["machine"].items())
        + f"; load average {report['load_before']} before, {report['load_after']} after. "
        "The machine is shared with other work, and that work takes CPU from wrk as well "
        "as from the server: the fast floors sink first, so only a quiet run's ratios "
        "count (HTTP floor near 7,000 req/s for a 216 KB body).",
        "",
        "**Versions**: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".",
        "",
        f"**Method**: `leasestar serve` (uvicorn, one worker; its defaults, with {server_env}) "
        f"pinned to core {SERVER_CORE}; wrk (`-t1 -c{CONNECTIONS}`, `benchmarks/wrk.lua`, "
        f"random ids for get by id) pinned to core {CLIENT_CORE}. *HTTP floor*: "
        "`benchmarks/floor_app.py`, a bare Litestar app under the same uvicorn settings "
        "answering the case's exact body. *In-process floor*: the page read and the byte "
        "assembly with sqlite3 in a loop on the server core, SQL written in `run.py` from "
        "the contract (not taken from `leasestar/`); the fastest of several plans (the plain "
        "statement; for filters, the order's index walked with `+column`; for filters and "
        "offsets on the default order, a keyset seek to an anchor looked up once, as a "
        "cache of anchors would) and assemblies (rows+join or group_concat, as text or as "
        "stored bytes), each checked byte-equal to the served body. "
        "*Composite* = 1/(1/HTTP + 1/in-process). A case, its HTTP floor and its "
        "in-process floor are measured in alternating slices, so background load hits them "
        "alike. Every case's `meta.total` and page length are checked against a direct "
        "`count(*)` first. Bytes: body (for get by id, of the first id; ids are random), "
        "and bytes read per response, headers included, averaged over the run.",
        "",
        f"### {SMALL:,} applicants",
        "",
        *case_table(run.cases[SMALL]),
        "",
    ]
    for extra in run.extras:
        lines.append(
            f"- {extra['name']}: {extra['rps']:,.0f} req/s, p50 {extra['p50_ms']:.2f} ms, "
            f"p99 {extra['p99_ms']:.2f} ms ({extra['note']})."
        )
    if run.scale:
        lines += [
            "",
            f"### {BIG:,} applicants, interleaved with {SMALL:,}",
            "",
            "The 100k list default is measured again here, in turns with the 1M cases, so "
            "the scale ratio compares like with like. The 1M cases' HTTP floors are the "
            "100k ones (same body sizes).",
            "",
            *case_table(run.scale, with_rows=True),
        ]
    lines += [
        "",
        "### Targets (issue 4 item 3)",
        "",
        "| target | measured | needs | verdict |",
        "|---|---:|---:|---|",
    ]
    for t in targets:
        lines.append(f"| {t.name} | {t.measured:.2f}x | >= {t.need:.2f}x | {t.verdict()} |")
    lines += [
        "",
        "`meta.total` exact at steady state and right after an import is proved by the "
        "test suite (issue 4 item 4); this run checks each measured case's total against "
        "a direct count.",
        "",
        "### p50 against offset depth (default order, created_at desc)",
        "",
        "| rows | offset | req/s | p50 ms | p99 ms | in-process pages/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for rows, series in run.depth.items():
        for r in series:
            m = r.served
            assert m is not None
            lines.append(
                f"| {rows:,} | {r.case.offset:,} | {m.rps:,.0f} | {m.p50_ms:.2f} | "
                f"{m.p99_ms:.2f} | {fmt(r.inprocess_rps)} |"
            )
    lines += [
        "",
        "### One read connection or a pool (issue 2)",
        "",
        f"`LEASESTAR_READ_CONNECTIONS`, {SMALL:,} rows, the three servers measured in turns.",
        "",
        "| read connections | case | req/s | p50 ms | p99 ms |",
        "|---:|---|---:|---:|---:|",
    ]
    for p in run.pool:
        lines.append(
            f"| {p['read_connections']} | {p['case']} | {p['rps']:,.0f} | "
            f"{p['p50_ms']:.2f} | {p['p99_ms']:.2f} |"
        )
    notes = [n for rs in run.cases.values() for r in rs for n in r.notes]
    if notes:
        lines += ["", "**Correctness problems seen during the run**: " + "; ".join(notes)]
    if NOTES.exists():
        # Hand-written analysis of a run (profile, misses, suggestions): kept with the figures.
        lines += ["", NOTES.read_text().rstrip("\n")]
    lines += [
        "",
        f"![each case against its floors; p50 against offset depth]({CHART.name})",
        "",
        END,
    ]
    return "\n".join(lines)


def chart(run: Run, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [r for r in run.cases[SMALL] if r.served is not None]
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(15, 6.5), gridspec_kw={"width_ratios": [3, 2]}
    )
    positions = list(range(len(cases)))
    height = 0.2
    series = [
        ("served", [r.served.rps if r.served else 0 for r in cases], "#1f77b4"),
        ("composite floor", [r.composite or 0 for r in cases], "#ff7f0e"),
        ("HTTP floor", [r.http_floor.rps if r.http_floor else 0 for r in cases], "#bbbbbb"),
        ("in-process floor", [r.inprocess_rps or 0 for r in cases], "#777777"),
    ]
    for i, (name, values, color) in enumerate(series):
        left.barh(
            [p + (i - 1.5) * height for p in positions], values, height, label=name, color=color
        )
    for p, r in zip(positions, cases, strict=True):
        if r.served and r.ratio:
            left.text(
                r.served.rps * 1.08,
                p - 1.5 * height,
                f"{r.ratio:.2f}x",
                va="center",
                fontsize=8,
            )
    left.set_yticks(positions, [r.case.label for r in cases])
    left.invert_yaxis()
    left.set_xscale("log")
    left.set_xlabel("requests (or pages) per second, log scale")
    left.set_title(f"{SMALL:,} applicants: each case against its floors (x = of composite)")
    left.legend(loc="lower right", fontsize=8)
    left.grid(axis="x", alpha=0.3)

    for rows, series_results in sorted(run.depth.items()):
        points = [
            (r.case.offset / rows * 100, r.served.p50_ms, r.inprocess_rps)
            for r in series_results
            if r.served is not None
        ]
        drawn = right.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            label=f"served p50, {rows:,} rows ({CONNECTIONS} connections)",
        )
        right.plot(
            [p[0] for p in points if p[2]],
            [1000 / p[2] for p in points if p[2]],
            linestyle="--",
            color=drawn[0].get_color(),
            alpha=0.6,
            label=f"in-process time per page, {rows:,} rows",
        )
    right.set_yscale("log")
    right.set_xlabel("offset, % of rows (created_at desc)")
    right.set_ylabel("ms, log scale")
    right.set_title("p50 against offset depth")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(CHART, dpi=110)
    plt.close(figure)


def serialise(report: dict[str, Any], run: Run, targets: list[Target]) -> dict[str, Any]:
    def one(r: CaseResult) -> dict[str, Any]:
        return {
            "case": r.case.key,
            "label": r.case.label,
            "path": r.case.path,
            "rows": r.rows,
            "body_bytes": r.body_bytes,
            "served": asdict(r.served) if r.served else None,
            "http_floor_rps": r.http_floor.rps if r.http_floor else None,
            "inprocess_rps": r.inprocess_rps,
            "inprocess_variant": r.inprocess_variant,
            "composite_rps": r.composite,
            "ratio_to_composite": r.ratio,
            "notes": r.notes,
        }

    return {
        **report,
        "cases": {str(rows): [one(r) for r in rs] for rows, rs in run.cases.items()},
        "scale": [one(r) for r in run.scale],
        "offset_depth": {str(rows): [one(r) for r in rs] for rows, rs in run.depth.items()},
        "pool": run.pool,
        "extras": run.extras,
        "targets": [{**asdict(t), "passed": t.passed} for t in targets],
        "cursors": run.cursors.summary() if run.cursors else None,
    }


def print_table(run: Run, targets: list[Target]) -> None:
    print()
    for results in (run.cases[SMALL], run.scale):
        for r in results:
            print(r.line())
    if run.cursors:
        print()
        print("\n".join(run.cursors.lines()))
    print()
    for t in targets:
        print(f"  {t.verdict():<26} {t.name}: {t.measured:.2f}x (needs >= {t.need:.2f}x)")
    print()


# --------------------------------------------------------------------------- profile


def profile(settings: Settings) -> None:
    """py-spy on the served list-default and get-by-id cases: where a request's time goes."""
    spy = BIN / "py-spy"
    if not spy.exists():
        subprocess.run(
            [str(BIN / "python"), "-m", "pip", "install", "--quiet", "py-spy"], check=True
        )
    dataset = Dataset.prepare(SMALL)
    seconds = settings.seconds
    with leasestar_server("profile", dataset.db) as served:
        base, pid = served.base, served.pid
        for key in ("list_default", "get_by_id"):
            target = target_for(base, dataset, dataset.cases[key], key)
            target.run(settings.warmup, keep=False)
            out = WORK / f"profile-{key}.txt"
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


# --------------------------------------------------------------------------- main


def redirect_to(directory: Path) -> None:
    """`--smoke DIR`: the sizes of `SMOKE`, and every file the run writes below DIR (the
    databases and logs in DIR/work, a copy of RESULTS.md updated in place, the JSON and
    the chart); `benchmarks/` is only read."""
    global WORK, RESULTS_MD, RESULTS_JSON, CHART, SMALL, BIG
    directory.mkdir(parents=True, exist_ok=True)
    WORK = directory / "work"
    RESULTS_MD = directory / RESULTS_MD.name
    if not RESULTS_MD.exists():
        shutil.copyfile(harness.RESULTS_MD, RESULTS_MD)
    RESULTS_JSON = directory / RESULTS_JSON.name
    CHART = directory / CHART.name
    SMALL, BIG = SMOKE.sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="leasestar's list path against its floors")
    parser.add_argument("--quick", action="store_true", help="100k rows only, 3 s per case")
    parser.add_argument("--profile", action="store_true", help="py-spy the server instead")
    parser.add_argument(
        "--smoke",
        type=Path,
        metavar="DIR",
        help="every step on 2k and 10k rows, 1 s slices, writing only below DIR",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    command = "make bench" + (" BENCH_ARGS=--quick" if args.quick else "")
    if args.smoke:
        redirect_to(args.smoke.resolve())
        settings = SMOKE
        command = f"python benchmarks/run.py --smoke {args.smoke}"
    priority = harness.raise_priority()
    harness.ensure_wrk()
    WORK.mkdir(parents=True, exist_ok=True)
    if args.profile:
        profile(settings)
        return 0
    started = time.monotonic()
    for rows in settings.sizes:
        harness.ensure_database(rows, WORK)  # all seeding first: it must not overlap a measurement
    report: dict[str, Any] = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": harness.git_commit(),
        "command": command,
        "machine": harness.machine(),
        "versions": harness.versions(),
        "load_before": harness.loadavg(),
        "settings": {
            "seconds": settings.seconds,
            "slices": settings.slices,
            "slice_seconds": settings.slice_seconds,
            "warmup": settings.warmup,
            "quick": settings.quick,
            "nice": priority,
        },
    }
    measuring = time.monotonic()
    run = run_benchmark(settings)
    report["load_after"] = harness.loadavg()
    report["elapsed"] = (
        f"measuring took {(time.monotonic() - measuring) / 60:.1f} min, "
        f"the whole run {(time.monotonic() - started) / 60:.1f} min"
    )
    targets = evaluate(run)
    print_table(run, targets)
    harness.write_section(markdown(report, run, targets), RESULTS_MD)
    if run.cursors:
        harness.write_section(cursor_depth.markdown(run.cursors, command), RESULTS_MD)
    RESULTS_JSON.write_text(json.dumps(serialise(report, run, targets), indent=1) + "\n")
    chart(run, f"leasestar {report['commit']}, {report['when']}: {report['command']}")
    sections = "list and cursors sections" if run.cursors else "list section"
    say(
        f"wrote the {sections} of {harness.shown(RESULTS_MD)}, {harness.shown(RESULTS_JSON)} "
        f"and {harness.shown(CHART)}; {report['elapsed']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
