"""The browsable API documentation at `/schema`: Swagger UI, served from this server.

The page's scripts, stylesheet and icon come from the `swagger-ui-py` package's copy of
Swagger UI 5, served under `/schema/assets/`, so the documentation works on a machine
without internet access and the page never loads code from a third party. Litestar's
`SwaggerRenderPlugin` writes the page (with the OpenAPI document inlined); only the
asset URLs are ours.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from litestar import Router
from litestar.datastructures import CacheControlHeader
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.static_files import create_static_files_router

from leasestar.hygiene import send_error

SCHEMA_PATH: Final = "/schema"
ASSETS_PATH: Final = f"{SCHEMA_PATH}/assets"
# The files the page loads; `tests/test_docs_page.py` checks each one is served.
PAGE_ASSETS: Final = (
    "swagger-ui-bundle.js",
    "swagger-ui-standalone-preset.js",
    "swagger-ui.css",
    "favicon-32x32.png",
)
# Assets change only when the package is upgraded; a day of caching spares the 1.5 MB
# bundle on every visit without pinning a stale copy for long.
_ASSET_CACHE: Final = CacheControlHeader(public=True, max_age=86_400)


def swagger_ui_directory() -> Path:
    """The `static/` folder of the installed swagger-ui-py package.

    Found without importing the package, whose import pulls in its framework adapters.
    """
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def docs_page() -> SwaggerRenderPlugin:
    """Swagger UI at `/schema` (the root of the OpenAPI router), all assets local."""
    return SwaggerRenderPlugin(
        js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        css_url=f"{ASSETS_PATH}/swagger-ui.css",
        standalone_preset_js_url=f"{ASSETS_PATH}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{ASSETS_PATH}/favicon-32x32.png'>",
        path="/",
    )


def docs_assets() -> Router:
    """The Swagger UI files, under `/schema/assets/`, outside the OpenAPI document."""
    return create_static_files_router(
        path=ASSETS_PATH,
        directories=[swagger_ui_directory()],
        name="docs-assets",
        cache_control=_ASSET_CACHE,
        include_in_schema=False,
    )


def asset_paths() -> frozenset[str]:
    """The URL path of every file the assets router serves."""
    directory = swagger_ui_directory()
    return frozenset(
        f"{ASSETS_PATH}/{path.relative_to(directory).as_posix()}"
        for path in directory.rglob("*")
        if path.is_file()
    )


class SchemaNotFound:
    """Every path under `/schema` that nothing serves answers the API's 404 error body.

    Litestar's OpenAPI router answers an HTML page for any path under it that no render
    plugin claims (`/schema/redoc`, `/schema/swagger`, ...); a client of this API expects
    the error body on every 404. Plain ASGI, in front of routing: the served paths are
    the router's fixed ones and the files of the assets' folder, each by its exact path,
    so the static files router never sees another one (a NUL in a path was a 500 from
    its `stat`; `..`, backslashes and overlong names never reach the file system).
    """

    def __init__(self, app: Any, route_paths: Iterable[str]) -> None:
        self.app = app
        self.served = frozenset(
            path for path in route_paths if path.startswith(SCHEMA_PATH) and "{" not in path
        )
        self.assets = asset_paths()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path: str = scope.get("path", "")
        if (
            scope["type"] == "http"
            and path.startswith(f"{SCHEMA_PATH}/")
            and path.rstrip("/") not in self.served
            and path not in self.assets
        ):
            await send_error(send, 404)
            return
        await self.app(scope, receive, send)
