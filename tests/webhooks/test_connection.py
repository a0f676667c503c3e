"""The sender's connection (aiohttp's client) against raw loopback servers that answer
byte for byte as each test writes: kept alive, answers of every framing, and what it
refuses."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest
import trustme
from aiohttp.abc import ResolveResult

from leasestar.webhooks import connection as connection_module
from leasestar.webhooks.connection import (
    ANSWER_BYTES,
    PublicResolver,
    ReceiverConnection,
    RefusedAddress,
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


@asynccontextmanager
async def opened(
    *, allow_private: bool = True, seconds: float = 30
) -> AsyncIterator[ReceiverConnection]:
    connection = ReceiverConnection(
        user_agent="test-agent", allow_private=allow_private, timeout=seconds
    )
    try:
        yield connection
    finally:
        await connection.close()


async def post(connection: ReceiverConnection, url: str, body: bytes = b"{}") -> tuple[int, str]:
    answer = await asyncio.wait_for(
        connection.post(url, {"content-type": "application/json"}, body), 30
    )
    return answer.status, answer.text


def head_of(request: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """(request line, headers by lower-case name, body) of a request as the server read it."""
    head, _, body = request.partition(b"\r\n\r\n")
    line, *fields = head.split(b"\r\n")
    pairs = [field.split(b": ", 1) for field in fields]
    return line, {name.lower(): value for name, value in pairs}, body


async def test_one_connection_carries_every_post_with_the_request_as_written() -> None:
    async with raw_server(lambda n: OK) as server, opened() as connection:
        for n in range(5):
            assert await post(connection, server.url, b'{"n": %d}' % n) == (200, "ok")
    assert server.connections == 1
    port = server.url.split(":")[2].split("/")[0]
    assert head_of(server.requests[3]) == (
        b"POST /hook?x=1 HTTP/1.1",
        {
            b"host": b"127.0.0.1:" + port.encode(),
            b"user-agent": b"test-agent",
            b"content-type": b"application/json",
            b"accept": b"*/*",
            b"content-length": b"8",
        },
        b'{"n": 3}',
    )


async def test_credentials_in_the_url_are_sent_as_basic_auth_and_nowhere_else() -> None:
    async with raw_server(lambda n: OK) as server, opened() as connection:
        with_credentials = server.url.replace("http://", "http://user:pa%20ss@")
        assert await post(connection, with_credentials) == (200, "ok")
    line, headers, _ = head_of(server.requests[0])
    assert line == b"POST /hook?x=1 HTTP/1.1"
    assert headers[b"authorization"] == b"Basic dXNlcjpwYSBzcw=="  # user:pa ss
    assert b"user" not in headers[b"host"]


async def test_a_chunked_answer_is_read_whole_with_its_retry_after_and_kept_alive() -> None:
    chunked = (
        b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nbusy!\r\n3\r\n...\r\n0\r\n\r\n"
    )
    async with (
        raw_server(lambda n: chunked if n == 0 else OK) as server,
        opened() as connection,
    ):
        answer = await connection.post(server.url, {}, b"{}")
        assert answer == (503, "busy!...", "7")
        assert await post(connection, server.url) == (200, "ok")
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
    async with raw_server(lambda n: first if n == 0 else OK) as server, opened() as connection:
        assert await post(connection, server.url) == read
        assert await post(connection, server.url) == (200, "ok")
    assert server.connections == 2


async def test_a_redirect_is_an_answer_not_followed() -> None:
    moved = b"HTTP/1.1 307 Moved\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n"
    async with raw_server(lambda n: moved) as server, opened() as connection:
        assert await post(connection, server.url) == (307, "")
    assert len(server.requests) == 1


async def test_a_proxy_the_environment_names_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens: it would fail
    async with raw_server(lambda n: OK) as server, opened() as connection:
        assert await post(connection, server.url) == (200, "ok")
    assert len(server.requests) == 1


async def test_a_kept_connection_closed_unanswered_is_tried_once_more_on_a_new_one() -> None:
    # The second request reaches a connection the receiver then closes (its idle timeout
    # racing the request): sent again on a new connection, answered there.
    async with (
        raw_server(lambda n: None if n == 1 else OK) as server,
        opened() as connection,
    ):
        assert await post(connection, server.url) == (200, "ok")
        assert await post(connection, server.url) == (200, "ok")
    assert server.connections == 2
    assert len(server.requests) == 3  # at least once: the receiver read it twice


async def test_a_new_connection_closed_unanswered_is_an_error_not_a_retry() -> None:
    async with raw_server(lambda n: None) as server, opened() as connection:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(connection, server.url)
    assert len(server.requests) == 1


async def test_a_kept_connection_idle_too_long_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough that a loaded machine's stall between two POSTs stays under it.
    monkeypatch.setattr(connection_module, "KEEPALIVE_SECONDS", 2.0)
    async with raw_server(lambda n: OK) as server, opened() as connection:
        assert await post(connection, server.url) == (200, "ok")
        assert await post(connection, server.url) == (200, "ok")  # at once: kept
        await asyncio.sleep(4.0)  # idle past KEEPALIVE_SECONDS
        assert await post(connection, server.url) == (200, "ok")
    assert server.connections == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"",  # nothing at all
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nstarted",  # a body that stops
    ],
)
async def test_one_timeout_bounds_the_whole_exchange_its_body_included(answer: bytes) -> None:
    async with raw_server(lambda n: answer) as server, opened(seconds=0.5) as connection:
        with pytest.raises(TimeoutError):
            await post(connection, server.url)


async def test_an_answer_that_is_not_http_is_an_error() -> None:
    async with (
        raw_server(lambda n: b"SSH-2.0-OpenSSH\r\n\r\n") as server,
        opened() as connection,
    ):
        with pytest.raises(aiohttp.ClientResponseError):
            await post(connection, server.url)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_loopback_receiver_is_refused_before_connecting(host: str) -> None:
    # An address in the URL is checked as written; a name, by what it resolves to.
    async with raw_server(lambda n: OK, host=host) as server:
        async with opened(allow_private=False) as connection:
            with pytest.raises(RefusedAddress, match=r"refused: (127\.0\.0\.1|::1) is a loopback"):
                await post(connection, server.url)
        await asyncio.sleep(0.05)  # had it connected, the server would have counted it
    assert server.connections == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/",
        "http://[::ffff:127.0.0.1]/",
        "https://[fd00::1]/",
        "http://0.0.0.0:8080/",
    ],
)
async def test_a_private_address_in_the_url_is_refused(url: str) -> None:
    async with opened(allow_private=False) as connection:
        with pytest.raises(RefusedAddress):
            await post(connection, url)


class _Answering:
    """The system's resolver replaced by fixed answers: a name resolving to several."""

    def __init__(self, *addresses: str) -> None:
        self._addresses = addresses

    def __call__(self) -> _Answering:
        return self

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(hostname=host, host=address, port=port, family=family, proto=0, flags=0)
            for address in self._addresses
        ]

    async def close(self) -> None:
        pass


