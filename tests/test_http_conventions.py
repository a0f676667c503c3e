"""HTTP conventions: compression on request above a minimum size, ETag and
If-None-Match on both GET routes, and HEAD answered like GET without the body."""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

import brotli
import pytest
from litestar.testing import AsyncTestClient

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]

from leasestar.applicants.pipeline import write_records
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import create_token

Client = AsyncTestClient  # type: ignore[type-arg]
MINIMUM_SIZE = 1024  # the compression threshold, README "Settings"
LIST = "/v1/applicants"


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


@pytest.fixture
def applicant_id(seeded_db: Path) -> str:
    connection = sqlite3.connect(seeded_db)
    try:
        return str(connection.execute("SELECT min(id) FROM applicants").fetchone()[0])
    finally:
        connection.close()


async def _raw(client: Client, url: str, accept_encoding: str) -> tuple[dict[str, str], bytes]:
    """Headers and body bytes exactly as sent (httpx would otherwise decode them)."""
    async with client.stream("GET", url, headers={"Accept-Encoding": accept_encoding}) as response:
        body = b"".join([chunk async for chunk in response.aiter_raw()])
        return dict(response.headers), body


# --- compression ------------------------------------------------------------------------


async def test_gzip_when_asked(client: Client) -> None:
    _, plain = await _raw(client, LIST, "identity")
    headers, body = await _raw(client, LIST, "gzip")
    assert len(plain) > MINIMUM_SIZE
    assert headers["content-encoding"] == "gzip"
    assert "accept-encoding" in headers["vary"].lower()
    assert gzip.decompress(body) == plain
    assert len(body) < len(plain) / 3


def _decoded(encoding: str, body: bytes) -> bytes:
    """The body decoded by each codec's reference decoder (zlib, brotli, libzstd)."""
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "br":
        return bytes(brotli.decompress(body))
    return zstd.decompress(body)


@pytest.mark.parametrize(
    ("accepted", "chosen"),
    [
        ("br", "br"),
        ("zstd", "zstd"),
        ("gzip, deflate, br, zstd", "gzip"),  # equal q: the cheapest for the server
        ("br, zstd", "br"),
        ("zstd, br;q=0.9", "zstd"),  # the client's q comes first
        ("br;q=1.0, gzip;q=0.5", "br"),
        ("gzip;q=0, br", "br"),  # q=0 means "not this one"
        ("GZIP", "gzip"),
        ("*", "gzip"),
        ("zstd;q=0.5, *;q=0.1", "zstd"),
    ],
)
async def test_the_encoding_is_negotiated_by_q_then_by_server_cost(
    client: Client, accepted: str, chosen: str
) -> None:
    _, plain = await _raw(client, LIST, "identity")
    headers, body = await _raw(client, LIST, accepted)
    assert headers["content-encoding"] == chosen, accepted
    assert int(headers["content-length"]) == len(body)
    assert _decoded(chosen, body) == plain
    assert len(body) < len(plain) * 0.3


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
async def test_an_answer_compressed_again_is_the_answer_as_it_is_now(
    client: Client, seeded_db: Path, encoding: str
) -> None:
    """A compressed answer is kept from its second request (per ETag, media type and
    encoding): kept or not, it decodes to the identity answer of that moment, also
    right after a write, and an NDJSON answer of the same URL is never a JSON one."""
    url = f"{LIST}?limit=7"
    for _ in range(3):
        _, plain = await _raw(client, url, "identity")
        headers, body = await _raw(client, url, encoding)
        assert headers["content-encoding"] == encoding
        assert int(headers["content-length"]) == len(body)
        assert _decoded(encoding, body) == plain
    connection = open_for_write(seeded_db)
    try:
        write_records(connection, synthetic_applicants(1, seed=99))
    finally:
        connection.close()
    for _ in range(3):
        _, now = await _raw(client, url, "identity")
        headers, body = await _raw(client, url, encoding)
        assert headers["content-encoding"] == encoding
        assert _decoded(encoding, body) == now != plain
    ndjson = {"Accept-Encoding": encoding, "Accept": "application/x-ndjson"}
    for _ in range(3):
        _, page = await _raw(client, LIST, encoding)
        assert _decoded(encoding, page).startswith(b'{"meta"')
        async with client.stream("GET", LIST, headers=ndjson) as response:
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
        assert response.headers["content-encoding"] == encoding
        lines = _decoded(encoding, raw).splitlines()
        assert len(lines) > 100
        assert all(line.startswith(b'{"id"') for line in lines)


async def test_no_encoding_we_make_means_identity(client: Client) -> None:
    for accepted in ("deflate", "compress", "gzip;q=0", "*;q=0", "identity;q=1, br;q=0"):
        headers, body = await _raw(client, LIST, accepted)
        assert "content-encoding" not in headers, accepted
        assert body.startswith(b'{"meta":'), accepted


async def test_no_compression_unless_asked(client: Client) -> None:
    for accepted in ("identity", ""):
        headers, body = await _raw(client, LIST, accepted)
        assert "content-encoding" not in headers, accepted
        assert body.startswith(b'{"meta":')


async def test_no_compression_below_the_minimum_size(client: Client) -> None:
    for url in ("/health", f"{LIST}?limit=250&x_property_id=none"):
        headers, body = await _raw(client, url, "gzip, br")
        assert len(body) < MINIMUM_SIZE, url
        assert "content-encoding" not in headers, url


