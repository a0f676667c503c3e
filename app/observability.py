"""Request ids, access logs and Prometheus metrics, in one pure ASGI wrapper.

One wrapper rather than three so each request is timed once and its status seen
once; it is plain ASGI (no Request object built) because it runs on every request of
the list path that users benchmark.

The access log never contains the Authorization header or the token: only the name
of the token that authenticated the request.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from typing import Any, Final, Literal

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from app.auth import TokenHolder

LogFormat = Literal["json", "text", "off"]
REQUEST_ID_HEADER: Final = b"x-request-id"
# A client's request id is echoed only when it is short and plain; otherwise a new one
# is made, so a log line can never be forged or bloated through this header.
_SAFE_REQUEST_ID: Final = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# Filter values that are personal data stay out of the log.
_PERSONAL_FILTERS: Final = re.compile(r"((?:^|&)(?:email_1|phone_1)=)[^&]*")
MAX_LOGGED_QUERY: Final = 1024
_LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

access_logger = logging.getLogger("leasestar.access")
_encoder = msgspec.json.Encoder()


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "leasestar_http_requests",
            "HTTP requests served, by route template, method and status.",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "leasestar_http_request_duration_seconds",
            "Time from request start to the end of the response, by route and status.",
            ("route", "status"),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.applicants = Gauge(
            "leasestar_applicants",
            "Applicant rows in the database (read at scrape time).",
            registry=self.registry,
        )

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def configure_access_log(log_format: LogFormat) -> None:
    """Send access lines, one per request, to stderr (or nowhere)."""
    access_logger.handlers.clear()
    access_logger.propagate = False
    if log_format == "off":
        access_logger.disabled = True
        return
    access_logger.disabled = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_logger.addHandler(handler)
    access_logger.setLevel(logging.INFO)


class ObservabilityMiddleware:
    """Gives every request an id (echoed in `X-Request-ID`), logs it, and counts it."""

    def __init__(self, app: Any, metrics: Metrics, log_format: LogFormat) -> None:
        self.app = app
        self.metrics = metrics
        self.log_format = log_format

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method = scope["method"]  # before HEAD is routed as GET
        request_id = b""
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER and _SAFE_REQUEST_ID.fullmatch(value):
                request_id = value
                break
        if not request_id:
            request_id = uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = request_id.decode()
        status = 500
        sent = 0

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, request_id)]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("path_template") or "unmatched"
            status_text = str(status)
            self.metrics.requests.labels(route, method, status_text).inc()
            self.metrics.latency.labels(route, status_text).observe(elapsed)
            if self.log_format != "off":
                self._log(scope, method, status, elapsed, sent, request_id.decode())

    def _log(
        self,
        scope: dict[str, Any],
        method: str,
        status: int,
        elapsed: float,
        sent: int,
        request_id: str,
    ) -> None:
        user = scope.get("user")
        token = user.name if isinstance(user, TokenHolder) else None
        path = scope["path"]
        query = _PERSONAL_FILTERS.sub(
            r"\1REDACTED", scope["query_string"][:MAX_LOGGED_QUERY].decode("latin-1")
        )
        if self.log_format == "json":
            line = _encoder.encode(
                {
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "request_id": request_id,
                    "method": method,
                    "path": path,
                    "query": query,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 3),
                    "bytes": sent,
                    "token": token,
                }
            ).decode()
        else:
            target = f"{path}?{query}" if query else path
            line = (
                f"{method} {target} {status} {elapsed * 1000:.1f}ms {sent}B "
                f"token={token or '-'} request_id={request_id}"
            )
        access_logger.info(line)
