"""What clients do (issue 15): distinct pages by offset and cursor against the repeated
first page, compressed walks against identity, get by id against its floor."""

from __future__ import annotations

import contextlib
import gzip
import json
import random
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import brotli
import floors
from cases import Dataset, Settings, served_once, target_for
from harness import KeepAlive, Measured, WrkTarget, say
from provenance import section, table, text

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]

LIMIT = 100  # the default page size
WALK = 20  # cursor pages followed from each random start
OFFSETS = 50_000  # random offsets in the file wrk.lua draws from
ENCODINGS = ("gzip", "br", "zstd")
BROWSER = "gzip, deflate, br, zstd"  # what browsers send: the server should choose gzip
DECODERS = {"gzip": gzip.decompress, "br": brotli.decompress, "zstd": zstd.decompress}
SEED = 15


@dataclass
class ClientCase:
    key: str
    label: str
    target: WrkTarget = field(repr=False)
    reference: str | None = None  # key of the case its req/s ratio is taken against
    need: float | None = None  # issue 15's target for that ratio
    measured: Measured | None = None


@dataclass
class ClientsResult:
    rows: int
    cases: dict[str, ClientCase]
    composite: dict[str, float] = field(default_factory=dict)  # case key -> composite floor
    cursors: int = 0
    notes: list[str] = field(default_factory=list)

    def rps(self, key: str) -> float:
        measured = self.cases[key].measured
        return measured.rps if measured else 0.0

    def ratio(self, key: str) -> float | None:
        reference = self.cases[key].reference
        if reference is None:
            floor = self.composite.get(key)
            return self.rps(key) / floor if floor else None
        return self.rps(key) / self.rps(reference) if self.rps(reference) else None

    def wire_ratio(self, key: str) -> float | None:
        mine, identity = self.cases[key].measured, self.cases["offsets"].measured
        return mine.wire_bytes / identity.wire_bytes if mine and identity else None

    def targets(self) -> list[tuple[str, float, str, bool]]:
        """(what, measured, needs, met) for issue 15's targets in this run."""
        found = []
        for case in self.cases.values():
            ratio = self.ratio(case.key)
            if case.need is not None and ratio is not None:
                against = case.reference or "composite floor"
                what = f"{case.label} vs {self.cases[against].label if case.reference else against}"
                found.append((what, ratio, f">= {case.need:.2f}x", ratio >= case.need))
            wire = self.wire_ratio(case.key) if case.key in ENCODINGS else None
            if wire is not None:
                what = f"{case.label}: bytes on the wire vs identity"
                found.append((what, wire, "<= 0.30x", wire <= 0.3))
        return found


def offsets_file(rows: int, work: Path) -> Path:
    """Random default-order pages by offset, one path a line, from a fixed seed."""
    chooser = random.Random(SEED)
    path, top = work / f"distinct-offsets-{rows}.txt", max(0, rows - LIMIT)
    lines = (f"/v1/applicants?offset={chooser.randint(0, top)}\n" for _ in range(OFFSETS))
    path.write_text("".join(lines))
    return path


