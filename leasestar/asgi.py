"""Small ASGI pieces for the hot path: one header read from the scope, headers an inner
layer adds to the response, and a response whose body is JSON already encoded.

Both exist because the list route is what users benchmark: building Litestar's
`Headers` object to read one header, or a full `Response` (header normalisation,
cookies, background tasks) to send bytes that are already the answer, cost together
about a tenth of a list request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from litestar import Response
from litestar.response import Stream

_JSON_TYPE = (b"content-type", b"application/json")

# What a negotiated answer varies by (RFC 9110, 12.5.5), sent whether or not the answer
# came out compressed or streamed, and on its 304 too (15.4.5), so that a cache keeps the
# identity, compressed and NDJSON answers of one URL apart. The list route chooses by
# Accept (JSON or NDJSON) and Accept-Encoding; the record route by Accept-Encoding only.
VARY_LIST: Final = (b"vary", b"Accept, Accept-Encoding")
VARY_RECORD: Final = (b"vary", b"Accept-Encoding")

RESPONSE_HEADERS: Final = "leasestar.response_headers"
"""Scope key: raw headers an inner layer adds to the response, whatever answers the
request (the route, an error handler). The outermost layer (`ObservabilityMiddleware`),
which rewrites every response's start anyway, appends them: each layer that wrapped
`send` to add its own headers cost a coroutine call per message."""


def add_response_headers(scope: Any, headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Have the response to this request carry `headers`, whatever answers it: appended
    after the answer's own headers, in the order layers add them (`RESPONSE_HEADERS`)."""
    scope.setdefault(RESPONSE_HEADERS, []).extend(headers)


def header_value(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of the (lower-case) header `name`; None when absent or not ASCII."""
    for key, value in headers:
        if key == name or key.lower() == name:  # servers send lower case; be sure
            try:
                return value.decode("ascii")
            except UnicodeDecodeError:
                return None
    return None


class PreEncodedJSON(Response[Any]):
    """A JSON response whose body bytes are final: sent as they are.

    Litestar turns a handler's `Response` into an ASGI app with `to_asgi_response`;
    this one is its own ASGI app, so nothing is normalised, encoded or copied. Handlers
    keep their `Response[Envelope]` annotation, from which the OpenAPI document is made.
    """

    def __init__(
        self,
        body: bytes,
        *,
        status_code: int = 200,
        etag: str | None = None,
        vary: tuple[bytes, bytes] | None = None,
    ) -> None:
        # No super().__init__(): nothing of the general Response is used.
        self._body = body
        self._status = status_code
        # A 304 has no body, hence neither a length nor a type (RFC 9110, 15.4.5).
        headers = [] if status_code == 304 else [(b"content-length", b"%d" % len(body)), _JSON_TYPE]
        if etag is not None:
            headers.append((b"etag", etag.encode("ascii")))
        if vary is not None:
            headers.append(vary)
        self._raw_headers = headers

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        return self

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self._status, "headers": self._raw_headers}
        )
        await send({"type": "http.response.body", "body": self._body})


class OwnTypeStream(Stream):
    """A streamed response whose own media type wins over the route's.

    Litestar's `Stream.to_asgi_response` prefers the route's media type to the
    response's, although its docstring says the opposite; the list route is declared
    JSON (its page) and also streams NDJSON.
    """

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)
