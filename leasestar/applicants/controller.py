"""HTTP routes of the applicant resource: thin handlers over `query` and `storage`.

The handlers parse the raw query string themselves (see `query.py`) rather than
through Litestar's signature parameters, because the contract's rules differ from a
typed parameter's: an empty value means absent, repeated and unknown parameters are
refused, and every refusal names its rule. The OpenAPI parameters are generated from
the same table the parser uses, so the documentation is still exact.

Responses are assembled from JSON already stored in the database; the handlers still
declare the typed envelope so the OpenAPI document shows what is served.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any, cast
from urllib.parse import parse_qsl, unquote_to_bytes

import msgspec
from litestar import Controller, MediaType, Request, Response, get
from litestar.datastructures import State
from litestar.exceptions import NotFoundException
from litestar.openapi.spec import OpenAPIType, Operation, Parameter, Schema
from litestar.params import PathParameter
from litestar.types import Receive

from leasestar.applicants.changes import ChangeWatcher
from leasestar.applicants.cursors import CursorCodec, last_record, sort_key_values
from leasestar.applicants.filters import QueryParameterSpec
from leasestar.applicants.ordering import total_order
from leasestar.applicants.query import (
    LATEST,
    PARAMETERS,
    ApplicantQuery,
    cursor_state,
    parse_list_query,
    parse_record_query,
    parse_wait,
    resolve_latest,
)
from leasestar.applicants.storage import ApplicantPage, ApplicantReader
from leasestar.applicants.stream import RecordStream, refuse_paging, wants_ndjson
from leasestar.asgi import VARY_LIST, VARY_RECORD, OwnTypeStream, PreEncodedJSON, header_value
from leasestar.client.records import ApplicantList, ApplicantSingle, PageMeta
from leasestar.disconnect import ClientGone, unless_gone
from leasestar.errors import InvalidParameter
from leasestar.openapi import NDJSON, NOT_MODIFIED, error_responses, operation_class
from leasestar.tokens import TokenHolder, scope_label

_meta_encoder = msgspec.json.Encoder()
_JSON = MediaType.JSON
LIST_RESPONSES = {
    304: NOT_MODIFIED,
    **error_responses(400, 401, 405, 413, 414, 429, 431, 500, 503),
}
RECORD_RESPONSES = {
    304: NOT_MODIFIED,
    **error_responses(400, 401, 404, 405, 413, 414, 429, 431, 500, 503),
}


def _schema(spec: Mapping[str, Any]) -> Schema:
    fields = dict(spec)
    if "type" in fields:
        fields["type"] = OpenAPIType(fields["type"])
    if "anyOf" in fields:
        fields["any_of"] = [_schema(branch) for branch in fields.pop("anyOf")]
    return Schema(**fields)


def _openapi_parameter(spec: QueryParameterSpec) -> Parameter:
    return Parameter(
        name=spec.name,
        param_in="query",
        required=False,
        allow_empty_value=True,  # an empty value means absent (CONTRACT.md)
        description=spec.description,
        schema=_schema(spec.schema),
        example=spec.example,
    )


def _operation_with(
    specs: tuple[QueryParameterSpec, ...], *, streamed: bool = False
) -> type[Operation]:
    return operation_class(
        [_openapi_parameter(spec) for spec in specs],
        conditional=True,
        rate_limited=True,
        streamed=streamed,
    )


@lru_cache(maxsize=4096)
def _query_pairs(raw: bytes) -> tuple[tuple[str, str], ...]:
    """Decode a raw query string strictly: invalid UTF-8 is a 400, not mojibake."""
    try:
        return tuple(parse_qsl(raw.decode("ascii"), keep_blank_values=True, errors="strict"))
    except UnicodeError:
        raise _not_utf8(raw) from None


def _text_of(component: bytes) -> str:
    """A name or value of a query string as text; UnicodeError unless percent-encoded UTF-8."""
    if not component.isascii():
        raise UnicodeError("raw bytes beyond ASCII")
    return unquote_to_bytes(component.replace(b"+", b" ")).decode("utf-8")


def _not_utf8(raw: bytes) -> InvalidParameter:
    """The refusal of a query string that is not percent-encoded UTF-8, naming the first
    parameter whose value (or name) is not, as every other refusal names its parameter."""
    for part in raw.split(b"&"):
        name, _, value = part.partition(b"=")
        sent_value = value.decode("latin-1")
        try:
            parameter = _text_of(name)
        except UnicodeError:
            parameter = name.decode("latin-1")
            return InvalidParameter(
                parameter, sent_value, f"the name {parameter} must be percent-encoded UTF-8"
            )
        try:
            _text_of(value)
        except UnicodeError:
            return InvalidParameter(
                parameter, sent_value, f"{parameter} must be percent-encoded UTF-8"
            )
    return InvalidParameter(
        "query", raw.decode("latin-1"), "the query string must be percent-encoded UTF-8"
    )


@lru_cache(maxsize=4096)
def _list_query(raw: bytes, codec: CursorCodec) -> ApplicantQuery:
    """The validated list query of a raw query string: a pure function of the two, and the
    same few strings recur, so parsed once each. A refusal is raised, never cached."""
    return parse_list_query(_query_pairs(raw), codec)


def _meta(query: ApplicantQuery, *, has_more: bool, total: int) -> bytes:
    return _meta_encoder.encode(
        PageMeta(
            offset=query.offset,
            limit=query.limit,
            order_by=list(query.order_by),
            has_more=has_more,
            total=total,
        )
    )


def _list_meta(query: ApplicantQuery, page: ApplicantPage, codec: CursorCodec) -> bytes:
    """Meta of a list page: counts, and the cursor (and sync position) to go on from."""
    position = query.offset + page.returned
    has_more = position < page.total if page.more is None else page.more
    meta = PageMeta(
        offset=query.offset,
        limit=query.limit,
        order_by=list(query.order_by),
        has_more=has_more,
        total=page.total,
    )
    if has_more and page.returned:
        after = page.last_keys
        if after is None:  # whole records: the last one holds its keys
            _, last = last_record(page.results_json)
            if last is not None:
                keys = total_order(query.order_by)
                after = sort_key_values(keys, last, page.last_change_seq)
        if after is not None:
            meta.next = codec.encode(cursor_state(query, position, after))
    if query.changed_since is not None:
        if page.last_change_seq is not None:
            meta.change_seq = page.last_change_seq
        elif query.after is not None:
            meta.change_seq = int(query.after[0] or 0)
        else:
            meta.change_seq = query.changed_since
    return _meta_encoder.encode(meta)


def _scope(request: Request[TokenHolder, Any, State]) -> frozenset[str] | None:
    return request.user.integrations


def _etag(scope: Mapping[str, Any], integrations: frozenset[str] | None, version: int) -> str:
    """A validator for this answer: the version of what the token sees, the request, and
    the token's scope.

    Any write the token could see moves the version, so an unchanged ETag means unchanged
    bytes; a scoped token's version moves only with its own integrations' data.
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(scope["path"].encode())
    digest.update(b"?" + scope["query_string"])
    digest.update(scope_label(integrations))
    return f'W/"{version:x}-{digest.hexdigest()}"'


