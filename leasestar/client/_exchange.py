"""What the sync and async clients share: the requests they build and how they read the
answers. No I/O here, so each client is a thin loop over its own httpx transport.

- Parameters: Python values in (datetimes, dates, ints), the API's query string out.
- ETags: the last answer to each URL is kept (bounded in bytes) and revalidated with
  `If-None-Match`; a 304 hands back the kept bytes.
- 429: the answer says how long to wait (`Retry-After`); the client waits and asks
  again, a bounded number of times.
- Any other non-2xx is a typed exception (`leasestar.client.errors`).
- Walks: a list goes on by `meta.next` until `hasMore` is false.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from email.utils import parsedate_to_datetime
from functools import lru_cache
from typing import Any, TypedDict
from urllib.parse import quote

import httpx
import msgspec

from leasestar.client.errors import error_for
from leasestar.client.records import (
    Applicant,
    ApplicantList,
    ApplicantSingle,
    PageMeta,
    narrowed_record,
)

APPLICANTS: str = "/v1/applicants"
NDJSON: str = "application/x-ndjson"
Instant = datetime | date | str


class StreamFilters(TypedDict, total=False):
    """The filters and ordering of a list; every one optional (README, "Query
    parameters"). Instants take a datetime (naive means UTC), a date or ISO 8601 text."""

    order_by: str
    integration_id: str
    integration_vendor: str
    property_id: str
    x_property_id: str
    x_id: str
    email_1: str
    phone_1: str
    updated_at_gte: Instant
    updated_at_lte: Instant
    last_seen_gte: Instant
    last_seen_lte: Instant


class ListFilters(StreamFilters, total=False):
    """A list walked page by page: the filters, and the page size."""

    limit: int


class SyncFilters(TypedDict, total=False):
    """What a sync may narrow by (the fields a record never changes), and its page size
    (ignored by a streamed sync, which is one answer)."""

    limit: int
    integration_id: str
    x_property_id: str
    x_id: str


def _text(value: object) -> str:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return aware.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def query_of(parameters: Mapping[str, object]) -> dict[str, str]:
    """The query string's pairs: `order_by` is sent as `order-by`; None is left out."""
    return {
        ("order-by" if name == "order_by" else name): _text(value)
        for name, value in parameters.items()
        if value is not None
    }


@dataclass(frozen=True, slots=True)
class Wait:
    """Ask again after this many seconds (a 429 with retries left)."""

    seconds: float


def retry_after(response: httpx.Response) -> float | None:
    """`Retry-After` in seconds: a number of seconds, or an HTTP date."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class ETagCache:
    """The last answer to each URL with its ETag, least recently used first out once
    the bodies pass `max_bytes` (a cursor page is read once; a record or a first page
    is read again, and that is what revalidation saves)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._bytes = 0

    def etag(self, url: str) -> str | None:
        entry = self._entries.get(url)
        return entry[0] if entry else None

    def body(self, url: str) -> bytes | None:
        entry = self._entries.get(url)
        if entry is None:
            return None
        self._entries.move_to_end(url)
        return entry[1]

    def keep(self, url: str, etag: str, body: bytes) -> None:
        if len(body) > self.max_bytes:
            return
        old = self._entries.pop(url, None)
        if old is not None:
            self._bytes -= len(old[1])
        self._entries[url] = (etag, body)
        self._bytes += len(body)
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= len(dropped)


list_decoder = msgspec.json.Decoder(ApplicantList)
single_decoder = msgspec.json.Decoder(ApplicantSingle)


def record_path(applicant_id: str) -> str:
    # Ids are unreserved characters and ":" (the import's rule), which go unescaped.
    return f"{APPLICANTS}/{quote(applicant_id, safe=':')}"


def next_query(meta: PageMeta) -> dict[str, str] | None:
    """The query of the page after the page of `meta`, or None at the end of the walk
    (the cursor keeps the page's filters, limit and fields)."""
    if meta.has_more and isinstance(meta.next, str):
        return {"cursor": meta.next}
    return None


def sync_query(
    since: int, filters: SyncFilters, *, wait: int | None = None, stream: bool = False
) -> dict[str, str]:
    """The first request of a sync: the feed after `since`, a long poll with `wait`."""
    query = query_of({**filters, "changed_since": since, "wait": wait})
    if stream:
        query.pop("limit", None)  # one answer holds the whole feed: no page size
    return query


class StreamMark(msgspec.Struct, frozen=True):
    """A sync stream's own line: every record up to this change sequence has been sent."""

    change_seq: int = msgspec.field(name="changeSeq")


_mark_decoder = msgspec.json.Decoder(StreamMark)
_record_decoder = msgspec.json.Decoder(Applicant)
_MARK_PREFIX = '{"changeSeq":'


@dataclass(frozen=True, slots=True)
class Decoders:
    """How the answers of one selection of fields decode: whole records into
    `Applicant`; with `fields=`, into a Struct of those fields (`narrowed_record`)."""

    page: msgspec.json.Decoder[Any]
    single: msgspec.json.Decoder[Any]
    record: msgspec.json.Decoder[Any]
    query: Mapping[str, str]  # what the first request adds: `fields`, or nothing


WHOLE = Decoders(list_decoder, single_decoder, _record_decoder, {})
# A program names a few selections; bounded all the same.
SELECTIONS_KEPT = 64


@lru_cache(maxsize=SELECTIONS_KEPT)
def _narrowed(fields: tuple[str, ...]) -> Decoders:
    record = narrowed_record(fields)
    results = list[record]  # type: ignore[valid-type]
    page = msgspec.defstruct("ApplicantFieldsList", [("meta", PageMeta), ("results", results)])
    single = msgspec.defstruct("ApplicantFieldsSingle", [("meta", PageMeta), ("results", record)])
    return Decoders(
        msgspec.json.Decoder(page),
        msgspec.json.Decoder(single),
        msgspec.json.Decoder(record),
        {"fields": ",".join(fields)},
    )


def decoders(fields: Sequence[str] | None) -> Decoders:
    """The decoders of records narrowed to `fields` (None: whole records)."""
    return WHOLE if fields is None else _narrowed(tuple(fields))


def stream_item(line: str, records: Decoders = WHOLE) -> Any:
    """One line of an NDJSON stream: a record, a `StreamMark`, or None (a blank line)."""
    if not line:
        return None
    # Records never hold a changeSeq key, and the server writes marks with it first.
    if line.startswith(_MARK_PREFIX):
        return _mark_decoder.decode(line)
    return records.record.decode(line)


class Options(TypedDict, total=False):
    """A client's options beyond its base URL and token.

    `timeout` (seconds, default 30) bounds each request; `max_retries` (default 5) 429s
    are waited out, each for its `Retry-After` seconds when that is at most `max_wait`
    (default 60), before `RateLimited` is raised; answers are kept for revalidation
    up to `cache_bytes` (default 8 MiB).
    """

    timeout: float
    max_retries: int
    max_wait: float
    cache_bytes: int


class Exchange:
    """Builds each request and reads each answer, for one client (one token)."""

    def __init__(self, token: str, options: Options) -> None:
        self.timeout = options.get("timeout", 30.0)
        self.max_retries = options.get("max_retries", 5)
        self.max_wait = options.get("max_wait", 60.0)
        self.cache = ETagCache(options.get("cache_bytes", 8 * 2**20))
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def build(
        self,
        http: httpx.Client | httpx.AsyncClient,
        path: str,
        query: Mapping[str, str],
        *,
        stream: bool = False,
    ) -> httpx.Request:
        """The GET: revalidating the kept answer to the same URL if there is one, or
        asking for the NDJSON stream. A long poll gets its wait on top of the timeout."""
        wait = float(query.get("wait", 0))
        request = http.build_request(
            "GET",
            path,
            params=query,
            headers={"Accept": NDJSON} if stream else None,
            timeout=self.timeout + wait if wait else httpx.USE_CLIENT_DEFAULT,
        )
        etag = None if stream else self.cache.etag(str(request.url))
        if etag is not None:
            request.headers["If-None-Match"] = etag
        return request

    def read(self, request: httpx.Request, response: httpx.Response, attempt: int) -> bytes | Wait:
        """The body to decode, a `Wait` before asking again, or a typed exception."""
        url = str(request.url)
        if response.status_code == 304:
            kept = self.cache.body(url)
            if kept is not None:
                return kept
            # Dropped from the cache since the request was built: ask again without it.
            if attempt < self.max_retries:
                return Wait(0.0)
        elif response.is_success:
            body = response.content
            etag = response.headers.get("etag")
            if etag is not None:
                self.cache.keep(url, etag, body)
            return body
        wait = retry_after(response)
        if response.status_code == 429 and attempt < self.max_retries:
            seconds = 1.0 if wait is None else wait
            if seconds <= self.max_wait:
                return Wait(seconds)
        raise error_for(
            response.status_code, response.content, response.headers.get("x-request-id"), wait
        )
