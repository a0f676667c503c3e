"""Service routes outside the versioned API: `/health` and `/metrics`."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, MediaType, Request, Response, get
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from app.applicants.storage import ApplicantReader
from app.observability import Metrics


class HealthStatus(msgspec.Struct):
    status: str


class ServiceController(Controller):
    tags = ["service"]  # noqa: RUF012 - Litestar reads this class attribute as declared

    @get(
        "/health",
        operation_id="health",
        summary="Liveness and database check",
        exclude_from_auth=True,
        media_type=MediaType.JSON,
    )
    async def health(self, request: Request[Any, Any, State]) -> HealthStatus:
        """`{"status": "ok"}` when a read of the database succeeds; 503 otherwise."""
        reader: ApplicantReader = request.app.state.reader
        try:
            await reader.data_version()
        except Exception as error:
            raise HTTPException(status_code=503, detail="database unavailable") from error
        return HealthStatus(status="ok")

    @get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics",
        exclude_from_auth=True,
        include_in_schema=False,
        media_type=MediaType.TEXT,
    )
    async def metrics(self, request: Request[Any, Any, State]) -> Response[bytes]:
        """Request counts and latencies per route and status, and the row count.

        Counted per worker process: with several workers each answers for itself.
        """
        reader: ApplicantReader = request.app.state.reader
        metrics: Metrics = request.app.state.metrics
        metrics.applicants.set(await reader.total_rows())
        body, content_type = metrics.render()
        return Response(content=body, media_type=content_type)
