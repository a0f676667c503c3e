"""The floors a case is measured against: its page read and assembled with sqlite3 in a
loop on the server's core, and a bare Litestar app answering its bytes under the same
uvicorn. Method: sections.toml, RESULTS.md."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
from cases import Case
from databases import read_only
from harness import BENCH, SERVER_CORE, UVICORN, on_core
from litestar import Litestar, MediaType, Response, get
from litestar.handlers import HTTPRouteHandler

from leasestar.applicants.bodies import BodyDecoder


def _fixed(path: str, body: bytes) -> HTTPRouteHandler:
    @get(path, media_type=MediaType.JSON, name=path)
    async def answer() -> Response[bytes]:
        return Response(content=body, media_type=MediaType.JSON)

    return answer


def create_floor_app() -> Litestar:
    """`GET /floor/<case>` answers `$BENCH_FLOOR_DIR/<case>.json`, `/floor/tiny` `{}`."""
    folder = Path(os.environ["BENCH_FLOOR_DIR"])
    handlers = [_fixed("/floor/tiny", b"{}")]
    handlers += [_fixed(f"/floor/{f.stem}", f.read_bytes()) for f in sorted(folder.glob("*.json"))]
    return Litestar(route_handlers=handlers)


def floor_server(
    bodies: dict[str, bytes], work: Path
) -> contextlib.AbstractContextManager[harness.Server]:
    """The floor app answering each case's served body (key -> bytes) byte for byte."""
    folder = work / "floor-bodies"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for key, body in bodies.items():
        (folder / f"{key}.json").write_bytes(body)
    # `leasestar serve` runs uvicorn.run(factory=True, workers=1, log_level="info",
    # access_log=False) with uvicorn's default loop and HTTP parser: the same here.
    command = [str(UVICORN), "floors:create_floor_app", "--factory", "--app-dir", str(BENCH)]
    command += ["--host", "127.0.0.1", "--port", "{port}", "--workers", "1"]
    command += ["--log-level", "info", "--no-access-log"]
    env = {"BENCH_FLOOR_DIR": str(folder)}
    return harness.server("floor", command, "/floor/tiny", env, work=work)


class InProcessFloor:
    """Pages per second of the fastest way found to make the served bytes (each variant's
    must equal them): the best of the plans first, then of the assemblies."""

    def __init__(self, db: Path, case: Case, body: bytes, ids: list[str]) -> None:
        self.name = f"in-process {case.key}"
        self._conn = read_only(db)
        # Bodies are stored compressed (leasestar/applicants/bodies.py): decompressing
        # them is part of the least work a page takes.
        self._bodies = BodyDecoder.of(self._conn)
        self._ids = ids
        self._picks: Iterator[str] = itertools.cycle(ids)
        # The meta object of the served body, spliced exactly as served.
        head = b'{"meta":' + body[len(b'{"meta":') : body.index(b',"results":')] + b',"results":'
        if case.by_id:
            variants = self._by_id_variants(head)
        else:
            plans = self._plans(case)
            with on_core(SERVER_CORE):
                plan_rates = {
                    name: self._trial(self._assemblies(head, *plan)["group_concat, blob"], body)
                    for name, plan in plans.items()
                }
            best_plan = max(plan_rates, key=plan_rates.__getitem__)
            variants = {
                f"{best_plan}; {name}": produce
                for name, produce in self._assemblies(head, *plans[best_plan]).items()
            }
        with on_core(SERVER_CORE):
            trials = {name: self._trial(produce, body) for name, produce in variants.items()}
        self.variant = max(trials, key=trials.__getitem__)
        self._produce = variants[self.variant]
        self.calls, self.elapsed = 0, 0.0

    def _plans(self, case: Case) -> dict[str, tuple[str, tuple[Any, ...]]]:
        """Name -> (page SQL selecting {column}, parameters): the plain statement; for a
        filter, the order's index walked (`+column` keeps the filter off its index); for a
        filter or offset on the default order, a keyset seek to the page's first row."""
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
        self, head: bytes, template: str, params: tuple[Any, ...]
    ) -> dict[str, Callable[[], bytes]]:
        conn, bodies = self._conn, self._bodies
        blob_rows = template.format(column="CAST(body AS BLOB) AS body")
        concat = (
            "SELECT CAST(coalesce(group_concat(body, ''), '') AS BLOB), "
            f"coalesce(group_concat(length(CAST(body AS BLOB))), '') FROM ({blob_rows})"
        )

        head += b"["

        def rows_blob() -> bytes:
            rows = [bodies.decode(row[0]) for row in conn.execute(blob_rows, params)]
            return b"".join((head, b",".join(rows), b"]}"))

        def concat_blob() -> bytes:
            stored, lengths = conn.execute(concat, params).fetchone()
            return b"".join((head, bodies.decode_joined(stored, lengths), b"]}"))

        return {"rows+join, blob": rows_blob, "group_concat, blob": concat_blob}

    def _by_id_variants(self, head: bytes) -> dict[str, Callable[[], bytes]]:
        def by_id_blob() -> bytes:
            (blob,) = self._conn.execute(
                "SELECT CAST(body AS BLOB) FROM applicants WHERE id = ?", (next(self._picks),)
            ).fetchone()
            return b"".join((head, self._bodies.decode(blob), b"}"))

        return {"row, blob": by_id_blob}

    def _trial(self, produce: Callable[[], bytes], body: bytes) -> float:
        self._picks = itertools.cycle(self._ids)  # by id: the first id's body was served
        if produce() != body:
            raise RuntimeError(f"{self.name}: a floor variant differs from the served body")
        calls, elapsed = loop(produce, 0.15)
        return calls / elapsed

    def run(self, seconds: float) -> None:
        with on_core(SERVER_CORE):
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
