"""What clients do (issue 15): distinct pages by offset and cursor against the repeated
first page, compressed walks against identity, get by id against its floor."""

from __future__ import annotations

import contextlib
import gzip
import json
import random
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import brotli
import report
from cases import Dataset, Settings
from harness import KeepAlive, WrkTarget, say
from provenance import section, table, text
from report import Measurement, list_case

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


def measure(
    settings: Settings, base: str, floor_base: str, dataset: Dataset, work: Path
) -> Clients:
    """The cases of one database (its cursors collected first), then every case and both
    in-process floors in interleaved slices."""
    token = dataset.tokens[False]
    offsets = offsets_file(dataset.rows, work)
    cursors, collected = cursors_file(base, dataset, settings.cursor_pages, work)
    say(f"{dataset.rows:,} rows: {collected:,} cursors of distinct pages collected")
    first = list_case(base, dataset, dataset.cases["list_default"], floor_base)
    first.label = "first page, repeated"
    walk = base + "/v1/applicants"

    def distinct(label: str, paths: Path, against: Measurement, need: float | None) -> Measurement:
        target = WrkTarget(label, walk, token, paths_file=paths)
        return Measurement(label, target, dataset.rows, against=against, need=need)

    by_offset = distinct("distinct pages by offset", offsets, first, 0.8)
    group = [first, by_offset, distinct("distinct pages by cursor", cursors, first, 0.8)]
    for encoding, need in zip(ENCODINGS, (0.6, 0.5, None), strict=True):
        group.append(distinct(f"distinct pages by offset, {encoding}", offsets, by_offset, need))
        group[-1].target.headers = (f"Accept-Encoding: {encoding}",)
        group[-1].wire_at_most = 0.3
    group.append(list_case(base, dataset, dataset.cases["get_by_id"], floor_base))
    group[-1].need = 0.65
    problems = check_encodings(base, dataset)
    say(f"{dataset.rows:,} rows: what clients do (distinct pages, compression, by id)")
    report.measure(settings, group)
    return Clients(dataset.rows, group, collected, problems + [n for m in group for n in m.notes])


@dataclass
class Clients:
    rows: int
    group: list[Measurement]
    cursors: int  # distinct cursor pages collected
    notes: list[str]  # the encodings' problems, then the bodies'


def _database(clients: Clients) -> str:
    found = "; ".join(clients.notes) if clients.notes else "all as expected."
    return "\n\n".join([
        f"### {clients.rows:,} applicants ({clients.cursors:,} distinct cursor pages)",
        report.against_table(clients.group),
        table(text("clients", "target_columns"), report.targets(clients.group)),
        text("clients", "encodings", browser=BROWSER, found=found),
    ])  # fmt: skip


def markdown(results: list[Clients], settings: Settings, command: str, when: str) -> str:
    return section(
        "clients",
        *(_database(result) for result in results),
        when=when, command=command, seconds=settings.seconds, slices=settings.slices,
        warmup=settings.warmup, limit=LIMIT, offsets=OFFSETS, walk=WALK,
    )  # fmt: skip