async def test_a_name_resolving_partly_into_a_private_network_keeps_only_public_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answering = _Answering("10.0.0.7", "93.184.215.14", "169.254.169.254", "2606:4700::1111")
    monkeypatch.setattr(connection_module, "DefaultResolver", answering)
    resolver = PublicResolver()
    kept = await resolver.resolve("receiver.example", 443)
    assert [answer["host"] for answer in kept] == ["93.184.215.14", "2606:4700::1111"]
    monkeypatch.setattr(connection_module, "DefaultResolver", _Answering("192.168.0.2"))
    with pytest.raises(RefusedAddress, match=r"192\.168\.0\.2"):
        await PublicResolver().resolve("receiver.example", 443)


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
    async with (
        raw_server(lambda n: OK, serving_tls(authority), "localhost") as server,
        opened() as connection,
    ):
        for _ in range(3):
            assert await post(connection, server.url) == (200, "ok")
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /hook?x=1 HTTP/1.1\r\nHost: localhost:")


async def test_a_certificate_from_an_unknown_authority_is_refused_unsent(
    authority: trustme.CA,
) -> None:
    async with (
        raw_server(lambda n: OK, serving_tls(authority), "localhost") as server,
        opened() as connection,
    ):
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post(connection, server.url)
    assert server.requests == []
