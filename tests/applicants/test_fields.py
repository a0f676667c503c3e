"""Field selection (`fields=`): a narrowed record is the whole record with the other keys
dropped, byte for byte, on both routes, with cursors, the sync feed, streams, ETags and
every encoding.

What a narrowed record must be is computed here from the whole record the same server
serves: its keys and values parsed with `json.loads` (order kept, numbers as written),
and its bytes rebuilt from the raw text of each kept value. The record's fields are the
contract's (`tests/contract.py`), not the app's list.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import brotli
import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import AsyncTestClient

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]

from leasestar.applicants.bodies import BodyDecoder
from leasestar.applicants.fields import column_object
from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant
from leasestar.database import open_for_write
from tests.applicants.conftest import Server, client_of
from tests.contract import RECORD_FIELDS, SORTABLE
from tests.strategies import _SCRATCH, ModelRow, datasets, list_queries, serve

PROPERTY_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NDJSON = {"Accept": "application/x-ndjson"}
FOUR = ("id", "first_name", "last_name", "email_1")
# Fields of columns only (read without a body), or any (some only in the body).
SELECTIONS = st.one_of(
    st.lists(st.sampled_from(SORTABLE), min_size=1, max_size=6, unique=True),
    st.lists(st.sampled_from(RECORD_FIELDS), min_size=1, max_size=8, unique=True),
)


class RawPage(msgspec.Struct):
    meta: dict[str, Any]
    results: list[msgspec.Raw]


class RawSingle(msgspec.Struct):
    meta: dict[str, Any]
    results: msgspec.Raw


def _pairs(record: bytes) -> Any:
    """A record's members in order, numbers as written, parsed by the standard library."""
    return json.loads(record, object_pairs_hook=list, parse_float=str, parse_int=str)


def _dropped(whole: bytes, fields: Collection[str]) -> bytes:
    """The whole record's bytes with every member but `fields` dropped, each kept value's
    text as it was."""
    members = msgspec.json.decode(whole, type=dict[str, msgspec.Raw])
    kept = [
        b'"%s":%s' % (name.encode(), bytes(raw)) for name, raw in members.items() if name in fields
    ]
    return b"{" + b",".join(kept) + b"}"


def assert_narrowed(narrowed: bytes, whole: bytes, fields: Collection[str]) -> None:
    """`narrowed` is `whole` with the members not in `fields` dropped, byte for byte."""
    assert _pairs(narrowed) == [pair for pair in _pairs(whole) if pair[0] in fields]
    assert narrowed == _dropped(whole, fields)


def assert_narrowed_page(narrowed: RawPage, whole: RawPage, fields: Collection[str]) -> None:
    """Same meta (but the cursor, which carries the selection), records narrowed."""
    assert {k: v for k, v in narrowed.meta.items() if k != "next"} == {
        k: v for k, v in whole.meta.items() if k != "next"
    }
    assert ("next" in narrowed.meta) == ("next" in whole.meta)
    assert len(narrowed.results) == len(whole.results)
    for record, whole_record in zip(narrowed.results, whole.results, strict=True):
        assert_narrowed(bytes(record), bytes(whole_record), fields)


async def _page(client: AsyncTestClient[Litestar], query_string: str) -> RawPage:
    response = await client.get(f"/v1/applicants?{query_string}")
    assert response.status_code == 200, (query_string, response.text)
    return msgspec.json.decode(response.content, type=RawPage)


async def _walk(client: AsyncTestClient[Litestar], query_string: str) -> list[RawPage]:
    """The pages of a walk by cursor from `query_string`'s page."""
    pages = [await _page(client, query_string)]
    while pages[-1].meta["hasMore"]:
        pages.append(await _page(client, urlencode({"cursor": pages[-1].meta["next"]})))
    return pages


# --- the property -----------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(rows=datasets(max_size=14), data=st.data())
async def test_a_selected_page_is_the_full_page_with_the_other_fields_dropped(
    rows: list[ModelRow], data: st.DataObject
) -> None:
    """Any query, any fields (named in any order): the same page, narrowed; and a walk
    by cursor from it stays narrowed, page for page the walk of whole records."""
    async with serve(rows, {"all": ()}) as served:
        client = served.client
        client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        for _ in range(data.draw(st.integers(1, 3), label="queries")):
            query = data.draw(list_queries(rows), label="query")
            fields = data.draw(SELECTIONS, label="fields")
            selected = [*query.params, ("fields", ",".join(fields))]
            note(f"fields={','.join(fields)}")
            whole = await _page(client, query.query_string())
            narrowed = await _page(client, query.query_string(selected))
            assert_narrowed_page(narrowed, whole, fields)

            step = data.draw(st.integers(1, 4), label="step")
            first = query.with_page(0, step)
            whole_walk = await _walk(client, query.query_string(first))
            narrowed_walk = await _walk(
                client, query.query_string([*first, ("fields", ",".join(fields))])
            )
            assert len(narrowed_walk) == len(whole_walk)
            for narrowed_page, whole_page in zip(narrowed_walk, whole_walk, strict=True):
                assert_narrowed_page(narrowed_page, whole_page, fields)