def cursors_file(base: str, dataset: Dataset, pages: int, work: Path) -> tuple[Path, int]:
    """Cursors of distinct pages as clients get them, `WALK` pages along `meta.next` from
    each random offset: (the file of their paths, how many)."""
    chooser = random.Random(SEED + dataset.rows)
    token = dataset.tokens[False]
    found: dict[str, None] = {}
    with contextlib.closing(KeepAlive(base)) as client:
        for _ in range(max(1, pages // WALK)):
            path = f"/v1/applicants?offset={chooser.randint(0, max(0, dataset.rows - LIMIT))}"
            for _ in range(WALK + 1):
                status, _, body, _ = client.get(path, token)
                if status != 200:
                    raise RuntimeError(f"collecting cursors: {path}: {status}: {body[:200]!r}")
                meta = json.loads(body)["meta"]
                if path.startswith("/v1/applicants?cursor="):
                    found[path] = None
                if not meta.get("hasMore") or not meta.get("next"):
                    break
                path = "/v1/applicants?" + urllib.parse.urlencode({"cursor": meta["next"]})
    file = work / f"distinct-cursors-{dataset.rows}.txt"
    file.write_text("".join(f"{path}\n" for path in found))
    return file, len(found)


def check_encodings(base: str, dataset: Dataset) -> list[str]:
    """The encoding each Accept-Encoding gets, and its answer decoded byte for byte."""
    token = dataset.tokens[False]
    path = f"/v1/applicants?offset={dataset.rows // 3}"
    problems = []
    with contextlib.closing(KeepAlive(base)) as client:
        _, _, identity, _ = client.get(path, token)
        for offered, expected in (*((e, e) for e in ENCODINGS), (BROWSER, "gzip")):
            status, headers, body, _ = client.get(path, token, {"Accept-Encoding": offered})
            chosen = headers.get("content-encoding", "identity")
            if status != 200 or chosen != expected:
                problems.append(f"Accept-Encoding {offered!r}: {status}, {chosen}, not {expected}")
            elif DECODERS[chosen](body) != identity:
                problems.append(f"Accept-Encoding {offered!r}: decoded body differs from identity")
    return problems


def build(
    base: str, floor_base: str | None, dataset: Dataset, work: Path, pages: int
) -> ClientsResult:
    """The cases of one database (its cursors collected now, before any measurement)."""
    token = dataset.tokens[False]
    offsets = offsets_file(dataset.rows, work)
    cursors, collected = cursors_file(base, dataset, pages, work)
    say(f"{dataset.rows:,} rows: {collected:,} cursors of distinct pages collected")
    first, by_id = dataset.cases["list_default"], dataset.cases["get_by_id"]
    walk = base + "/v1/applicants"
    cases = [
        ClientCase("first", "first page, repeated", target_for(base, dataset, first, "first page")),
        ClientCase("offsets", "distinct pages by offset",
                   WrkTarget("distinct offsets", walk, token, paths_file=offsets), "first", 0.8),
        ClientCase("cursors", "distinct pages by cursor",
                   WrkTarget("distinct cursors", walk, token, paths_file=cursors), "first", 0.8),
        *(ClientCase(encoding, f"distinct pages by offset, {encoding}",
                     WrkTarget(f"distinct offsets, {encoding}", walk, token, paths_file=offsets,
                               headers=(f"Accept-Encoding: {encoding}",)), "offsets", need)
          for encoding, need in zip(ENCODINGS, (0.6, 0.5, None), strict=True)),
        ClientCase("get_by_id", "get by random id", target_for(base, dataset, by_id, "get by id"),
                   None, 0.65),
    ]  # fmt: skip
    if floor_base:
        for key in ("list_default", "get_by_id"):
            floor = WrkTarget(f"HTTP floor {key}", f"{floor_base}/floor/{key}")
            cases.append(ClientCase(f"http_{key}", f"HTTP floor of {key}", floor))
    result = ClientsResult(dataset.rows, {case.key: case for case in cases}, cursors=collected)
    result.notes = check_encodings(base, dataset)
    return result


def measure(settings: Settings, dataset: Dataset, base: str, result: ClientsResult) -> None:
    """Every case and both in-process floors, in interleaved slices."""
    say(f"{dataset.rows:,} rows: what clients do (distinct pages, compression, by id)")
    in_process = {}
    for key in ("list_default", "get_by_id"):
        case = dataset.cases[key]
        body, problems = served_once(base, dataset, case)
        result.notes += problems
        in_process[key] = floors.InProcessFloor(dataset.db, case, body, dataset.facts.ids)
    try:
        settings.interleave([c.target for c in result.cases.values()], list(in_process.values()))
    finally:
        for floor in in_process.values():
            floor.close()
    for case in result.cases.values():
        case.measured = case.target.measured()
    for key, case_key in (("list_default", "first"), ("get_by_id", "get_by_id")):
        http = result.cases.get(f"http_{key}")
        rate = in_process[key].rate
        if http and http.measured and http.measured.rps and rate:
            result.composite[case_key] = 1 / (1 / http.measured.rps + 1 / rate)
    for case in result.cases.values():
        m = case.measured
        assert m is not None
        ratio = result.ratio(case.key)
        say(
            f"  {case.label:<36} {m.rps:7.0f} req/s  p50 {m.p50_ms:6.2f} ms  "
            f"{m.wire_bytes:9,.0f} B/resp" + (f"  {ratio:.2f}x" if ratio else "")
        )


def _fmt(value: float | None, suffix: str = "x") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def _database(result: ClientsResult) -> str:
    rows = []
    for case in result.cases.values():
        m = case.measured
        assert m is not None
        against = "composite floor" if case.key in result.composite else ""
        against = result.cases[case.reference].label if case.reference else against
        rows.append(
            [case.label, f"{m.rps:,.0f}", f"{m.p50_ms:.2f}", f"{m.p99_ms:.2f}",
             f"{m.wire_bytes:,.0f}", _fmt(result.ratio(case.key)), against]
        )  # fmt: skip
    for key, floor in result.composite.items():
        rows.append([f"composite floor of {result.cases[key].label}", f"{floor:,.0f}", *[""] * 5])
    targets = (
        [what, f"{measured:.2f}x", needs, "PASS" if met else "MISS"]
        for what, measured, needs, met in result.targets()
    )
    found = "; ".join(result.notes) if result.notes else "all as expected."
    return "\n\n".join([
        f"### {result.rows:,} applicants ({result.cursors:,} distinct cursor pages)",
        table(text("clients", "columns"), rows),
        table(text("clients", "target_columns"), targets),
        text("clients", "encodings", browser=BROWSER, found=found),
    ])  # fmt: skip


def markdown(results: list[ClientsResult], settings: Settings, command: str, when: str) -> str:
    return section(
        "clients",
        *(_database(result) for result in results),
        when=when, command=command, seconds=settings.seconds, slices=settings.slices,
        warmup=settings.warmup, limit=LIMIT, offsets=OFFSETS, walk=WALK,
    )  # fmt: skip
