"""The asyncio client: `AsyncClient(base_url, token)`, over an `httpx.AsyncClient`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
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


class AsyncClient:
    """`leasestar.client.Client` for asyncio: the same options, awaited."""

    def __init__(self, base_url: str, token: str, **options: Unpack[Options]) -> None:
        self._exchange = Exchange(token, options)
        self._http = httpx.AsyncClient(
            base_url=base_url, timeout=self._exchange.timeout, headers=self._exchange.headers
        )
        self.applicants = AsyncApplicants(self)

    async def get(self, path: str, query: dict[str, str]) -> bytes:
        """The body of a GET: after any 429 waits, from the cache on a 304."""
        for attempt in count():
            request = self._exchange.build(self._http, path, query)
            outcome = self._exchange.read(request, await self._http.send(request), attempt)
            if not isinstance(outcome, Wait):
                return outcome
            await asyncio.sleep(outcome.seconds)
        raise AssertionError("unreachable")  # pragma: no cover - count() never ends

    async def stream(
        self, path: str, query: dict[str, str], records: Decoders = WHOLE
    ) -> AsyncIterator[Any]:
        """The items of an NDJSON stream, as they arrive (after any 429 waits): records
        (decoded by `records`) and `StreamMark`s."""
        for attempt in count():
            request = self._exchange.build(self._http, path, query, stream=True)
            response = await self._http.send(request, stream=True)
            try:
                if response.is_success:
                    async for line in response.aiter_lines():
                        if (item := stream_item(line, records)) is not None:
                            yield item
                    return
                await response.aread()
                outcome = self._exchange.read(request, response, attempt)
            finally:
                await response.aclose()
            if isinstance(outcome, Wait):
                await asyncio.sleep(outcome.seconds)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()


class AsyncChangeFeed:
    """`leasestar.client.ChangeFeed` for asyncio: `async for` it, then keep `change_seq`."""

    def __init__(
        self,
        client: AsyncClient,
        since: int,
        filters: SyncFilters,
        *,
        wait: int | None,
        stream: bool,
    ) -> None:
        self.change_seq = since
        self._client = client
        self._query = sync_query(since, filters, wait=wait, stream=stream)
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[Applicant]:
        if self._stream:
            async for item in self._client.stream(APPLICANTS, self._query):
                if isinstance(item, StreamMark):
                    self.change_seq = item.change_seq
                else:
                    yield item
            return
        async for page in _walk(self._client, self._query):
            for applicant in page.results:
                yield applicant
            if isinstance(page.meta.change_seq, int):
                self.change_seq = page.meta.change_seq


async def _walk(
    client: AsyncClient, query: dict[str, str] | None, records: Decoders = WHOLE
) -> AsyncIterator[Any]:
    while query is not None:
        page = records.page.decode(await client.get(APPLICANTS, query))
        yield page
        query = next_query(page.meta)


class AsyncApplicants:
    """`/v1/applicants` for asyncio: `await get(...)`, `async for` over the others."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @overload
    async def get(self, applicant_id: str, *, fields: None = None) -> Applicant: ...
    @overload
    async def get(self, applicant_id: str, *, fields: Sequence[str]) -> Any: ...
    async def get(self, applicant_id: str, *, fields: Sequence[str] | None = None) -> Any:
        """One applicant by id; `NotFound` if this token cannot see it. With `fields`,
        a record of just those fields."""
        records = decoders(fields)
        body = await self._client.get(record_path(applicant_id), dict(records.query))
        return records.single.decode(body).results

    @overload
    def pages(
        self, *, fields: None = None, **filters: Unpack[ListFilters]
    ) -> AsyncIterator[ApplicantList]: ...
    @overload
    def pages(
        self, *, fields: Sequence[str], **filters: Unpack[ListFilters]
    ) -> AsyncIterator[Any]: ...
    def pages(
        self, *, fields: Sequence[str] | None = None, **filters: Unpack[ListFilters]
    ) -> AsyncIterator[Any]:
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
    ) -> AsyncChangeFeed:
        """The records written after change sequence `since` (0: all of them): by pages,
        or one NDJSON stream with `stream=True`; a long poll with `wait` (seconds)."""
        return AsyncChangeFeed(self._client, since, filters, wait=wait, stream=stream)

    @overload
    def stream(
        self, *, fields: None = None, **filters: Unpack[StreamFilters]
    ) -> AsyncIterator[Applicant]: ...
    @overload
    def stream(
        self, *, fields: Sequence[str], **filters: Unpack[StreamFilters]
    ) -> AsyncIterator[Any]: ...
    async def stream(
        self, *, fields: Sequence[str] | None = None, **filters: Unpack[StreamFilters]
    ) -> AsyncIterator[Any]:
        """Every applicant matching the filters in one NDJSON answer (one snapshot);
        with `fields`, records of just those fields."""
        records = decoders(fields)
        query = {**query_of(filters), **records.query}
        async for item in self._client.stream(APPLICANTS, query, records):
            if not isinstance(item, StreamMark):
                yield item

    @overload
    def list(
        self, *, fields: None = None, **filters: Unpack[ListFilters]
    ) -> AsyncIterator[Applicant]: ...
    @overload
    def list(
        self, *, fields: Sequence[str], **filters: Unpack[ListFilters]
    ) -> AsyncIterator[Any]: ...
    async def list(
        self, *, fields: Sequence[str] | None = None, **filters: Unpack[ListFilters]
    ) -> AsyncIterator[Any]:
        """Every applicant matching the filters, walking the pages by cursor; with
        `fields`, records of just those fields."""
        async for page in self.pages(fields=fields, **filters):
            for applicant in page.results:
                yield applicant
