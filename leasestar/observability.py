"""Request ids, access logs and Prometheus metrics, in one pure ASGI wrapper.

One wrapper rather than three so each request is timed once and its status seen
once; it is plain ASGI (no Request object built) because it runs on every request of
the list path that users benchmark.

The access log never contains the Authorization header or the token: only the name
of the token that authenticated the request.

Access lines are written to stderr in batches (`AccessLog`): going through `logging`
and flushing stderr for every request cost about 40 microseconds, a sixth of a list
request. A line waits at most `FLUSH_SECONDS` and all are written at shutdown.
Handlers attached to the `leasestar.access` logger still receive every line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import time
from binascii import hexlify
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any, Final, Literal
from urllib.parse import unquote_plus

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from leasestar.asgi import RESPONSE_HEADERS
from leasestar.log_lines import escaped, one_line
from leasestar.tokens import TokenHolder, redact_token_secrets

LogFormat = Literal["json", "text", "off"]
REQUEST_ID_HEADER: Final = b"x-request-id"
# The status logged and counted for a request whose client left before it was answered.
CLIENT_CLOSED_REQUEST: Final = 499
# A client's request id is echoed only when it is short and plain; otherwise a new one
# is made, so a log line can never be forged or bloated through this header.
_SAFE_REQUEST_ID: Final = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# Filter values that are personal data stay out of the log.
# Personal data and secrets never reach the log: the values of the contract's personal
# filters and of cursors (signed, not encrypted: they carry the walk's filter values and
# the last record's sort keys, names and emails among them), and the secret part of
# anything shaped like one of our tokens (a client that put its token in a URL by
# mistake: the public id still says which token it was).
_REDACTED_PARAMETERS: Final = frozenset({"email_1", "phone_1", "cursor"})
# Only a query holding one of these needs the careful look.
_REDACTION_HINTS: Final = ("email", "phone", "cursor", "lst_", "%")
MAX_LOGGED_QUERY: Final = 1024
_LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_BUCKET_LABELS: Final = (*map(floatToGoString, _LATENCY_BUCKETS), "+Inf")
_REQUESTS_HELP: Final = "HTTP requests served, by route template, method and status."
_LATENCY_HELP: Final = "Time from request start to the end of the response, by route and status."

FLUSH_SECONDS: Final = 0.2
FLUSH_LINES: Final = 256

access_logger = logging.getLogger("leasestar.access")
_encoder = msgspec.json.Encoder()


class RequestCounts:
    """Requests served and their latency by label set, as Prometheus reads them at scrape
    time: `leasestar_http_requests` (a counter by route template, method and status) and
    `leasestar_http_request_duration_seconds` (a histogram by route and status).

    prometheus_client's `Counter` and `Histogram` take a lock for every increment (three
    a request), because a metric may be shared by threads: 3.2 us of a get by id's ~170.
    These counts are only touched from the event loop (requests and `/metrics` alike), so
    they are plain numbers, 0.7 us a request, exposed with the same names and samples.
    """

    def __init__(self) -> None:
        # (route, method, status) -> [requests, first seen]
        self._requests: dict[tuple[str, str, str], list[float]] = {}
        # (route, status) -> [requests in each bucket (not cumulative)..., sum, first seen]
        self._latency: dict[tuple[str, str], list[float]] = {}

    def count(self, route: str, method: str, status: str, seconds: float) -> None:
        requests = self._requests.get((route, method, status))
        if requests is None:
            requests = self._requests[route, method, status] = [0, time.time()]
        requests[0] += 1
        latency = self._latency.get((route, status))
        if latency is None:
            latency = self._latency[route, status] = [0] * (len(_LATENCY_BUCKETS) + 1) + [
                0.0,
                time.time(),
            ]
        latency[bisect_left(_LATENCY_BUCKETS, seconds)] += 1  # a bucket holds <= its bound
        latency[-2] += seconds

    def describe(self) -> Iterator[Metric]:
        """The families' names, reserved in the registry (no samples)."""
        yield Metric("leasestar_http_requests", _REQUESTS_HELP, "counter")
        yield Metric("leasestar_http_request_duration_seconds", _LATENCY_HELP, "histogram")

    def collect(self) -> Iterator[Metric]:
        requests = Metric("leasestar_http_requests", _REQUESTS_HELP, "counter")
        for (route, method, status), (count, created) in self._requests.items():
            labels = {"route": route, "method": method, "status": status}
            requests.add_sample("leasestar_http_requests_total", labels, count)
            requests.add_sample("leasestar_http_requests_created", labels, created)
        yield requests
        name = "leasestar_http_request_duration_seconds"
        latency = Metric(name, _LATENCY_HELP, "histogram")
        for (route, status), counts in self._latency.items():
            labels = {"route": route, "status": status}
            total = 0.0
            for bound, count in zip(_BUCKET_LABELS, counts, strict=False):
                total += count
                latency.add_sample(f"{name}_bucket", {**labels, "le": bound}, total)
            latency.add_sample(f"{name}_count", labels, total)
            latency.add_sample(f"{name}_sum", labels, counts[-2])
            latency.add_sample(f"{name}_created", labels, counts[-1])
        yield latency


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = RequestCounts()
        self.registry.register(self.requests)
        self.applicants = Gauge(
            "leasestar_applicants",
            "Applicant rows in the database (read at scrape time).",
            registry=self.registry,
        )

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _AccessLine(msgspec.Struct):
    """A JSON access line, its fields in this order (built and encoded in 1 us, where the
    same dict took 1.7 us)."""

    time: str
    request_id: str
    method: str
    path: str
    query: str
    status: int
    duration_ms: float
    bytes: int
    token: str | None