@settings(PROPERTY_SETTINGS, max_examples=15)
@given(rows=datasets(max_size=10), fields=SELECTIONS, step=st.integers(1, 3))
async def test_the_sync_feed_is_narrowed_with_its_positions_unchanged(
    rows: list[ModelRow], fields: list[str], step: int
) -> None:
    async with serve(rows, {"all": ()}) as served:
        client = served.client
        client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        sync = {"changed_since": "0", "limit": str(step)}
        whole_walk = await _walk(client, urlencode(sync))
        narrowed_walk = await _walk(client, urlencode({**sync, "fields": ",".join(fields)}))
        assert len(narrowed_walk) == len(whole_walk)
        for narrowed_page, whole_page in zip(narrowed_walk, whole_walk, strict=True):
            assert_narrowed_page(narrowed_page, whole_page, fields)


# --- the columns write what the bodies hold -----------------------------------------------

# Instants at the ends of what the API serves, beside the drawn ones.
EDGE_INSTANTS = ("0001-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z", "1969-12-31T23:59:59.999Z")


@settings(PROPERTY_SETTINGS, max_examples=40)
@given(rows=datasets(min_size=1, max_size=8), edge=st.sampled_from(EDGE_INSTANTS))
def test_every_column_field_is_written_as_the_body_holds_it(
    rows: list[ModelRow], edge: str
) -> None:
    """Each field a column holds, alone and all together, written from the column by SQL
    is the body's member byte for byte: awkward text (controls, NUL, non-BMP, U+FFFF),
    nulls, and instants of every year, written back from integer microseconds."""
    # Its own id and upsert key (no drawn id has this form, no drawn source id this one).
    extreme = msgspec.structs.replace(
        rows[0].record,
        id="app_edge",
        x_property_id="edge-instants",
        created_at=edge,
        updated_at=edge,
        last_seen=edge,
    )
    records: list[Applicant] = [row.record for row in rows]
    records.append(extreme)
    with tempfile.TemporaryDirectory(dir=_SCRATCH) as directory:
        path = Path(directory) / "fields.db"
        writer = open_for_write(path)
        try:
            write_records(writer, records)
        finally:
            writer.close()
        connection = sqlite3.connect(path)
        try:
            decode = BodyDecoder.of(connection).decode
            for fields in [(name,) for name in SORTABLE] + [SORTABLE]:
                statement = (
                    f"SELECT CAST(body AS BLOB), CAST({column_object(tuple(fields))} AS BLOB) "
                    "FROM applicants"
                )
                for stored, written in connection.execute(statement):
                    assert written == _dropped(decode(stored), fields), fields
        finally:
            connection.close()