async def _scope_version(
    reader: ApplicantReader, integrations: frozenset[str] | None
) -> int | None:
    """A scoped token's version (None for an unscoped token, whose ETag takes the data
    version its page was read at, without a statement more).

    Read before the answer: under a write landing in between, the ETag is older than the
    bytes (the next revalidation gets them again), never newer (a stale 304).
    """
    if integrations is None:
        return None
    return await reader.scope_version(integrations)


async def _not_modified(
    reader: ApplicantReader,
    scope: Mapping[str, Any],
    integrations: frozenset[str] | None,
    version: int | None,
    wanted: str | None,
    vary: tuple[bytes, bytes],
) -> PreEncodedJSON | None:
    """304 when If-None-Match (`wanted`) names the current ETag: no page is read at all.
    It carries the `vary` its 200 would."""
    if not wanted:
        return None
    etag = _etag(
        scope, integrations, version if version is not None else await reader.data_version()
    )
    if wanted.strip() == "*" or etag in (tag.strip() for tag in wanted.split(",")):
        return PreEncodedJSON(b"", status_code=304, etag=etag, vary=vary)
    return None


@lru_cache(maxsize=4096)
def _record_query(raw: bytes) -> ApplicantQuery:
    """The validated query of a record's raw query string, parsed once for each (the
    same few recur; a refusal is raised, never cached)."""
    return parse_record_query(_query_pairs(raw))