class AccessLog:
    """Access lines, one per request, written to stderr in batches (or nowhere)."""

    def __init__(self, log_format: LogFormat) -> None:
        self.format = log_format
        self._pending: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        # The lines are ours to write: they do not also travel up to the root logger.
        access_logger.propagate = False
        access_logger.setLevel(logging.INFO)

    def write(self, line: str) -> None:
        self._pending.append(line)
        if len(self._pending) >= FLUSH_LINES:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not serving: nothing would flush later
                self.flush()
            else:
                self._timer = loop.call_later(FLUSH_SECONDS, self.flush)
        if access_logger.handlers:
            access_logger.info(line)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            lines, self._pending = self._pending, []
            # sys.stderr looked up now, not at start: it may have been replaced since.
            try:
                sys.stderr.write("\n".join(lines) + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                # stderr is gone (a closed pipe, a closed file): the lines are lost, as
                # logging's own handlers lose them, but serving goes on.
                pass


class ObservabilityMiddleware:
    """Gives every request an id (echoed in `X-Request-ID`), logs it, and counts it."""

    def __init__(self, app: Any, metrics: Metrics, access_log: AccessLog) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log
        self.log_format = access_log.format
        self._request_ids = _RequestIds()

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
            request_id = self._request_ids.draw()
        request_id_text = request_id.decode()
        scope.setdefault("state", {})["request_id"] = request_id_text
        status = 500
        answered = False
        sent = 0

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status, answered, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                answered = True
                message["headers"] = [
                    *message.get("headers", ()),
                    *scope.get(RESPONSE_HEADERS, ()),
                    (REQUEST_ID_HEADER, request_id),
                ]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
            if not answered:
                # Returned without an answer: only a request whose client left while it
                # waited (leasestar/disconnect.py) does that. nginx's "client closed
                # request", not a server error.
                status = CLIENT_CLOSED_REQUEST
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("path_template") or "unmatched"
            self.metrics.requests.count(route, method, str(status), elapsed)
            if self.log_format != "off":
                self._log(scope, method, status, elapsed, sent, request_id_text)

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
        path = redact_token_secrets(scope["path"])
        query = loggable_query(scope["query_string"][:MAX_LOGGED_QUERY].decode("latin-1"))
        if self.log_format == "json":
            line = one_line(
                _encoder.encode(
                    _AccessLine(
                        _now_text(),
                        request_id,
                        method,
                        path,
                        query,
                        status,
                        int(elapsed * 1e6 + 0.5) / 1000,  # to the microsecond; round() took 0.8 us
                        sent,
                        token,
                    )
                ).decode()
            )
        else:
            # Escaped: a path's `%0a` would end the line there (leasestar/log_lines.py).
            target = escaped(f"{path}?{query}" if query else path)
            line = (
                f"{method} {target} {status} {elapsed * 1000:.1f}ms {sent}B "
                f"token={token or '-'} request_id={request_id}"
            )
        self.access_log.write(line)


class _RequestIds:
    """Request ids of 128 random bits each, as hex: a counted id would tell any caller
    how much traffic the server has had since the last one it saw. Drawn from the OS
    `BATCH` at a time (a system call per request cost more than the rest of the id)."""

    BATCH: Final = 256

    def __init__(self) -> None:
        self._drawn = b""
        self._next = 0

    def draw(self) -> bytes:
        if self._next >= len(self._drawn):
            self._drawn = hexlify(os.urandom(16 * self.BATCH))
            self._next = 0
        start = self._next
        self._next = start + 32
        return self._drawn[start : start + 32]


def loggable_query(query: str) -> str:
    """The query string as logged: each parameter as sent, but with the value of a
    personal filter or a cursor, or one holding a token, replaced by `REDACTED`. Names and values
    are judged percent-decoded, so `email%5F1=` or an encoded token is caught too."""
    # Most requests have no query string (a get by id): spared the generator's 0.6 us.
    if not query or not any(hint in query for hint in _REDACTION_HINTS):
        return query
    parts = query.split("&")
    for index, part in enumerate(parts):
        name, equals, _ = part.partition("=")
        decoded = unquote_plus(part)
        if unquote_plus(name) in _REDACTED_PARAMETERS or redact_token_secrets(decoded) != decoded:
            parts[index] = f"{name}{equals}REDACTED" if equals else "REDACTED"
    return "&".join(parts)


_clock: list[Any] = [0, ""]


def _now_text() -> str:
    """The current UTC second as text, formatted once per second."""
    second = int(time.time())
    if second != _clock[0]:
        _clock[0] = second
        _clock[1] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
    return str(_clock[1])
