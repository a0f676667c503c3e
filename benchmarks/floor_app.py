"""The HTTP floor: a bare Litestar app served by uvicorn as `leasestar serve` serves the
real one; `GET /floor/<case>` answers `$BENCH_FLOOR_DIR/<case>.json`, `/floor/tiny` `{}`."""

from __future__ import annotations

import os
from pathlib import Path

from litestar import Litestar, MediaType, Response, get
from litestar.handlers import HTTPRouteHandler


def _fixed(path: str, body: bytes) -> HTTPRouteHandler:
    @get(path, media_type=MediaType.JSON, name=path)
    async def answer() -> Response[bytes]:
        return Response(content=body, media_type=MediaType.JSON)

    return answer


def create_floor_app() -> Litestar:
    """One route per saved body, for `uvicorn --factory floor_app:create_floor_app`."""
    folder = Path(os.environ["BENCH_FLOOR_DIR"])
    handlers = [_fixed("/floor/tiny", b"{}")]
    handlers += [
        _fixed(f"/floor/{file.stem}", file.read_bytes()) for file in sorted(folder.glob("*.json"))
    ]
    return Litestar(route_handlers=handlers)