@lru_cache(maxsize=4096)
def _record_meta(query: ApplicantQuery) -> bytes:
    return _meta(query, has_more=False, total=1)


async def record_answer(
    reader: ApplicantReader, scope: Mapping[str, Any], holder: TokenHolder, applicant_id: str
) -> PreEncodedJSON:
    """The answer to `GET /v1/applicants/{id}` from the ASGI scope: what the route's
    handler serves, and its direct route in front of Litestar (`direct_route.py`) too.

    Raises `InvalidParameter` for a refused query string, `NotFoundException` for an id
    unknown, outside the token's integrations or outside the date bounds.
    """
    query = _record_query(scope["query_string"])
    integrations = holder.integrations
    wanted = header_value(scope["headers"], b"if-none-match")
    star = (wanted or "").strip() == "*"
    # `If-None-Match: *` matches only a record that exists (RFC 9110, 13.1.2): an
    # unknown id, or one outside the token's scope or the date bounds, stays a 404.
    exists = not star or (await reader.fetch_one(applicant_id, query, integrations))[0] is not None
    # Both awaited only when there is something to ask: a coroutine is ~0.5 us, and a
    # get by id of an unscoped token without If-None-Match, the common one, needs neither.
    scoped = None if integrations is None else await _scope_version(reader, integrations)
    not_modified = (
        await _not_modified(reader, scope, integrations, scoped, wanted, VARY_RECORD)
        if exists and wanted
        else None
    )
    if not_modified is not None:
        return not_modified
    record, version = await reader.fetch_one(applicant_id, query, integrations)
    version = version if scoped is None else scoped
    if record is None:
        raise NotFoundException()
    body = b"".join((b'{"meta":', _record_meta(query), b',"results":', record, b"}"))
    return PreEncodedJSON(body, etag=_etag(scope, integrations, version), vary=VARY_RECORD)


async def _stream(request: Request[TokenHolder, Any, State], codec: CursorCodec) -> Response[Any]:
    """Every match of the query, as NDJSON from one snapshot (see `stream.py`)."""
    raw = request.scope["query_string"]
    refuse_paging(_query_pairs(raw))
    query = await resolve_latest(_list_query(raw, codec), request.app.state.reader.data_version)
    records = RecordStream(request.app.state.database_file.path, query, _scope(request))
    vary = {VARY_LIST[0].decode(): VARY_LIST[1].decode()}
    return cast("Response[Any]", OwnTypeStream(records.chunks(), media_type=NDJSON, headers=vary))


async def _wait_for_changes(
    state: State,
    receive: Receive,
    query: ApplicantQuery,
    integrations: frozenset[str] | None,
    page: ApplicantPage,
    wait: int,
) -> ApplicantPage:
    """Hold an empty sync page until a write brings this query records, or `wait` ends,
    or the client leaves."""
    watcher: ChangeWatcher = state.change_watcher
    reader: ApplicantReader = state.reader
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    version = page.data_version
    while loop.time() < deadline:
        try:
            moved = await unless_gone(watcher.wait_past(version, deadline), receive)
        except ClientGone:
            break  # the page goes nowhere, and the token's turn is handed on now
        if moved is None:
            break
        page = await reader.fetch_page(query, integrations)
        version = max(moved, page.data_version)
        if page.returned:  # else the write was none of this query's business: wait on
            break
    return page


