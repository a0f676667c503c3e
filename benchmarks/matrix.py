"""The query matrix (issue 17): every ordering against every kind of filter, values random
per request; p50/p99 per combination. Method: sections.toml, RESULTS.md."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import databases
import harness
import provenance
from cases import iso
from harness import CLIENT_CORE, SERVER_CORE, KeepAlive, on_core, percentile, say
from provenance import section, table, text

from leasestar.client.records import SORTABLE_FIELDS

MULTI_KEY = ("last_name:asc,first_name:asc", "property_id:asc,created_at:desc",
             "state:asc,city:asc,zip:asc", "integration_vendor:desc,last_seen:desc")  # fmt: skip
KINDS = ("no filter", "date bound", "date window", "equality", "equality + date bound",
         "scope 1 + date bound", "scope 2 + date bound")  # fmt: skip
DATE_COLUMNS = ("updated_at", "last_seen")
EQUALITY_COLUMNS = ("property_id", "x_property_id", "integration_id", "integration_vendor")
SCOPE_TOKENS = 4  # tokens of each scope size, one drawn per request
FIRST_REQUEST = "/v1/applicants?limit=1&updated_at_gte=1970-01-01T00:00:00Z"
SLOW_MS = 250.0  # a combination slower than this (median) after `min_rounds` is dropped
TARGET_P50_MS, TARGET_P99_MS = 10.0, 50.0  # issue 17, at 1,000,000 rows
SEED = 17


@dataclass(frozen=True)
class MatrixSettings:
    orderings: tuple[str, ...]
    rounds: int  # requests per combination, at most
    min_rounds: int  # ... at least, whatever the budget
    budget_seconds: float  # per database: no new round starts after this
    checks: int  # responses whose meta.total is checked against count(*), per database


def _both_ways(fields: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{name}:{way}" for name in fields for way in ("asc", "desc"))


FULL_MATRIX = MatrixSettings(_both_ways(SORTABLE_FIELDS) + MULTI_KEY, 50, 3, 300, 80)
QUICK_FIELDS = ("created_at", "updated_at", "last_seen", "x_id", "last_name", "city")
QUICK_MATRIX = MatrixSettings(_both_ways(QUICK_FIELDS) + MULTI_KEY[:1], 10, 3, 30, 30)
# Smoke: every ordering and kind once or twice, so every URL shape is proved to answer.
SMOKE_MATRIX = MatrixSettings(FULL_MATRIX.orderings, 2, 1, 20, 40)


@dataclass(frozen=True)
class Request:
    ordering: str
    kind: str
    path: str
    token: str
    where: tuple[tuple[str, Any], ...]  # (SQL condition, value) each: the count's WHERE
    scope: tuple[str, ...] = ()  # the token's integrations; () for the unscoped token

    def shown(self) -> str:
        return f"`{self.path}`" + (f" (token scoped to {', '.join(self.scope)})" * bool(self.scope))


@dataclass
class Domain:
    rows: int
    ranges: dict[str, tuple[int, int]]  # date column -> (min, max) microseconds
    values: dict[str, list[str]]  # equality column -> its distinct values
    tokens: dict[int, list[tuple[tuple[str, ...], str]]]  # scope size -> (integrations, token)
    unscoped: str


def prepare(db: Path, rows: int) -> Domain:
    """The database's value ranges, and the tokens (created before its server starts)."""
    with contextlib.closing(databases.read_only(db)) as conn:
        bounds = "SELECT min({0}), max({0}) FROM applicants"
        ranges = {
            c: tuple(map(int, conn.execute(bounds.format(c)).fetchone())) for c in DATE_COLUMNS
        }
        sql = "SELECT DISTINCT {} FROM applicants ORDER BY 1"
        values = {c: [row[0] for row in conn.execute(sql.format(c))] for c in EQUALITY_COLUMNS}
    chooser = random.Random(SEED)
    integrations = values["integration_id"]
    tokens: dict[int, list[tuple[tuple[str, ...], str]]] = {1: [], 2: []}
    for size in (1, 2):
        scopes = sorted({tuple(sorted(chooser.sample(integrations, size))) for _ in range(50)})
        for index, scope in enumerate(chooser.sample(scopes, min(SCOPE_TOKENS, len(scopes)))):
            purpose = f"matrix-scope{size}-{index}"
            tokens[size].append((scope, databases.create_token(db, purpose, *scope)))
    unscoped = databases.create_token(db, "matrix")
    say(f"{rows:,} rows: matrix tokens made ({len(tokens[1])} + {len(tokens[2])} scoped)")
    return Domain(rows, ranges, values, tokens, unscoped)


