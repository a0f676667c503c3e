"""The application factory: routes, OpenAPI, errors, auth and resources wired in one place."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import ScalarRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from app import __version__
from app.applicants.controller import ApplicantController
from app.applicants.cursors import CursorCodec
from app.applicants.storage import ApplicantReader
from app.auth import BearerTokenMiddleware
from app.config import Settings
from app.database import ReadPool, open_for_write
from app.errors import EXCEPTION_HANDLERS
from app.health import HealthController

UNAUTHENTICATED_PATHS = ["^/schema", "^/health"]


def create_app(settings: Settings | None = None) -> Litestar:
    """Build the Litestar app for a database; the schema is applied on start."""
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def database(app: Litestar) -> AsyncIterator[None]:
        open_for_write(settings.db_path).close()  # create or migrate before reading
        pool = ReadPool(settings.db_path, settings.read_connections)
        await pool.open()
        app.state.read_pool = pool
        app.state.reader = ApplicantReader(pool)
        app.state.cursor_codec = CursorCodec(await app.state.reader.cursor_key())
        try:
            yield
        finally:
            await pool.close()

    return Litestar(
        route_handlers=[ApplicantController, HealthController],
        lifespan=[database],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[
            DefineMiddleware(BearerTokenMiddleware, exclude=UNAUTHENTICATED_PATHS),
        ],
        openapi_config=OpenAPIConfig(
            title="leasestar",
            version=__version__,
            description=(
                "Normalized property-management applicant records, served read-only "
                "from an embedded SQLite database."
            ),
            path="/schema",
            render_plugins=[ScalarRenderPlugin()],
            security=[{"BearerToken": []}],
            components=Components(
                security_schemes={
                    "BearerToken": SecurityScheme(
                        type="http",
                        scheme="bearer",
                        description="A token from `leasestar token create`.",
                    )
                }
            ),
        ),
    )


def create_app_from_env() -> Litestar:
    """Factory for `uvicorn --factory`: settings from `LEASESTAR_*` variables."""
    return create_app(Settings.from_env())