async def list_answer(
    state: State, scope: Mapping[str, Any], receive: Receive, holder: TokenHolder
) -> PreEncodedJSON:
    """The answer to `GET /v1/applicants` as a JSON page, from the ASGI scope: what the
    route's handler serves (but an NDJSON stream), and its direct route in front of
    Litestar (`direct_route.py`) too.

    Raises `InvalidParameter` for a refused query string or cursor.
    """
    integrations = holder.integrations
    database_codec: CursorCodec = state.cursor_codec
    codec = database_codec.for_scope(integrations)
    raw = scope["query_string"]
    reader: ApplicantReader = state.reader
    query = _list_query(raw, codec)
    # Checked here, not in the coroutine: the hot path (no `latest`) pays no await.
    if query.changed_since == LATEST:
        query = await resolve_latest(query, reader.data_version)
    wait = parse_wait(dict(_query_pairs(raw)).get("wait"), sync=query.changed_since is not None)
    # Each awaited only when there is something to ask (a coroutine is ~0.5 us): a page
    # for an unscoped token without If-None-Match, the common one, needs neither.
    scoped = None if integrations is None else await _scope_version(reader, integrations)
    # A long poll is never answered 304: it waits for the records instead.
    wanted = None if wait else header_value(scope["headers"], b"if-none-match")
    if wanted:
        not_modified = await _not_modified(reader, scope, integrations, scoped, wanted, VARY_LIST)
        if not_modified is not None:
            return not_modified
    page = await reader.fetch_page(query, integrations)
    if wait and not page.returned:
        page = await _wait_for_changes(state, receive, query, integrations, page, wait)
    body = b"".join(
        (b'{"meta":', _list_meta(query, page, codec), b',"results":[', page.results_json, b"]}")
    )
    version = page.data_version if scoped is None else scoped
    return PreEncodedJSON(body, etag=_etag(scope, integrations, version), vary=VARY_LIST)


class ApplicantController(Controller):
    """`/v1/applicants`: the list and the single record."""

    path = "/v1/applicants"
    tags = ["applicants"]  # noqa: RUF012 - Litestar reads this class attribute as declared
    # Documented here, not for the whole app: /health and /schema need no token.
    security = [{"BearerToken": []}]  # noqa: RUF012 - read by Litestar as declared

    @get(
        "/",
        operation_id="listApplicants",
        responses=LIST_RESPONSES,
        summary="List applicants",
        response_description="One page of applicants (each narrowed to `fields`, if given).",
        operation_class=_operation_with(PARAMETERS, streamed=True),
        media_type=_JSON,
    )
    async def list_applicants(
        self, request: Request[TokenHolder, Any, State]
    ) -> Response[ApplicantList]:
        """Applicants matching the filters and the token's scope, one page at a time."""
        if wants_ndjson(header_value(request.scope["headers"], b"accept")):
            database_codec: CursorCodec = request.app.state.cursor_codec
            return await _stream(request, database_codec.for_scope(_scope(request)))
        answer = await list_answer(request.app.state, request.scope, request.receive, request.user)
        return cast("Response[ApplicantList]", answer)

    @get(
        "/{id:str}",
        operation_id="getApplicant",
        responses=RECORD_RESPONSES,
        summary="Get an applicant by id",
        response_description="The applicant (narrowed to `fields`, if given).",
        operation_class=_operation_with(tuple(p for p in PARAMETERS if not p.list_only)),
        media_type=_JSON,
    )
    async def get_applicant(
        self,
        request: Request[TokenHolder, Any, State],
        id: Annotated[str, PathParameter(description="The service's id of the applicant.")],
    ) -> Response[ApplicantSingle]:
        """One applicant; 404 when unknown, outside the token's scope or the date bounds."""
        answer = await record_answer(request.app.state.reader, request.scope, request.user, id)
        return cast("Response[ApplicantSingle]", answer)