def draw(rng: random.Random, domain: Domain, ordering: str, kind: str) -> Request:
    """One request of a combination (values drawn in a fixed order: a seed, the same requests)."""
    params: dict[str, tuple[str, Any]] = {}
    token, scope = domain.unscoped, ()
    if kind in ("date bound", "equality + date bound") or kind.startswith("scope"):
        column = rng.choice(DATE_COLUMNS)
        low, high = domain.ranges[column]
        side = rng.choice(("gte", "lte"))
        sql = f"{column} {'>=' if side == 'gte' else '<='} ?"
        params[f"{column}_{side}"] = (sql, rng.randint(low, high))
    if kind == "date window":
        column = rng.choice(DATE_COLUMNS)
        low, high = domain.ranges[column]
        width = int((high - low) * rng.uniform(0.01, 0.3))
        start = rng.randint(low, high - width)
        params[f"{column}_gte"] = (f"{column} >= ?", start)
        params[f"{column}_lte"] = (f"{column} <= ?", start + width)
    if kind.startswith("equality"):
        column = rng.choice(EQUALITY_COLUMNS)
        params[column] = (f"{column} = ?", rng.choice(domain.values[column]))
    if kind.startswith("scope"):
        scope, token = rng.choice(domain.tokens[int(kind.split()[1])])
    query = {"order-by": ordering}
    for name, (_, value) in params.items():
        query[name] = iso(value) if isinstance(value, int) else value
    where = tuple(params.values())
    if scope:
        marks = ", ".join("?" * len(scope))
        where += ((f"integration_id IN ({marks})", scope),)
    path = "/v1/applicants?" + urllib.parse.urlencode(query)
    return Request(ordering, kind, path, token, where, scope)


def rounds_of(domain: Domain, settings: MatrixSettings) -> list[list[Request]]:
    """Every request of the run, up front: each round every combination once, shuffled."""
    rng = random.Random(SEED * 1_000_003 + domain.rows)
    combinations = [(o, k) for o in settings.orderings for k in KINDS]
    rounds = []
    for _ in range(settings.rounds):
        round_ = [draw(rng, domain, o, k) for o, k in combinations]
        rng.shuffle(round_)
        rounds.append(round_)
    return rounds


@dataclass
class Sample:
    request: Request = field(repr=False)
    ms: float
    status: int
    total: int | None


@dataclass
class Combination:
    ordering: str
    kind: str
    samples: list[Sample] = field(default_factory=list, repr=False)

    @property
    def latencies(self) -> list[float]:
        return [s.ms for s in self.samples if s.status == 200]

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


@dataclass
class MatrixResult:
    rows: int
    combinations: list[Combination]
    problems: list[str]
    checked: int
    seconds: float
    dropped: int  # combinations asked no more after the first rounds
    first_seconds: float  # the server's first list request: its columnar copy's first read

    @property
    def p99_all(self) -> float:
        return percentile((ms for c in self.combinations for ms in c.latencies), 0.99)

    @property
    def worst(self) -> Combination:
        return max(self.combinations, key=lambda c: (c.p50, c.p99))


def _total(body: bytes) -> int | None:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return int(json.loads(body[len(b'{"meta":') : body.index(b',"results":')])["total"])
    return None


def measure(base: str, db: Path, domain: Domain, settings: MatrixSettings) -> MatrixResult:
    rounds = rounds_of(domain, settings)
    combinations = {(o, k): Combination(o, k) for o in settings.orderings for k in KINDS}
    say(
        f"{domain.rows:,} rows: query matrix, {len(combinations)} combinations, up to "
        f"{len(rounds)} rounds, {settings.budget_seconds:.0f} s budget"
    )
    problems: list[str] = []
    dropped: set[tuple[str, str]] = set()
    with contextlib.closing(KeepAlive(base)) as client, on_core(CLIENT_CORE):
        # A server's first broad filter waits for its columnar copy's first read (seconds
        # at 1M rows, once per start): timed apart, the matrix measures it running.
        status, _, body, first = client.get(FIRST_REQUEST, rounds[0][0].token)
        if status != 200:
            problems.append(f"{FIRST_REQUEST}: HTTP {status}: {body[:200]!r}")
        say(f"  the first request (the columnar copy's first read): {first:.1f} s")
        started = time.monotonic()
        for index, round_ in enumerate(rounds):
            if index >= settings.min_rounds:
                if time.monotonic() - started > settings.budget_seconds:
                    break
                if index == settings.min_rounds:
                    dropped = {key for key, c in combinations.items() if c.p50 > SLOW_MS}
                    if dropped:
                        say(f"  {len(dropped)} combinations over {SLOW_MS:.0f} ms: no more")
            for request in round_:
                key = request.ordering, request.kind
                if key in dropped:
                    continue
                status, _, body, seconds = client.get(request.path, request.token)
                combinations[key].samples.append(
                    Sample(request, seconds * 1000, status, _total(body))
                )
                if status != 200 and len(problems) < 10:
                    problems.append(f"{request.shown()}: HTTP {status}: {body[:200]!r}")
    seconds = time.monotonic() - started
    found = list(combinations.values())
    checked = check_totals(db, found, settings.checks, problems)
    result = MatrixResult(domain.rows, found, problems, checked, seconds, len(dropped), first)
    worst = result.worst
    say(
        f"{domain.rows:,} rows: matrix took {seconds:.0f} s; worst {worst.ordering} | "
        f"{worst.kind}: p50 {worst.p50:.1f} ms; p99 of all {result.p99_all:.1f} ms"
    )
    for problem in problems:
        say(f"  !! {problem}")
    return result


