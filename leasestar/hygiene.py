"""Request hygiene: size limits, HEAD, and the headers every API response carries.

Plain ASGI, outside Litestar's routing, so an oversized request is refused before any
work is done for it, with the same error body as every other refusal.
"""

from __future__ import annotations

from typing import Any, Final

from leasestar.asgi import HEAD_ROUTED_AS_GET, add_response_headers
from leasestar.errors import error_body

MAX_TARGET_BYTES: Final = 8 * 1024  # path + query string
MAX_HEADER_BYTES: Final = 16 * 1024  # all request headers together
MAX_QUERY_PARAMETERS: Final = 64

# Responses of the authenticated API hold personal data: never cache them, never let a
# browser guess their type.
API_HEADERS: Final = (
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
)


async def send_error(
    send: Any,
    status: int,
    message: str | None = None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """Answer `status` with the error body, from plain ASGI (before routing)."""
    body = error_body(status, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _with_head(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    """An `Allow` header that names GET gets HEAD beside it; any other header is kept."""
    if name.lower() != b"allow":
        return name, value
    methods = [method.strip() for method in value.split(b",")]
    if b"GET" in methods and b"HEAD" not in methods:
        methods.insert(methods.index(b"GET") + 1, b"HEAD")
    return name, b", ".join(methods)


class HygieneMiddleware:
    """Refuses oversized requests, answers HEAD like GET without a body, and adds
    `Cache-Control: no-store` and `X-Content-Type-Options: nosniff` under `/v1`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = scope["path"].startswith("/v1")
        extra = API_HEADERS if api else ()
        query = scope["query_string"]
        raw_path = scope.get("raw_path") or scope["path"].encode()
        # ASGI's raw_path holds no query string, but some clients (Litestar's test
        # client) put it there: count the query once either way.
        target = len(raw_path) if b"?" in raw_path else len(raw_path) + len(query)
        if target > MAX_TARGET_BYTES:
            await send_error(
                send, 414, f"the request target is longer than {MAX_TARGET_BYTES} bytes", extra
            )
            return
        if sum(len(name) + len(value) for name, value in scope["headers"]) > MAX_HEADER_BYTES:
            message = f"the request headers exceed {MAX_HEADER_BYTES} bytes"
            await send_error(send, 431, message, extra)
            return
        if query.count(b"&") >= MAX_QUERY_PARAMETERS:
            await send_error(
                send,
                400,
                f"a request may carry at most {MAX_QUERY_PARAMETERS} query parameters",
                extra,
            )
            return
        if api:
            # Added by the layer that rewrites every response's start anyway (asgi.py):
            # a `send` wrapper of its own here was a coroutine more per message.
            add_response_headers(scope, API_HEADERS)
        method = scope["method"]
        head = method == "HEAD"
        if head:
            # HEAD is GET without the body: route it as GET. The server decides from
            # scope["method"] whether to send a body, so HEAD is put back before the
            # response starts; it then sends the GET's headers (its length included)
            # and drops the body itself.
            scope["method"] = "GET"
            scope[HEAD_ROUTED_AS_GET] = True
        # Only a method other than GET or HEAD can draw an `Allow` (a 405, or OPTIONS'
        # 204). Litestar lists the routes' own methods there; HEAD, answered here, is
        # added beside GET.
        may_allow = not head and method != "GET"
        if not head and not may_allow:
            await self.app(scope, receive, send)
            return

        async def send_filtered(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                if head:
                    scope["method"] = "HEAD"
                if may_allow:
                    message["headers"] = [
                        _with_head(name, value) for name, value in message.get("headers", ())
                    ]
            await send(message)

        await self.app(scope, receive, send_filtered)
