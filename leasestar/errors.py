"""The error vocabulary of the API and the handlers that render it.

Every non-2xx answer has one body, `{"error": {"code", "message", "details"}}`; each
exception class maps to exactly one renderer here, so no route writes an error body.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, NotAuthorizedException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import ExceptionHandlersMap

from leasestar.client.errors import ErrorBody, ErrorCode, ErrorDetail, ErrorDetails
from leasestar.rate_limit import TooManyAtOnce
from leasestar.tokens import redact_token_secrets

logger = logging.getLogger("leasestar.errors")

ERROR_CODES: dict[int, ErrorCode] = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    414: "uri_too_long",
    429: "rate_limited",
    431: "request_header_fields_too_large",
    500: "internal_error",
    503: "service_unavailable",
}
ERROR_MESSAGES: dict[int, str] = {
    401: "a valid bearer token is required",
    404: "no such resource",
    405: "method not allowed",
    429: "too many requests",
    500: "internal error",
}


class InvalidParameter(Exception):
    """A query parameter broke its rule; rendered as 400 `invalid_request`."""

    def __init__(self, parameter: str, value: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value
        self.message = message


_encoder = msgspec.json.Encoder()


def error_body(
    status: int, message: str | None = None, details: ErrorDetails | None = None
) -> bytes:
    """The one place an error body is written."""
    return _encoder.encode(
        ErrorBody(
            ErrorDetail(
                code=ERROR_CODES.get(
                    status, "invalid_request" if status < 500 else "internal_error"
                ),
                message=message or ERROR_MESSAGES.get(status, "request failed"),
                details=details or ErrorDetails(),
            )
        )
    )


def error_response(
    status: int,
    message: str | None = None,
    details: ErrorDetails | None = None,
    headers: dict[str, str] | None = None,
) -> Response[bytes]:
    """An error body as a Litestar response."""
    return Response(
        content=error_body(status, message, details),
        status_code=status,
        media_type=MediaType.JSON,
        headers=headers,
    )


def _invalid_parameter(_: Request[Any, Any, Any], exc: InvalidParameter) -> Response[bytes]:
    return error_response(
        400, exc.message, details=ErrorDetails(parameter=exc.parameter, value=exc.value)
    )


def _http_exception(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    headers = dict(exc.headers or {})
    if isinstance(exc, NotAuthorizedException) or status == 401:
        # Say nothing about why: missing, malformed, unknown and revoked look alike.
        return error_response(401, headers={"WWW-Authenticate": "Bearer"})
    if status >= 500:
        logger.error("server error %s: %s", status, exc.detail)
        return error_response(500)
    if status == 429:
        # The rate limit sets it itself (rate_limit.py): the seconds until the window
        # ends, or 1 for a token with too many requests at once.
        headers.setdefault("Retry-After", "1")
    message = ERROR_MESSAGES.get(status) if status in (404, 405, 429) else None
    if isinstance(exc, TooManyAtOnce):  # not the budget: say what was refused
        message = exc.detail
    if message is None:
        message = exc.detail if isinstance(exc.detail, str) and exc.detail else "bad request"
    return error_response(status, message, headers=headers or None)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # The log gets the trace; the client gets nothing it could learn the internals from.
    # A token pasted into a path by mistake keeps its secret out of the log here too.
    path = redact_token_secrets(request.url.path)
    logger.exception("unhandled error on %s %s", request.method, path, exc_info=exc)
    return error_response(HTTP_500_INTERNAL_SERVER_ERROR)


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    InvalidParameter: _invalid_parameter,
    HTTPException: _http_exception,
    Exception: _unexpected,
}