# --- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("id,nickname", "'nickname'"),
        ("id,last_name,id", "'id' more than once"),
        ("id,", "''"),
        ("ID", "'ID'"),
        ("meta", "'meta'"),
        ("applications.status", "'applications.status'"),
        ("change_seq", "'change_seq'"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/applicants", "/v1/applicants/app_x"])
async def test_an_unknown_or_repeated_field_is_a_400_naming_it(
    value: str, named: str, path: str
) -> None:
    async with serve([], {"all": ()}) as served:
        served.client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        response = await served.client.get(path, params={"fields": value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"] == {"parameter": "fields", "value": value}
    assert named in error["message"]


async def test_an_empty_value_means_every_field() -> None:
    async with serve([], {"all": ()}) as served:
        served.client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        response = await served.client.get("/v1/applicants", params={"fields": ""})
    assert response.status_code == 200


# --- over a real server: the direct route, cursors, ETags, streams, encodings ----------------


def _raw_page(response: httpx.Response) -> RawPage:
    assert response.status_code == 200, response.text
    return msgspec.json.decode(response.content, type=RawPage)


@pytest.mark.e2e
def test_get_by_id_is_narrowed_on_the_direct_route(live_server: Server) -> None:
    with client_of(live_server) as client:
        ids = [
            bytes(raw)
            for raw in _raw_page(client.get("/v1/applicants", params={"limit": "5"})).results
        ]
        for record in ids:
            assert list(json.loads(record)) == list(RECORD_FIELDS)
            applicant_id = json.loads(record)["id"]
            for fields in (FOUR, ("created_at", "phone_1", "pets"), ("custom_data",), SORTABLE):
                whole = client.get(f"/v1/applicants/{applicant_id}")
                narrowed = client.get(
                    f"/v1/applicants/{applicant_id}", params={"fields": ",".join(reversed(fields))}
                )
                assert narrowed.status_code == 200, narrowed.text
                one = msgspec.json.decode(narrowed.content, type=RawSingle)
                assert one.meta == msgspec.json.decode(whole.content, type=RawSingle).meta
                whole_record = msgspec.json.decode(whole.content, type=RawSingle).results
                assert_narrowed(bytes(one.results), bytes(whole_record), fields)
                assert narrowed.headers["etag"] != whole.headers["etag"]
        refused = client.get(f"/v1/applicants/{applicant_id}", params={"fields": "nope"})
        assert refused.status_code == 400
        assert refused.json()["error"]["details"]["parameter"] == "fields"


@pytest.mark.e2e
def test_a_cursor_keeps_the_selection_and_refuses_another(live_server: Server) -> None:
    with client_of(live_server) as client:
        params = {"limit": "250", "order-by": "last_name:desc,first_name", "fields": "email_1,id"}
        first = _raw_page(client.get("/v1/applicants", params=params))
        cursor = first.meta["next"]
        # Carried by the cursor; given again with it, the same selection in any order.
        for extra in ({}, {"fields": "id,email_1"}, {"fields": ""}):
            page = _raw_page(client.get("/v1/applicants", params={"cursor": cursor, **extra}))
            assert all(list(json.loads(bytes(r))) == ["id", "email_1"] for r in page.results)
        other = client.get("/v1/applicants", params={"cursor": cursor, "fields": "id"})
        assert other.status_code == 400
        assert other.json()["error"]["details"] == {"parameter": "fields", "value": "id"}
        # Followed to the end, the narrowed walk is the whole walk's records, narrowed.
        whole_ids: list[str] = []
        page = _raw_page(client.get("/v1/applicants", params={**params, "fields": ""}))
        while True:
            whole_ids += [json.loads(bytes(r))["id"] for r in page.results]
            if not page.meta["hasMore"]:
                break
            page = _raw_page(client.get("/v1/applicants", params={"cursor": page.meta["next"]}))
        narrowed_ids: list[str] = []
        page = first
        while True:
            narrowed_ids += [json.loads(bytes(r))["id"] for r in page.results]
            if not page.meta["hasMore"]:
                break
            page = _raw_page(client.get("/v1/applicants", params={"cursor": page.meta["next"]}))
        assert narrowed_ids == whole_ids
        assert len(whole_ids) == len(set(whole_ids))


@pytest.mark.e2e
def test_a_narrowed_page_has_its_own_etag_and_revalidates(live_server: Server) -> None:
    with client_of(live_server) as client:
        whole = client.get("/v1/applicants")
        narrowed = client.get("/v1/applicants", params={"fields": ",".join(FOUR)})
        assert whole.headers["etag"] != narrowed.headers["etag"]
        again = client.get(
            "/v1/applicants",
            params={"fields": ",".join(FOUR)},
            headers={"If-None-Match": narrowed.headers["etag"]},
        )
        assert again.status_code == 304
        crossed = client.get(
            "/v1/applicants",
            params={"fields": ",".join(FOUR)},
            headers={"If-None-Match": whole.headers["etag"]},
        )
        assert crossed.status_code == 200
        assert crossed.content == narrowed.content


def _raw_bytes(client: httpx.Client, params: dict[str, str], encoding: str) -> tuple[str, bytes]:
    """(Content-Encoding, body as sent): httpx would otherwise decode it."""
    with client.stream(
        "GET", "/v1/applicants", params=params, headers={"Accept-Encoding": encoding}
    ) as response:
        assert response.status_code == 200
        return response.headers.get("content-encoding", "identity"), b"".join(response.iter_raw())


@pytest.mark.e2e
@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_a_narrowed_page_in_every_encoding(live_server: Server, encoding: str) -> None:
    params = {"limit": "250", "fields": ",".join(FOUR)}
    with client_of(live_server) as client:
        _, plain = _raw_bytes(client, params, "identity")
        whole_page = _raw_page(client.get("/v1/applicants", params={"limit": "250"}))
        chosen, body = _raw_bytes(client, params, encoding)
    assert chosen == encoding
    decoded = {
        "gzip": gzip.decompress,
        "br": lambda b: bytes(brotli.decompress(b)),
        "zstd": zstd.decompress,
    }[encoding](body)
    assert decoded == plain
    assert_narrowed_page(msgspec.json.decode(plain, type=RawPage), whole_page, FOUR)


def _lines(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n")
    return body[:-1].split(b"\n")


@pytest.mark.e2e
@pytest.mark.parametrize("fields", [FOUR, ("updated_at", "phone_1", "self_reported_income")])
def test_streams_are_narrowed(live_server: Server, fields: Sequence[str]) -> None:
    selected = {"fields": ",".join(fields)}
    with client_of(live_server) as client:
        for params in ({"property_id": "prop_entrata_01_011"}, {"changed_since": "0"}, {}):
            whole = _lines(client.get("/v1/applicants", params=params, headers=NDJSON).content)
            narrowed = _lines(
                client.get("/v1/applicants", params={**params, **selected}, headers=NDJSON).content
            )
            assert len(narrowed) == len(whole) > 0
            for line, whole_line in zip(narrowed, whole, strict=True):
                if whole_line.startswith(b'{"changeSeq":'):
                    assert line == whole_line  # the sync stream's positions, unchanged
                else:
                    assert_narrowed(line, whole_line, fields)
