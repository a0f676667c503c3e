"""The sender's HTTP/1.1 connection against raw loopback servers that answer byte for
byte as each test writes: kept alive, answers of every framing, and what it refuses."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trustme

from leasestar.webhooks import connection as connection_module
from leasestar.webhooks.connection import (
    ANSWER_BYTES,
    BrokenAnswer,
    ReceiverConnection,
    RefusedAddress,
    Target,
)

# What the server writes for the Nth request it reads (None: close without answering).
Script = Callable[[int], bytes | None]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@dataclass
class RawServer:
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


@asynccontextmanager
async def raw_server(
    script: Script, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[RawServer]:
    server = RawServer()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            while (request := await _read_request(reader)) is not None:
                server.requests.append(request)
                answer = script(len(server.requests) - 1)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if b"connection: close" in answer.lower():
                    break
        finally:
            writer.close()

    listening = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = listening.sockets[0].getsockname()[1]
    server.url = f"{'https' if tls else 'http'}://{host}:{port}/hook?x=1"
    try:
        yield server
    finally:
        listening.close()


def target(url: str) -> Target:
    return Target.of(url, "test-agent")


async def post(connection: ReceiverConnection, url: str, body: bytes = b"{}") -> tuple[int, str]:
    answer = await asyncio.wait_for(
        connection.post(target(url), {"content-type": "application/json"}, body), 30
    )
    return answer.status, answer.text


async def test_one_connection_carries_every_post_with_the_request_as_written() -> None:
    async with raw_server(lambda n: OK) as server:
        connection = ReceiverConnection(allow_private=True)
        for n in range(5):
            assert await post(connection, server.url, b'{"n": %d}' % n) == (200, "ok")
        connection.close()
    assert server.connections == 1
    port = server.url.split(":")[2].split("/")[0]
    assert server.requests[3] == (
        b"POST /hook?x=1 HTTP/1.1\r\nhost: 127.0.0.1:" + port.encode() + b"\r\n"
        b"user-agent: test-agent\r\ncontent-type: application/json\r\n"
        b'content-length: 8\r\n\r\n{"n": 3}'
    )


async def test_a_chunked_answer_is_read_whole_with_its_retry_after_and_kept_alive() -> None:
    chunked = (
        b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nbusy!\r\n3\r\n...\r\n0\r\n\r\n"
    )
    async with raw_server(lambda n: chunked if n == 0 else OK) as server:
        connection = ReceiverConnection(allow_private=True)
        answer = await connection.post(target(server.url), {}, b"{}")
        assert answer == (503, "busy!...", "7")
        assert await post(connection, server.url) == (200, "ok")
        connection.close()
    assert server.connections == 1


BIG = b"x" * (200 * 1024)


@pytest.mark.parametrize(
    ("first", "read"),
    [
        # framed by the connection's end: read to the close
        (b"HTTP/1.1 500 Oops\r\nconnection: close\r\n\r\nit broke", (500, "it broke")),
        # too large to read to its end: the first KiB kept, the connection dropped
        (
            b"HTTP/1.1 400 No\r\ncontent-length: %d\r\n\r\n%s" % (len(BIG), BIG),
            (400, "x" * ANSWER_BYTES),
        ),
    ],
)
async def test_an_answer_that_ends_its_connection_is_read_and_the_next_gets_a_new_one(
    first: bytes, read: tuple[int, str]
) -> None:
    async with raw_server(lambda n: first if n == 0 else OK) as server:
        connection = ReceiverConnection(allow_private=True)
        assert await post(connection, server.url) == read
        assert await post(connection, server.url) == (200, "ok")
        connection.close()
    assert server.connections == 2


async def test_a_kept_connection_closed_unanswered_is_tried_once_more_on_a_new_one() -> None:
    # The second request reaches a connection the receiver then closes (its idle timeout
    # racing the request): sent again on a new connection, answered there.
    async with raw_server(lambda n: None if n == 1 else OK) as server:
        connection = ReceiverConnection(allow_private=True)
        assert await post(connection, server.url) == (200, "ok")
        assert await post(connection, server.url) == (200, "ok")
        connection.close()
    assert server.connections == 2
    assert len(server.requests) == 3  # at least once: the receiver read it twice


async def test_a_new_connection_closed_unanswered_is_an_error_not_a_retry() -> None:
    async with raw_server(lambda n: None) as server:
        connection = ReceiverConnection(allow_private=True)
        with pytest.raises(BrokenAnswer):
            await post(connection, server.url)
    assert len(server.requests) == 1


async def test_an_answer_that_is_not_http_is_a_broken_answer() -> None:
    async with raw_server(lambda n: b"SSH-2.0-OpenSSH\r\n\r\n") as server:
        connection = ReceiverConnection(allow_private=True)
        with pytest.raises(BrokenAnswer):
            await post(connection, server.url)


async def test_a_loopback_receiver_is_refused_before_a_byte_is_sent() -> None:
    async with raw_server(lambda n: OK) as server:
        connection = ReceiverConnection(allow_private=False)
        with pytest.raises(RefusedAddress, match=r"refused: 127\.0\.0\.1 is a loopback"):
            await post(connection, server.url)
        await asyncio.sleep(0.05)  # had anything been sent, the server would have read it
    assert server.requests == []


@pytest.fixture
def authority() -> trustme.CA:
    return trustme.CA()


def serving_tls(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    return context


async def test_https_is_verified_and_kept_alive(
    authority: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    monkeypatch.setattr(connection_module, "_tls_context", lambda: trusting)
    async with raw_server(lambda n: OK, serving_tls(authority), "localhost") as server:
        connection = ReceiverConnection(allow_private=True)
        for _ in range(3):
            assert await post(connection, server.url) == (200, "ok")
        connection.close()
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /hook?x=1 HTTP/1.1\r\nhost: localhost:")


async def test_a_certificate_from_an_unknown_authority_is_refused_unsent(
    authority: trustme.CA,
) -> None:
    async with raw_server(lambda n: OK, serving_tls(authority), "localhost") as server:
        connection = ReceiverConnection(allow_private=True)
        with pytest.raises(ssl.SSLCertVerificationError):
            await post(connection, server.url)
    assert server.requests == []


@pytest.mark.parametrize(
    ("url", "request_line", "host", "port", "authorization"),
    [
        ("http://example.com", b"POST / HTTP/1.1", b"example.com", 80, None),
        ("https://example.com/a/b?c=d&e", b"POST /a/b?c=d&e HTTP/1.1", b"example.com", 443, None),
        ("http://[2001:db8::1]:8080/h", b"POST /h HTTP/1.1", b"[2001:db8::1]:8080", 8080, None),
        # user:pa ss, as HTTP basic auth encodes it
        ("http://user:pa%20ss@h.test/", b"POST / HTTP/1.1", b"h.test", 80, b"dXNlcjpwYSBzcw=="),
    ],
)
def test_a_url_makes_the_request_line_host_and_credentials(
    url: str, request_line: bytes, host: bytes, port: int, authorization: bytes | None
) -> None:
    made = target(url)
    lines = made.head.split(b"\r\n")
    assert lines[0] == request_line
    assert lines[1] == b"host: " + host
    assert made.port == port
    assert (
        (lines[3] == b"authorization: Basic " + authorization)
        if authorization
        else (lines[3] == b"")
    )
