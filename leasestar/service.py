"""Service routes outside the versioned API: `/health` and `/metrics`.

`/metrics` shows every tenant's row count and the traffic of every route, so it is served
only on a listener of its own (`LEASESTAR_METRICS_ADDRESS`), never on the API's.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import msgspec
from litestar import Controller, MediaType, Request, Response, get
from litestar.datastructures import State

from leasestar.applicants.storage import ApplicantReader
from leasestar.config import ListenAddress
from leasestar.database import ReadPool, read_uri
from leasestar.errors import error_response
from leasestar.observability import Metrics
from leasestar.openapi import error_responses, operation_class
from leasestar.replica.layout import ReplicaLayout
from leasestar.replica.status import ReplicaHealth, ReplicaMetrics, health_of, read_status
from leasestar.webhooks.metrics import WebhookCollector

logger = logging.getLogger("leasestar.health")


class HealthStatus(msgspec.Struct):
    status: Literal["ok"]
    # Only on a replica: how fresh what it serves is (see the README, "Edge replicas").
    # Documented as the object itself (`openapi.finish_document`).
    replica: ReplicaHealth | msgspec.UnsetType = msgspec.UNSET


def _replica_health(state: State) -> ReplicaHealth | None:
    layout: ReplicaLayout | None = state.replica
    if layout is None:
        return None
    status = read_status(layout.status_path)
    return health_of(status) if status is not None else None


@dataclass(frozen=True, slots=True)
class DatabaseFile:
    """The database file the server opened, remembered to tell whether it is still there.

    Open connections keep reading a file that was deleted or replaced under them, so a
    query on the pool alone would call a server healthy that serves a file nobody can
    see any more.
    """

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> DatabaseFile:
        stat = path.stat()
        return cls(path, stat.st_dev, stat.st_ino)

    def check(self) -> None:
        """Raise unless the path still holds the opened file and a new connection reads it."""
        stat = self.path.stat()
        if (stat.st_dev, stat.st_ino) != (self.device, self.inode):
            raise OSError(f"{self.path} was replaced after the server started")
        connection = sqlite3.connect(read_uri(self.path), uri=True)
        try:
            connection.execute("SELECT change_seq FROM sync_state").fetchone()
        finally:
            connection.close()


def on_listener(scope: Any, address: ListenAddress | None) -> bool:
    """Whether the request came in on the listener at `address` (told apart by its port,
    which `leasestar serve` keeps distinct from the API's)."""
    server = scope.get("server")
    return address is not None and server is not None and server[1] == address.port


class ServiceController(Controller):
    tags = ["service"]  # noqa: RUF012 - Litestar reads this class attribute as declared

    @get(
        "/health",
        operation_id="health",
        summary="Liveness and database check",
        exclude_from_auth=True,
        media_type=MediaType.JSON,
        response_description="The database answers and the columnar copy is ready.",
        responses=error_responses(400, 405, 413, 414, 431, 500, 503),
        operation_class=operation_class(public=True),
    )
    async def health(self, request: Request[Any, Any, State]) -> Response[HealthStatus]:
        """`{"status": "ok"}` when the server's connections and a new connection both read
        the database file it opened, and the columnar copy is ready (every list then
        answers at its normal latency); 503 with the error body otherwise, saying why.
        No token needed."""
        pool: ReadPool = request.app.state.read_pool
        database: DatabaseFile = request.app.state.database_file
        reader: ApplicantReader = request.app.state.reader
        try:
            await pool.check()
            await asyncio.to_thread(database.check)
        except Exception as error:  # whatever the cause, the database cannot serve
            logger.warning("health check failed: %s", error)
            return cast(
                "Response[HealthStatus]", error_response(503, "the database is unavailable")
            )
        unready = reader.copy_unready()
        if unready is not None:
            return cast("Response[HealthStatus]", error_response(503, f"not ready: {unready}"))
        replica = _replica_health(request.app.state)
        return Response(HealthStatus(status="ok", replica=replica or msgspec.UNSET))

    @get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics",
        exclude_from_auth=True,
        media_type=MediaType.TEXT,
        response_description="Prometheus' text exposition format (no token needed).",
        responses=error_responses(
            400,
            404,
            405,
            413,
            414,
            431,
            500,
            described={
                404: "Asked on another address than the metrics address "
                "(`LEASESTAR_METRICS_ADDRESS`, off by default), the API's included."
            },
        ),
        operation_class=operation_class(public=True),
    )
    async def metrics(self, request: Request[Any, Any, State]) -> Response[bytes]:
        """Request counts and latencies per route and status, and the row count.

        Served only on the metrics address (`LEASESTAR_METRICS_ADDRESS`); 404 on any other
        listener, the API's included. Counted per worker process: with several workers
        each answers for itself.
        """
        if not on_listener(request.scope, request.app.state.metrics_address):
            return error_response(404)
        reader: ApplicantReader = request.app.state.reader
        metrics: Metrics = request.app.state.metrics
        metrics.applicants.set(await reader.total_rows())
        replica_metrics: ReplicaMetrics | None = request.app.state.replica_metrics
        if replica_metrics is not None:
            replica_metrics.update(_replica_health(request.app.state))
        webhook_metrics: WebhookCollector | None = request.app.state.webhook_metrics
        if webhook_metrics is not None:
            await asyncio.to_thread(webhook_metrics.refresh)  # its SQL, off the event loop
        body, content_type = metrics.render()
        # Set as is: Litestar would append a second `charset` to a text/* media type, and
        # Prometheus 3 refuses a malformed Content-Type.
        return Response(content=body, headers={"content-type": content_type})