async def test_compression_can_be_turned_off(seeded_db: Path, token: str) -> None:
    app = create_app(Settings(db_path=seeded_db, compression=False))
    async with AsyncTestClient(app=app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        headers, body = await _raw(client, LIST, "gzip, br")
    assert "content-encoding" not in headers
    assert len(body) > MINIMUM_SIZE


# --- ETag and If-None-Match ---------------------------------------------------------------


@pytest.fixture
def urls(applicant_id: str) -> tuple[str, ...]:
    return (LIST, f"{LIST}?limit=5&order-by=last_name", f"{LIST}/{applicant_id}")


async def test_etag_on_both_get_routes_and_stable(client: Client, urls: tuple[str, ...]) -> None:
    tags = []
    for url in urls:
        first = await client.get(url)
        second = await client.get(url)
        assert first.status_code == 200
        assert first.headers["etag"].startswith('W/"')
        assert first.headers["etag"] == second.headers["etag"], url
        tags.append(first.headers["etag"])
    assert len(set(tags)) == len(urls), "different requests, different validators"


@pytest.mark.parametrize("form", ["exact", "in-a-list", "star"])
async def test_if_none_match_answers_304_with_no_body(
    client: Client, urls: tuple[str, ...], form: str
) -> None:
    for url in urls:
        etag = (await client.get(url)).headers["etag"]
        sent = {"exact": etag, "in-a-list": f'W/"other", {etag}', "star": "*"}[form]
        response = await client.get(url, headers={"If-None-Match": sent})
        assert response.status_code == 304, url
        assert response.content == b""
        assert response.headers["etag"] == etag
        assert "content-encoding" not in response.headers


async def test_a_stale_etag_gets_the_full_answer(client: Client, urls: tuple[str, ...]) -> None:
    for url in urls:
        response = await client.get(url, headers={"If-None-Match": 'W/"0-0000000000000000"'})
        assert response.status_code == 200
        assert response.json()["results"]


async def test_a_write_changes_the_etag(
    client: Client, urls: tuple[str, ...], seeded_db: Path
) -> None:
    before = {url: (await client.get(url)).headers["etag"] for url in urls}
    connection = open_for_write(seeded_db)
    try:
        write_records(connection, synthetic_applicants(1, seed=4321))
    finally:
        connection.close()
    for url in urls:
        response = await client.get(url, headers={"If-None-Match": before[url]})
        assert response.status_code == 200, url
        assert response.headers["etag"] != before[url]


async def test_the_etag_depends_on_the_token_scope(
    client: Client, seeded_db: Path, db: sqlite3.Connection
) -> None:
    (integration,) = (
        sqlite3.connect(seeded_db)
        .execute("SELECT integration_id FROM applicants LIMIT 1")
        .fetchone()
    )
    scoped = create_token(db, "scoped", (integration,))
    everything = await client.get(LIST)
    narrowed = await client.get(LIST, headers={"Authorization": f"Bearer {scoped}"})
    assert everything.headers["etag"] != narrowed.headers["etag"]
    refused = await client.get(
        LIST,
        headers={"Authorization": f"Bearer {scoped}", "If-None-Match": everything.headers["etag"]},
    )
    assert refused.status_code == 200


# --- HEAD -------------------------------------------------------------------------------

_PER_REQUEST = {"x-request-id", "date"}


@pytest.fixture
def plain_client(client: Client) -> Client:
    client.headers["Accept-Encoding"] = "identity"
    return client


async def test_head_is_get_without_the_body(plain_client: Client, urls: tuple[str, ...]) -> None:
    for url in (*urls, "/health", f"{LIST}/app_missing", f"{LIST}?limit=0"):
        got = await plain_client.get(url)
        head = await plain_client.head(url)
        assert head.status_code == got.status_code, url
        assert head.content == b""
        assert int(head.headers["content-length"]) == len(got.content), url
        same = {k: v for k, v in got.headers.items() if k not in _PER_REQUEST}
        assert {k: v for k, v in head.headers.items() if k not in _PER_REQUEST} == same, url


async def test_head_of_a_compressed_answer(client: Client) -> None:
    client.headers["Accept-Encoding"] = "gzip"
    got = await client.get(LIST)
    head = await client.head(LIST)
    assert (got.headers["content-encoding"], head.headers["content-encoding"]) == ("gzip", "gzip")
    assert head.headers["content-length"] == got.headers["content-length"]
    assert head.content == b""


async def test_head_with_if_none_match(plain_client: Client, urls: tuple[str, ...]) -> None:
    for url in urls:
        etag = (await plain_client.head(url)).headers["etag"]
        response = await plain_client.head(url, headers={"If-None-Match": etag})
        assert response.status_code == 304
        assert response.content == b""


async def test_head_needs_the_token_like_get(plain_client: Client) -> None:
    plain_client.headers.pop("Authorization")
    response = await plain_client.head(LIST)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.content == b""


async def test_etags_differ_between_scopes_whatever_the_integration_ids(
    seeded_db: Path, token: str
) -> None:
    """Found by review: the unscoped token's scope was hashed as "*", and so was a scope
    of one integration named "*": a 304 could have crossed the two."""
    connection = open_for_write(seeded_db)
    try:
        star = create_token(connection, "star", ["*"])
    finally:
        connection.close()
    async with AsyncTestClient(app=create_app(Settings(db_path=seeded_db))) as client:
        tags = set()
        for bearer in (token, star):
            response = await client.get(
                "/v1/applicants", headers={"Authorization": f"Bearer {bearer}"}
            )
            assert response.status_code == 200
            tags.add(response.headers["etag"])
    assert len(tags) == 2
