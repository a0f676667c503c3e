"""The application factory: routes, OpenAPI, errors, auth and resources wired in one place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from litestar import Litestar, Router
from litestar.logging.config import LoggingConfig
from litestar.middleware import DefineMiddleware
from litestar.middleware.rate_limit import RateLimitConfig
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, License, SecurityScheme
from litestar.types import ASGIApp

from leasestar import __version__
from leasestar.allocator import keep_freed_memory
from leasestar.applicants.changes import ChangeWatcher
from leasestar.applicants.controller import ApplicantController
from leasestar.applicants.cursors import CursorCodec
from leasestar.applicants.direct_route import DirectRoutes
from leasestar.applicants.storage import ApplicantReader
from leasestar.auth import BearerTokenMiddleware, TokenRegistry
from leasestar.compression import CompressionMiddleware
from leasestar.config import Settings
from leasestar.database import ReadPool, open_for_write
from leasestar.docs import SchemaNotFound, docs_assets, docs_page
from leasestar.errors import EXCEPTION_HANDLERS
from leasestar.hygiene import HygieneMiddleware
from leasestar.log_lines import install_formatter, logging_formatters
from leasestar.observability import AccessLog, Metrics, ObservabilityMiddleware
from leasestar.openapi import TAGS, finish_document
from leasestar.rate_limit import SharedRateLimitMiddleware, TokenLimits, counter_path
from leasestar.replica.layout import ReplicaLayout
from leasestar.replica.status import ReplicaMetrics
from leasestar.service import DatabaseFile, ServiceController
from leasestar.supervision import die_with_supervisor
from leasestar.webhooks.deliverer import Deliverer, run_deliverer
from leasestar.webhooks.metrics import WebhookCollector
from leasestar.webhooks.routes import WebhookController

UNAUTHENTICATED_PATHS = ["^/schema", "^/health", "^/metrics"]
COPY_WAIT_SECONDS = 1.0


def create_app(settings: Settings | None = None, *, direct_route: bool = True) -> Litestar:
    """Build the Litestar app for a database; the schema is applied on start.

    `direct_route=False` leaves the list and get by id to Litestar's router as well (the
    direct routes answer them in front of the router otherwise: `applicants/direct_route.py`);
    for the tests and benchmarks that compare the two.
    """
    settings = settings or Settings.from_env()
    metrics = Metrics()
    access_log = AccessLog(settings.log_format)
    # One line per record, whatever a request holds, in every logger that can quote one.
    install_formatter(settings.log_format)
    # A replica's database is written only by its follower (`leasestar.replica`).
    layout = ReplicaLayout(settings.db_path)
    replica = layout if layout.marker() is not None else None
    replica_metrics = ReplicaMetrics(metrics.registry) if replica is not None else None
    webhook_metrics = WebhookCollector(settings.db_path) if replica is None else None
    if webhook_metrics is not None:
        metrics.registry.register(webhook_metrics)
    limits = (
        TokenLimits(counter_path(settings.db_path), settings.token_concurrency)
        if settings.rate_limit is not None
        else None
    )

    @asynccontextmanager
    async def database(app: Litestar) -> AsyncIterator[None]:
        if replica is None:
            open_for_write(settings.db_path).close()  # create or migrate before reading
        pool = ReadPool(settings.db_path, settings.read_connections)
        await pool.open()
        reader = ApplicantReader(pool, recent_pages_bytes=settings.page_cache_mb << 20)
        # Opened in the background; a small database's copy is ready before the server
        # listens, a large one's while `/health` says it is not (503).
        await reader.copy_ready_within(COPY_WAIT_SECONDS)
        app.state.read_pool = pool
        app.state.database_file = DatabaseFile.of(settings.db_path)
        app.state.reader = reader
        app.state.change_watcher = ChangeWatcher(reader.data_version)
        app.state.metrics = metrics
        app.state.webhook_metrics = webhook_metrics
        app.state.replica = replica
        app.state.replica_metrics = replica_metrics
        app.state.metrics_address = settings.metrics_address
        app.state.cursor_codec = CursorCodec(await reader.cursor_key())
        app.state.tokens = TokenRegistry(settings.db_path)
        pool.reopen_with(app.state.tokens)
        if limits is not None:
            limits.open()
        # Webhooks: one worker delivers, the others stand by (webhooks/deliverer.py);
        # a replica never sends.
        deliverer = Deliverer(settings.db_path) if replica is None else None
        app.state.deliverer = deliverer
        delivering = asyncio.create_task(run_deliverer(deliverer)) if deliverer else None
        try:
            yield
        finally:
            if delivering is not None:
                delivering.cancel()
                # Waited for, not awaited: a task cancelled before its first step ends
                # with CancelledError whatever run_deliverer catches (a lifespan that
                # ends at once, as in the tests' in-process apps).
                await asyncio.wait([delivering])
            access_log.flush()
            await app.state.change_watcher.close()
            app.state.tokens.close()
            if limits is not None:
                limits.close()
            await reader.close()
            await pool.close()

    middleware: list[Any] = [DefineMiddleware(BearerTokenMiddleware, exclude=UNAUTHENTICATED_PATHS)]
    api: Any = ApplicantController
    middleware_of_api: DefineMiddleware | None = None
    if settings.rate_limit is not None and limits is not None:
        # After authentication, so the limit is keyed on the token; counted in a file
        # every worker shares (leasestar/rate_limit.py). Mounted on the API's routes
        # alone: the service and documentation routes never meet it, and no request
        # pays for matching its path against patterns to exclude.
        limiter = RateLimitConfig(
            rate_limit=(settings.rate_limit.unit, settings.rate_limit.requests),
            middleware_class=SharedRateLimitMiddleware,
        )
        middleware_of_api = DefineMiddleware(
            SharedRateLimitMiddleware, config=limiter, limits=limits
        )
        api = Router("/", route_handlers=[ApplicantController], middleware=[middleware_of_api])

    app = Litestar(
        route_handlers=[api, ServiceController, WebhookController, docs_assets()],
        lifespan=[database],
        exception_handlers=EXCEPTION_HANDLERS,
        logging_config=LoggingConfig(formatters=logging_formatters(settings.log_format)),
        middleware=middleware,
        openapi_config=OpenAPIConfig(
            title="leasestar",
            version=__version__,
            description=(
                "Normalized property-management applicant records, served read-only "
                "from an embedded SQLite database."
            ),
            license=License(name="MIT", identifier="MIT"),
            tags=TAGS,
            path="/schema",
            render_plugins=[docs_page()],
            use_handler_docstrings=True,
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
    # Built once here (~50 ms) rather than on the first request for the document, so
    # that what Litestar cannot say is added before anything serves it.
    finish_document(app.openapi_schema)
    # Route middleware only sees matched routes; these must see every request
    # (unknown paths, oversized ones), so they wrap the app's ASGI handler, as
    # Litestar itself does for CORS. The list and get by id are answered inside them, in
    # front of Litestar's router, by the same rules as their routes (direct_route.py).
    handler = cast("ASGIApp", SchemaNotFound(app.asgi_handler, (r.path for r in app.routes)))
    if direct_route:
        handler = cast("ASGIApp", DirectRoutes(handler, app, middleware_of_api))
    if settings.compression:
        # Compressed answers are 5-7x smaller than the pages: a quarter of the pages'
        # budget keeps more of them than there are pages kept.
        kept = (settings.page_cache_mb << 20) // 4
        handler = cast("ASGIApp", CompressionMiddleware(handler, kept_bytes=kept))
    app.asgi_handler = cast(
        "ASGIApp", ObservabilityMiddleware(HygieneMiddleware(handler), metrics, access_log)
    )
    return app


def create_app_from_env() -> Litestar:
    """Factory for `uvicorn --factory`: settings from `LEASESTAR_*` variables."""
    die_with_supervisor()
    keep_freed_memory()  # a server's worker: its pages' buffers stay in its heap
    return create_app(Settings.from_env())