def check_totals(db: Path, combinations: list[Combination], count: int, problems: list[str]) -> int:
    """A sample of the answers' `meta.total` against `count(*)` with the request's WHERE."""
    answered = [s for c in combinations for s in c.samples if s.status == 200]
    sample = random.Random(SEED).sample(answered, min(count, len(answered)))
    with contextlib.closing(databases.read_only(db)) as conn:
        for s in sample:
            conditions = [sql for sql, _ in s.request.where] or ["1"]
            params: list[Any] = []
            for _, value in s.request.where:
                params += value if isinstance(value, tuple) else [value]
            (expected,) = conn.execute(
                f"SELECT count(*) FROM applicants WHERE {' AND '.join(conditions)}", params
            ).fetchone()
            if s.total != expected:
                problems.append(f"{s.request.shown()}: meta.total {s.total} != count(*) {expected}")
    return len(sample)


def _cell(c: Combination) -> str:
    if not c.latencies:
        return "-"
    text = f"{c.p50:.1f} / {c.p99:.1f}"
    return f"**{text}**" if c.p50 > TARGET_P50_MS else text


def _database(result: MatrixResult) -> str:
    worst = result.worst
    requests = [len(c.samples) for c in result.combinations]
    problems = "all exact."
    if result.problems:
        problems = f"{len(result.problems)} problems: " + "; ".join(result.problems[:5])
    over = sum(1 for c in result.combinations if c.latencies and c.p50 > TARGET_P50_MS)
    size = text(
        "matrix", "size", combinations=len(result.combinations), fewest=min(requests),
        most=max(requests), requests=sum(requests), seconds=result.seconds,
        dropped=result.dropped, first_seconds=result.first_seconds,
        worst_ordering=worst.ordering, worst_kind=worst.kind, worst_p50=worst.p50,
        worst_p99=worst.p99, over=over, target_p50=TARGET_P50_MS, p99_all=result.p99_all,
        target_p99=TARGET_P99_MS, checked=result.checked, problems=problems,
    )  # fmt: skip
    by_key = {(c.ordering, c.kind): c for c in result.combinations}
    orderings = dict.fromkeys(c.ordering for c in result.combinations)
    grid = table(
        "| order-by | " + " | ".join(KINDS) + " |\n|---|" + "---:|" * len(KINDS),
        ([f"`{o}`", *(_cell(by_key[o, kind]) for kind in KINDS)] for o in orderings),
    )
    samples = (s for c in result.combinations for s in c.samples)
    slowest = sorted(samples, key=lambda s: -s.ms)[:5]
    listed = "\n".join(f"- {s.ms:,.1f} ms: {s.request.shown()}" for s in slowest)
    return "\n\n".join([f"### {result.rows:,} applicants", size, grid, "Slowest requests:", listed])


def markdown(results: list[MatrixResult], command: str, when: str) -> str:
    return section(
        "matrix",
        *(_database(result) for result in results),
        when=when, command=command, scope_tokens=SCOPE_TOKENS, client_core=CLIENT_CORE,
        server_core=SERVER_CORE, slow_ms=SLOW_MS, target_p50=TARGET_P50_MS,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="the query matrix (issue 17), one database")
    parser.add_argument("--quick", action="store_true", help="the reduced matrix of --quick")
    args, outputs = provenance.options(parser, {}, rows=[100_000], out="--results")
    when, results = provenance.now(), []
    for rows in args.rows:
        db = databases.ensure_database(rows, outputs.work)
        domain = prepare(db, rows)
        with harness.leasestar_server(f"matrix-{rows}", db, work=outputs.work) as server:
            settings = SMOKE_MATRIX if args.smoke else QUICK_MATRIX if args.quick else FULL_MATRIX
            results.append(measure(server.base, db, domain, settings))
    section = markdown(results, provenance.command(), when)
    provenance.publish(section, outputs.results_md if args.results or args.smoke else None)


if __name__ == "__main__":
    main()
