"""`GET /health`: answers ok only once the database really answers a query."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from app.applicants.storage import ApplicantReader


class HealthStatus(msgspec.Struct):
    status: str


class HealthController(Controller):
    path = "/health"
    tags = ["service"]  # noqa: RUF012

    @get("/", operation_id="health", summary="Liveness and database check", exclude_from_auth=True)
    async def health(self, request: Request[Any, Any, State]) -> HealthStatus:
        """`{"status": "ok"}` when a read of the database succeeds."""
        reader: ApplicantReader = request.app.state.reader
        try:
            await reader.data_version()
        except Exception as error:
            raise HTTPException(status_code=503, detail="database unavailable") from error
        return HealthStatus(status="ok")
