"""The list benchmark's cases, as data: run settings, the requests, and the data they need."""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import databases
from databases import read_only
from harness import WORK, get_ok, say

SCOPED_INTEGRATION = "int_mri_01"
# wrk stops with requests in flight, which the server still answers (a zstd page up to
# 0.3 s at p99): the next slice starts this much later, not sharing its start with them.
SETTLE_SECONDS = 0.5
SMALL, BIG = 100_000, 1_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Settings:
    sizes: tuple[int, ...]
    slices: int  # each measurement is this many interleaved slices...
    slice_seconds: int  # ...of this many seconds (wrk takes whole seconds)
    warmup: int
    inprocess_seconds: float
    offsets: dict[int, tuple[float, ...]]  # offset depths (fractions of rows) per size
    cursors: bool  # cursor walks at 10/50/90% depth of the big database (issue 7)
    cursor_pages: int  # distinct cursor pages collected for the clients' cursor walk
    pool: bool = True  # issue 2's question, one read connection or a pool (settled: not quick)

    @property
    def seconds(self) -> int:
        return self.slices * self.slice_seconds

    @property
    def small(self) -> int:  # the database every case runs on
        return self.sizes[0]

    @property
    def big(self) -> int | None:  # the scale, depth and cursor cases' (None: not this run)
        return self.sizes[1] if len(self.sizes) > 1 else None


FULL = Settings(
    (SMALL, BIG), 5, 2, 3, 2.0, {SMALL: (0.1, 0.25, 0.5, 0.75), BIG: (0.25, 0.5, 0.75)}, True, 3_000
)
QUICK = Settings((SMALL,), 3, 1, 1, 0.75, {SMALL: (0.1, 0.5)}, False, 500, False)
# `--smoke DIR`: every step of a full run, on small databases, in about two minutes.
SMOKE = Settings((2_000, 10_000), 1, 1, 1, 0.2, {2_000: (0.5,), 10_000: (0.5,)}, True, 100)


@dataclass(frozen=True)
class Case:
    """One request, and its page's SQL for the in-process floor, written from the contract."""

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


