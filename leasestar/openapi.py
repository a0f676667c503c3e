"""What the OpenAPI document says beyond the handlers' signatures.

Litestar documents a handler's parameters and its success body. The rest of what a
client meets is added by plain ASGI middleware (request ids, size limits, rate limits,
conditional requests), so it is declared here, once: the error body of every status
with an example rendered by the real renderer, the 304, and the headers the middleware
sends and reads. Handlers pick them up through `responses=` and `operation_class=`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    Example,
    OpenAPI,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    Reference,
    Schema,
    Tag,
)

from leasestar.client.errors import ErrorBody, ErrorDetails
from leasestar.errors import error_body
from leasestar.hygiene import MAX_HEADER_BYTES, MAX_QUERY_PARAMETERS, MAX_TARGET_BYTES

_ERROR_DESCRIPTIONS: Final[dict[int, str]] = {
    400: "A query parameter is unknown, repeated or breaks its rule (`message` names the "
    "parameter and the rule, `details.parameter` and `details.value` say which), or the "
    f"request carries more than {MAX_QUERY_PARAMETERS} query parameters.",
    401: "The bearer token is missing, malformed, unknown or revoked (the body does not say "
    "which).",
    404: "No such applicant visible to this token: unknown id, outside the token's "
    "integrations, or outside the date bounds.",
    405: "A method other than GET or HEAD on this path; `Allow` lists the methods.",
    413: "The request carries a body (a `Content-Length` other than 0, or "
    "`Transfer-Encoding`), and only a `POST` may, of at most 16 KiB with a "
    "`Content-Length`. The body is not read and the connection is closed.",
    414: f"The path and query string together are longer than {MAX_TARGET_BYTES} bytes.",
    429: "The token sent more requests than the server's rate limit allows, or already has "
    "as many requests in progress as a server process takes at once from one token "
    "(`message` says which); `Retry-After` says how many seconds to wait.",
    431: f"The request headers together are larger than {MAX_HEADER_BYTES} bytes.",
    500: "A fault of the server. The body carries no trace, SQL or path; the server log has "
    "them, under the response's `X-Request-ID`.",
    503: "The server cannot answer now: it holds its maximum of connections (answered "
    "before authentication, with a `Retry-After` header in seconds; the connection is "
    "closed), or the database cannot be read (removed, replaced or damaged after the "
    "server started, or the disk fails).",
}
_ERROR_EXAMPLES: Final[dict[int, bytes]] = {
    400: error_body(
        400,
        "limit must be an integer between 1 and 250",
        ErrorDetails(parameter="limit", value="0"),
    ),
    503: error_body(503, "the database is unavailable"),
}


def error_responses(
    *statuses: int, described: dict[int, str] | None = None
) -> dict[int, ResponseSpec]:
    """The error body for each status, described (`described` overrides the usual words
    for a route), with an example from `error_body`."""
    return {
        status: ResponseSpec(
            ErrorBody,
            description=(described or {}).get(status) or _ERROR_DESCRIPTIONS[status],
            generate_examples=False,
            examples=[
                Example(
                    summary=f"{status} error body",
                    value=msgspec.json.decode(_ERROR_EXAMPLES.get(status) or error_body(status)),
                )
            ],
        )
        for status in statuses
    }


NOT_MODIFIED: Final = ResponseSpec(
    None,
    description="Not modified: `If-None-Match` names the current `ETag`. No body.",
)


def _header(description: str, type_: OpenAPIType = OpenAPIType.STRING) -> OpenAPIHeader:
    return OpenAPIHeader(description=description, schema=Schema(type=type_))


_REQUEST_ID: Final = _header(
    "The request's id: the client's `X-Request-ID` when it is 1-128 characters of "
    "`A-Za-z0-9._:-`, otherwise a new one. The access log line of the request carries it."
)
_ETAG: Final = _header(
    "A weak validator of this answer, derived from the data version, the request and the "
    "token's scope: it changes whenever a write could change the answer."
)
_RATE_LIMIT_HEADERS: Final = {
    "RateLimit-Policy": _header(
        "The token's budget (with a rate limit, the default of `leasestar serve`), as the "
        'IETF RateLimit fields draft writes it: `"token";q=REQUESTS;w=SECONDS`. It never '
        "changes: sent with the answer that opens a window (`r` is then `q - 1`) and with "
        "every 429."
    ),
    "RateLimit": _header(
        "What is left of the budget after this request, and the seconds until its window "
        'ends: `"token";r=REMAINING;t=SECONDS`.'
    ),
}
_STATUS_HEADERS: Final[dict[str, dict[str, OpenAPIHeader]]] = {
    "401": {"WWW-Authenticate": _header("Always `Bearer`.")},
    "405": {"Allow": _header("The methods this path answers.")},
    "429": {
        "Retry-After": _header("Seconds to wait before retrying.", OpenAPIType.INTEGER),
        **_RATE_LIMIT_HEADERS,
    },
}

REQUEST_ID_PARAMETER: Final = Parameter(
    name="X-Request-ID",
    param_in="header",
    required=False,
    description="An id for this request, echoed in the response and the access log when it "
    "is 1-128 characters of `A-Za-z0-9._:-` (otherwise the server makes one).",
    schema=Schema(type=OpenAPIType.STRING),
)
IF_NONE_MATCH_PARAMETER: Final = Parameter(
    name="If-None-Match",
    param_in="header",
    required=False,
    description="The `ETag` of an earlier answer to the same request: 304 with no body while "
    "the answer is unchanged.",
    schema=Schema(type=OpenAPIType.STRING),
)


NDJSON: Final = "application/x-ndjson"
NDJSON_RECORDS: Final = OpenAPIMediaType(
    schema=Reference(ref="#/components/schemas/Applicant"),
    example=None,
)
NDJSON_DESCRIPTION: Final = (
    " With `Accept: application/x-ndjson`: every matching applicant, one per line (each "
    "line one `Applicant`, the bytes the JSON list has in `results`), streamed from one "
    "snapshot; `limit`, `offset`, `cursor` and `wait` are refused. A sync stream "
    '(`changed_since`) also sends a line `{"changeSeq":N}` after each batch and at its end: '
    "everything up to N was sent; resume a cut stream with `changed_since=N`."
)


def operation_class(
    parameters: Iterable[Parameter] = (),
    *,
    conditional: bool = False,
    rate_limited: bool = False,
    streamed: bool = False,
    public: bool = False,
) -> type[Operation]:
    """An Operation that adds what the middleware does to what Litestar documents.

    `parameters` are documented in addition to the handler's own (the query parameters
    that the handler parses itself); `conditional` adds `If-None-Match` and `ETag`;
    `rate_limited` adds the rate-limit headers to the success response; `streamed` adds
    the NDJSON stream of records as a second media type of the success response;
    `public` declares that the operation needs no token (`security: []`, which Litestar
    leaves out when a handler's list is empty, so that linters and generated clients
    cannot tell a public operation from an undocumented one).
    """
    added: Sequence[Parameter] = [
        *parameters,
        *([IF_NONE_MATCH_PARAMETER] if conditional else []),
        REQUEST_ID_PARAMETER,
    ]

    @dataclass
    class DocumentedOperation(Operation):
        def __post_init__(self) -> None:
            self.parameters = [*(self.parameters or []), *added]
            if public:
                self.security = []
            for status, response in (self.responses or {}).items():
                if not isinstance(response, OpenAPIResponse):
                    continue
                headers = {**(response.headers or {}), "X-Request-ID": _REQUEST_ID}
                headers.update(_STATUS_HEADERS.get(status, {}))
                if conditional and status in ("200", "304"):
                    headers["ETag"] = _ETAG
                if rate_limited and status == "200":
                    headers.update(_RATE_LIMIT_HEADERS)
                if streamed and status == "200":
                    response.content = {
                        **(response.content or {}),
                        "application/x-ndjson": NDJSON_RECORDS,
                    }
                    response.description += NDJSON_DESCRIPTION
                response.headers = headers

    return DocumentedOperation


# The tags the operations use, declared once with what each holds.
TAGS: Final = [
    Tag(name="applicants", description="Applicant records: the list, one record, the sync feed."),
    Tag(name="service", description="Health and metrics of the server; no token needed."),
    Tag(
        name="webhooks",
        description="Subscriptions to changes, pushed to a receiver (a token with the "
        "webhooks permission).",
    ),
]


def finish_document(document: OpenAPI) -> None:
    """What Litestar's generator cannot say: an optional field of a Struct type is written
    as a one-member `oneOf` (its `UNSET` member has no schema), which linters flag as an
    illogical composition; the field is the plain reference to that type."""
    for schema in (document.components.schemas or {}).values():
        for name, field in (schema.properties or {}).items():
            if not isinstance(field, Schema):
                continue
            members = field.one_of or field.all_of or field.any_of
            if members is not None and len(members) == 1 and isinstance(members[0], Reference):
                schema.properties[name] = members[0]  # type: ignore[index]
