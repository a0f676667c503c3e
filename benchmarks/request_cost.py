"""What one request costs inside the server, layer by layer: `python benchmarks/request_cost.py`.

The app is driven through ASGI directly (no socket, no HTTP parser), one request at a
time, on the server core, so each figure is the time one core spends on one request
in that layer and below. Variants peel one layer at a time, in this process only
(nothing in `leasestar/` changes):

- as served: `create_app` with the settings `leasestar serve` uses;
- as served, but every read on aiosqlite's thread (what reading on the loop saves);
- access log off (`LEASESTAR_LOG_FORMAT=off`);
- ... and without the observability and hygiene ASGI wrappers;
- ... and without compression (no client here asks for it anyway);
- the handler's own work alone: `ApplicantReader` and the envelope, without Litestar.

Variants take turns in rounds, and the best round counts: background load only adds. The difference
between two lines is what that layer costs per request. Needs the 100k database of
`make bench` (`benchmarks/work/applicants-100000.db`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import harness
import uvloop
from cases import SMALL, Dataset

import leasestar.main as main_module
from leasestar import database
from leasestar.config import Settings
from leasestar.main import create_app

ROUNDS = 9
SECONDS = 0.4  # per variant and round


class PoolOnlyReads(database.ReadPool):
    """Every read on aiosqlite's thread, as before reads were tried on the event loop."""

    def __init__(self, path: Path, size: int) -> None:
        super().__init__(path, size, inline_budget=0)


def scope_for(path: str, query: str, token: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"user-agent", b"wrk"),
            (b"authorization", f"Bearer {token}".encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


class Variant:
    """One way of serving; `call()` answers one request and returns the body's size."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[float] = []

    async def call(self) -> int:
        raise NotImplementedError

    async def measure(self, seconds: float) -> None:
        done, start = 0, time.perf_counter()
        while True:
            await self.call()
            done += 1
            now = time.perf_counter()
            if now - start >= seconds:
                self.samples.append((now - start) / done * 1e6)
                return


class AsgiVariant(Variant):
    def __init__(self, name: str, app: Any, scopes: Callable[[], dict[str, Any]]) -> None:
        super().__init__(name)
        self.app = app
        self.scopes = scopes

    async def call(self) -> int:
        size = 0
        status = 0

        async def send(message: dict[str, Any]) -> None:
            nonlocal size, status
            if message["type"] == "http.response.start":
                status = message["status"]
            else:
                size += len(message.get("body", b""))

        await self.app(self.scopes(), receive, send)
        if status != 200:
            raise RuntimeError(f"{self.name}: HTTP {status}")
        return size


class HandlerVariant(Variant):
    """The handler's work without Litestar: storage plus the envelope bytes."""

    def __init__(self, name: str, app: Any, work: Callable[[Any], Coroutine[Any, Any, int]]):
        super().__init__(name)
        self.app = app
        self.work = work

    async def call(self) -> int:
        return await self.work(self.app)


def peel(app: Any) -> Any:
    """The app's ASGI handler without the observability and hygiene wrappers."""
    handler = app.asgi_handler
    while type(handler).__name__ in ("ObservabilityMiddleware", "HygieneMiddleware"):
        handler = handler.app
    return handler


async def list_work(app: Any) -> int:
    from leasestar.applicants.query import parse_list_query

    reader = app.state.reader
    query = parse_list_query((), app.state.cursor_codec)
    page = await reader.fetch_page(query, None)
    return len(b"".join((b'{"meta":{}', b',"results":[', page.results_json, b"]}")))


async def one_work(app: Any, ids: list[str], state: dict[str, int]) -> int:
    from leasestar.applicants.query import parse_record_query

    state["i"] = (state["i"] + 1) % len(ids)
    query = parse_record_query(())
    record, _ = await app.state.reader.fetch_one(ids[state["i"]], query, None)
    return len(b"".join((b'{"meta":{}', b',"results":', record or b"", b"}")))


async def main_async() -> None:
    dataset = Dataset.prepare(SMALL)
    token = dataset.tokens[False]
    ids = dataset.facts.ids
    served = replace(Settings.from_env(), db_path=dataset.db, rate_limit=None)
    quiet = replace(served, log_format="off")
    plain = replace(quiet, compression=False)

    async with contextlib.AsyncExitStack() as stack:

        async def started(settings: Settings, pool_only: bool, peeled: bool = False) -> Any:
            main_module.ReadPool = PoolOnlyReads if pool_only else ORIGINAL_POOL  # type: ignore[attr-defined]
            try:
                app = create_app(settings)
                await stack.enter_async_context(app.lifespan())
            finally:
                main_module.ReadPool = ORIGINAL_POOL  # type: ignore[attr-defined]
            if peeled:
                app.asgi_handler = peel(app)
            return app

        # The access log is configured globally by create_app: the served app comes last,
        # so that its log is the one left on (writing to this process's stderr, a file).
        others = {
            "access log off": await started(quiet, False),
            "+ no observability/hygiene wrappers": await started(quiet, False, peeled=True),
            "+ no compression middleware": await started(plain, False, peeled=True),
        }
        apps = {
            "as served, reads on aiosqlite's thread only": await started(served, True),
            "as served": await started(served, False),
            **others,
        }
        state = {"i": 0}

        def by_id_scope() -> dict[str, Any]:
            state["i"] = (state["i"] + 1) % len(ids)
            return scope_for(f"/v1/applicants/{ids[state['i']]}", "", token)

        cases: dict[str, list[Variant]] = {
            "list default": [
                AsgiVariant(name, app, lambda: scope_for("/v1/applicants", "", token))
                for name, app in apps.items()
            ]
            + [
                HandlerVariant(
                    "handler's work only (storage + envelope)",
                    apps["+ no compression middleware"],
                    list_work,
                )
            ],
            "get by id": [AsgiVariant(name, app, by_id_scope) for name, app in apps.items()]
            + [
                HandlerVariant(
                    "handler's work only (storage + envelope)",
                    apps["+ no compression middleware"],
                    lambda app: one_work(app, ids, state),
                )
            ],
        }
        if True:
            for variants in cases.values():
                for variant in variants:
                    await variant.measure(0.3)  # warm-up
                    variant.samples.clear()
                for _ in range(ROUNDS):
                    for variant in variants:
                        await variant.measure(SECONDS)
        for case, variants in cases.items():
            print(f"\n{case}: microseconds per request, one at a time, best of {ROUNDS} rounds")
            previous = None
            for variant in variants:
                cost = min(variant.samples)  # background load only ever adds
                delta = f"  ({cost - previous:+6.0f})" if previous is not None else ""
                print(f"  {variant.name:<44} {cost:7.0f}{delta}")
                previous = cost


ORIGINAL_POOL = database.ReadPool


def main() -> int:
    harness.raise_priority()
    # Like the server's: stderr (the access log) goes to a file.
    log = (harness.WORK / "request-cost.log").open("wb")
    os.dup2(log.fileno(), 2)
    with harness.on_server_core():
        uvloop.run(main_async())
    return 0


if __name__ == "__main__":
    sys.exit(main())
