"""The blocking client: `Client(base_url, token)`, over an `httpx.Client`."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from itertools import count
from types import TracebackType
from typing import Any, Unpack, overload

import httpx

from leasestar.client._exchange import (
    APPLICANTS,
    WHOLE,
    Decoders,
    Exchange,
    ListFilters,
    Options,
    StreamFilters,
    StreamMark,
    SyncFilters,
    Wait,
    decoders,
    next_query,
    query_of,
    record_path,
    stream_item,
    sync_query,
)
from leasestar.client.records import Applicant, ApplicantList


class Client:
    """A leasestar API client for one base URL and one bearer token (options: see
    `Options`). Use it as a context manager, or call `close()`."""

    def __init__(self, base_url: str, token: str, **options: Unpack[Options]) -> None:
        self._exchange = Exchange(token, options)
        self._http = httpx.Client(
            base_url=base_url, timeout=self._exchange.timeout, headers=self._exchange.headers
        )
        self.applicants = Applicants(self)

    def get(self, path: str, query: dict[str, str]) -> bytes:
        """The body of a GET: after any 429 waits, from the cache on a 304."""
        for attempt in count():
            request = self._exchange.build(self._http, path, query)
            outcome = self._exchange.read(request, self._http.send(request), attempt)
            if not isinstance(outcome, Wait):
                return outcome
            time.sleep(outcome.seconds)
        raise AssertionError("unreachable")  # pragma: no cover - count() never ends

    def stream(self, path: str, query: dict[str, str], records: Decoders = WHOLE) -> Iterator[Any]:
        """The items of an NDJSON stream, as they arrive (after any 429 waits): records
        (decoded by `records`) and `StreamMark`s."""
        for attempt in count():
            request = self._exchange.build(self._http, path, query, stream=True)
            response = self._http.send(request, stream=True)
            try:
                if response.is_success:
                    for line in response.iter_lines():
                        if (item := stream_item(line, records)) is not None:
                            yield item
                    return
                response.read()
                outcome = self._exchange.read(request, response, attempt)
            finally:
                response.close()
            if isinstance(outcome, Wait):
                time.sleep(outcome.seconds)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


class ChangeFeed:
    """The records written after a change sequence, oldest write first.

    Iterate it for the records; `change_seq` is then the sequence to keep and pass as
    `since` next time. It moves when every record up to it has been taken (a page's
    worth, or a streamed sync's 1,000), so a consumer stopped part way keeps an earlier
    sequence and is given the rest again (at least once: apply records as upserts by
    `id`).
    """

    def __init__(
        self, client: Client, since: int, filters: SyncFilters, *, wait: int | None, stream: bool
    ) -> None:
        self.change_seq = since
        self._client = client
        self._query = sync_query(since, filters, wait=wait, stream=stream)
        self._stream = stream

    def __iter__(self) -> Iterator[Applicant]:
        if self._stream:
            for item in self._client.stream(APPLICANTS, self._query):
                if isinstance(item, StreamMark):
                    self.change_seq = item.change_seq
                else:
                    yield item
            return
        for page in _walk(self._client, self._query):
            yield from page.results
            if isinstance(page.meta.change_seq, int):
                self.change_seq = page.meta.change_seq


def _walk(client: Client, query: dict[str, str] | None, records: Decoders = WHOLE) -> Iterator[Any]:
    while query is not None:
        page = records.page.decode(client.get(APPLICANTS, query))
        yield page
        query = next_query(page.meta)


class Applicants:
    """`/v1/applicants`: `get`, `pages`, `list` (every match, by cursor) and `changes`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @overload
    def get(self, applicant_id: str, *, fields: None = None) -> Applicant: ...
    @overload
    def get(self, applicant_id: str, *, fields: Sequence[str]) -> Any: ...
    def get(self, applicant_id: str, *, fields: Sequence[str] | None = None) -> Any:
        """One applicant by id; `NotFound` if this token cannot see it. With `fields`,
        a record of just those fields (`records.narrowed_record`)."""
        records = decoders(fields)
        body = self._client.get(record_path(applicant_id), dict(records.query))
        return records.single.decode(body).results

    @overload
    def pages(
        self, *, fields: None = None, **filters: Unpack[ListFilters]
    ) -> Iterator[ApplicantList]: ...
    @overload
    def pages(self, *, fields: Sequence[str], **filters: Unpack[ListFilters]) -> Iterator[Any]: ...
    def pages(
        self, *, fields: Sequence[str] | None = None, **filters: Unpack[ListFilters]
    ) -> Iterator[Any]:
        """Every page of the list, by cursor: no skips or repeats while data is written.
        With `fields`, its records hold just those fields (the cursors keep them)."""
        records = decoders(fields)
        return _walk(self._client, {**query_of(filters), **records.query}, records)

    def changes(
        self,
        since: int = 0,
        *,
        wait: int | None = None,
        stream: bool = False,
        **filters: Unpack[SyncFilters],
    ) -> ChangeFeed:
        """The records written after change sequence `since` (0: all of them): read page by
        page, or as one NDJSON stream with `stream=True`; with `wait` (seconds, up to 60),
        a long poll that waits for a write when nothing is new."""
        return ChangeFeed(self._client, since, filters, wait=wait, stream=stream)

    @overload
    def stream(
        self, *, fields: None = None, **filters: Unpack[StreamFilters]
    ) -> Iterator[Applicant]: ...
    @overload
    def stream(
        self, *, fields: Sequence[str], **filters: Unpack[StreamFilters]
    ) -> Iterator[Any]: ...
    def stream(
        self, *, fields: Sequence[str] | None = None, **filters: Unpack[StreamFilters]
    ) -> Iterator[Any]:
        """Every applicant matching the filters in one NDJSON answer (one snapshot);
        with `fields`, records of just those fields."""
        records = decoders(fields)
        query = {**query_of(filters), **records.query}
        for item in self._client.stream(APPLICANTS, query, records):
            if not isinstance(item, StreamMark):
                yield item

    @overload
    def list(
        self, *, fields: None = None, **filters: Unpack[ListFilters]
    ) -> Iterator[Applicant]: ...
    @overload
    def list(self, *, fields: Sequence[str], **filters: Unpack[ListFilters]) -> Iterator[Any]: ...
    def list(
        self, *, fields: Sequence[str] | None = None, **filters: Unpack[ListFilters]
    ) -> Iterator[Any]:
        """Every applicant matching the filters, walking the pages by cursor; with
        `fields`, records of just those fields."""
        for page in self.pages(fields=fields, **filters):
            yield from page.results