def iso(micros: int) -> str:
    return (EPOCH + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_cases(data: Dataset) -> dict[str, Case]:
    n, (low, high), path = data.rows, data.window, "/v1/applicants"
    window = f"{path}?updated_at_gte={iso(low)}&updated_at_lte={iso(high)}"
    cases = [
        Case("list_default", "list default", path),
        Case("limit_250", "limit=250", f"{path}?limit=250", limit=250),
        offset_case(n, 0.9, "offset_90"),
        Case("order_two_keys", "order-by=last_name,first_name",
             f"{path}?order-by=last_name:asc,first_name:asc",
             order="last_name ASC, first_name ASC, id ASC"),
        Case("updated_window", f"updated_at window ({data.window_rows / n:.0%} of rows)", window,
             where="updated_at >= ? AND updated_at <= ?", params=(low, high)),
        Case("property_filter", f"property_id filter ({data.property_rows} rows)",
             f"{path}?property_id={data.property_id}", where="property_id = ?",
             params=(data.property_id,)),
        Case("get_by_id", "get by random id", f"{path}/", by_id=True),
        Case("scoped_token", f"list, token scoped to {SCOPED_INTEGRATION}", path,
             where="integration_id IN (?)", params=(SCOPED_INTEGRATION,), scoped=True),
    ]  # fmt: skip
    return {case.key: case for case in cases}


def offset_case(n: int, fraction: float, key: str = "") -> Case:
    offset = int(n * fraction)
    label = f"offset={offset:,} ({fraction:.0%})"
    key = key or f"offset_{round(fraction * 100)}"
    return Case(key, label, f"/v1/applicants?offset={offset}", offset=offset)


@dataclass
class Dataset:
    """A seeded database, the filter values its cases use (chosen from its data: a ~10%
    updated_at window, a median property), its tokens and cases."""

    rows: int
    db: Path
    window: tuple[int, int]  # updated_at bounds, microseconds
    window_rows: int
    property_id: str
    property_rows: int
    ids: list[str]  # a sample, for get by random id
    ids_file: Path
    tokens: dict[bool, str]  # scoped? -> token
    cases: dict[str, Case] = field(default_factory=dict)

    @classmethod
    def prepare(cls, rows: int, work: Path = WORK) -> Dataset:
        db = databases.ensure_database(rows, work)
        with contextlib.closing(read_only(db)) as conn:

            def nth_updated(k: int) -> int:
                sql = "SELECT updated_at FROM applicants ORDER BY updated_at LIMIT 1 OFFSET ?"
                return int(conn.execute(sql, (k,)).fetchone()[0])

            low, high = nth_updated(int(rows * 0.45)), nth_updated(int(rows * 0.55))
            (window_rows,) = conn.execute(
                "SELECT count(*) FROM applicants WHERE updated_at BETWEEN ? AND ?", (low, high)
            ).fetchone()
            by_property = conn.execute(
                "SELECT property_id, count(*) AS c FROM applicants GROUP BY property_id "
                "ORDER BY c, property_id"
            ).fetchall()
            (scoped_rows,) = conn.execute(
                "SELECT count(*) FROM applicants WHERE integration_id = ?", (SCOPED_INTEGRATION,)
            ).fetchone()
            ids = [row[0] for row in conn.execute("SELECT id FROM applicants")]
        property_id, property_rows = by_property[len(by_property) // 2]
        say(
            f"{rows:,} rows: updated_at window {iso(low)}..{iso(high)} ({window_rows:,} rows), "
            f"{property_id} ({property_rows} rows), {SCOPED_INTEGRATION} ({scoped_rows:,} rows)"
        )
        sample = random.Random(0).sample(ids, min(len(ids), 20_000))
        ids_file = work / f"ids-{rows}.txt"
        ids_file.write_text("\n".join(sample) + "\n")
        tokens = {
            False: databases.create_token(db, "all"),
            True: databases.create_token(db, "scoped", SCOPED_INTEGRATION),
        }
        found = cls(
            rows, db, (low, high), window_rows, property_id, property_rows, sample, ids_file, tokens
        )
        found.cases = build_cases(found)
        return found


def check_body(db: Path, case: Case, body: bytes) -> list[str]:
    """`meta.total` against a direct count, the page against the SQL page at its offset
    (its ids, `meta.offset`, `meta.next` where more follow): wrong answers void a run."""
    document = json.loads(body)
    if case.by_id:
        return [] if document["meta"]["total"] == 1 else [f"{case.key}: meta.total != 1"]
    with contextlib.closing(read_only(db)) as conn:
        where = f"WHERE {case.where}" if case.where else ""
        (total,) = conn.execute(f"SELECT count(*) FROM applicants {where}", case.params).fetchone()
        sql = f"SELECT id FROM applicants {where} ORDER BY {case.order} LIMIT ? OFFSET ?"
        ids = [row[0] for row in conn.execute(sql, (*case.params, case.limit, case.offset))]
    meta, served = document["meta"], [record["id"] for record in document["results"]]
    problems = []
    if meta["total"] != total:
        problems.append(f"{case.key}: meta.total {meta['total']} != count {total}")
    if served != ids:
        problems.append(f"{case.key}: {len(served)} results, not the {len(ids)} of the SQL page")
    more = case.offset + case.limit < total
    if meta["offset"] != case.offset or (more and not meta.get("next")):
        problems.append(f"{case.key}: unexpected meta {meta}")
    return problems


def served_once(base: str, dataset: Dataset, case: Case) -> tuple[bytes, list[str]]:
    url = base + case.path + (dataset.ids[0] if case.by_id else "")
    body = get_ok(url, dataset.tokens[case.scoped])
    problems = check_body(dataset.db, case, body)
    for problem in problems:
        say(f"  !! {problem}")
    return body, problems
