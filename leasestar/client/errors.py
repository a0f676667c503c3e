"""The error body of every non-2xx answer, and the exceptions the client raises for it.

The server renders its error bodies from these Structs (leasestar/errors.py) and
documents them in OpenAPI from them, so `code` is an enum of exactly the codes it sends
and `details` has exactly the keys it fills; the client decodes the same Structs.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

ErrorCode = Literal[
    "invalid_request",
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "request_too_large",
    "uri_too_long",
    "rate_limited",
    "request_header_fields_too_large",
    "internal_error",
    "service_unavailable",
]


# A field that is a string when present: plain `string` in the document, not the
# one-member oneOf that `str | UnsetType` would give (generators trip on it).
_STRING = {"extra": {"one_of": None, "type": "string"}}


class ErrorDetails(msgspec.Struct, kw_only=True, gc=False):
    """What more the server says about a refusal; `{}` when nothing.

    A 400 for a query parameter names it (`parameter`) and the value refused (`value`).
    Unset fields are left out of the JSON, and keys a later server adds are ignored.
    """

    parameter: Annotated[
        str | msgspec.UnsetType,
        msgspec.Meta(description="The query parameter refused.", extra_json_schema=_STRING),
    ] = msgspec.UNSET
    value: Annotated[
        str | msgspec.UnsetType,
        msgspec.Meta(description="The value refused, as sent.", extra_json_schema=_STRING),
    ] = msgspec.UNSET


class ErrorDetail(msgspec.Struct, gc=False):
    code: ErrorCode
    message: str
    details: ErrorDetails  # always present, {} when there is nothing more to say


class ErrorBody(msgspec.Struct, gc=False):
    """Every non-2xx body: `{"error": {"code", "message", "details"}}`."""

    error: ErrorDetail


class LeasestarError(Exception):
    """An answer the client cannot turn into data: a non-2xx status, with its body.

    `status` is the HTTP status; `code`, `message` and `details` are the error body's
    (for a body that is not one, `code` follows the status and `message` is the text);
    `request_id` is the server's `X-Request-ID`, the key to its log line.
    """

    def __init__(
        self,
        status: int,
        error: ErrorDetail,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {error.code}: {error.message}")
        self.status = status
        self.code: ErrorCode = error.code
        self.message = error.message
        self.details = error.details
        self.request_id = request_id
        self.retry_after = retry_after


class InvalidRequest(LeasestarError):
    """400: a parameter is unknown, repeated or breaks its rule (`details` names it)."""


class Unauthorized(LeasestarError):
    """401: the token is missing, malformed, unknown or revoked."""


class NotFound(LeasestarError):
    """404: no such applicant visible to this token."""


class RateLimited(LeasestarError):
    """429 after the client's retries ran out; `retry_after` is the server's last wait."""


class ServerError(LeasestarError):
    """5xx: a fault of the server or its database; the server log has it by `request_id`."""


_BY_CODE: dict[str, type[LeasestarError]] = {
    "invalid_request": InvalidRequest,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "rate_limited": RateLimited,
}
_error_decoder = msgspec.json.Decoder(ErrorBody)


def error_for(
    status: int,
    body: bytes,
    request_id: str | None = None,
    retry_after: float | None = None,
) -> LeasestarError:
    """The typed exception for a non-2xx answer (any body: a proxy's HTML page too)."""
    try:
        detail = _error_decoder.decode(body).error
    except msgspec.DecodeError:  # ValidationError is one
        code: ErrorCode = "internal_error" if status >= 500 else "invalid_request"
        text = body.decode("utf-8", "replace").strip()[:200] or "no error body"
        detail = ErrorDetail(code, text, ErrorDetails())
    kind = ServerError if status >= 500 else _BY_CODE.get(detail.code, LeasestarError)
    return kind(status, detail, request_id, retry_after)
