"""One subscription's HTTP/1.1 connection to its receiver: a POST at a time, kept alive.

Written on asyncio streams and httptools (the parser the server's own protocol uses,
protocol.py) rather than httpx: a delivery to a loopback receiver cost 1.8 ms of CPU
through httpx's client, transport and anyio layers (540 deliveries a second for one
subscription, every one of them the sender's CPU), against ~0.2 ms here, and a
delivery needs none of what those layers add: one request at a time to one origin,
a fixed method, a body already in memory, no cookies, no redirects.

What it keeps of the sender's promises (deliverer.py):
- the address connected to is checked before a byte is sent, TLS handshake included
  (`RefusedAddress`), so a name that resolves elsewhere at connect time cannot get a
  delivery into a private network;
- redirects are not followed (a 3xx is an answer like any other) and no proxy is used;
- of the answer only ANSWER_BYTES are kept, and at most DRAIN_BYTES read to keep the
  connection: a larger answer closes it instead;
- the caller bounds the whole exchange with one timeout.

A kept connection idle for KEEPALIVE_SECONDS is closed before the next POST (httpx's
default too): a receiver's own idle timeout may close it at any moment after, and a
POST written into a connection the receiver is closing gets no answer. A reused
connection that ends before any byte of an answer is tried once more on a new one,
as browsers do; the receiver may have had the first, which at least once allows.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import ssl
import time
from typing import Final, NamedTuple
from urllib.parse import unquote, urlsplit

import certifi
import httptools

ANSWER_BYTES: Final = 1024
DRAIN_BYTES: Final = 64 * 1024
KEEPALIVE_SECONDS: Final = 5.0
READ_BYTES: Final = 64 * 1024


# Loopback, link-local (cloud metadata), private, ULA, multicast, unspecified: off
# limits unless the operator says otherwise, so a token allowed to subscribe cannot make
# the server POST into its own network.
ALLOW_PRIVATE_ENV: Final = "LEASESTAR_WEBHOOK_ALLOW_PRIVATE"


class RefusedAddress(Exception):
    """The receiver's address is one deliveries may not go to."""


class BrokenAnswer(Exception):
    """The receiver closed the connection without a whole answer, or answered what is not
    HTTP/1.x; `nothing_read` when not one byte of an answer came."""

    def __init__(self, message: str, *, nothing_read: bool = False) -> None:
        super().__init__(message)
        self.nothing_read = nothing_read


def refused(address: str) -> bool:
    """Whether a peer address is off limits (an IPv4 address mapped in IPv6 as itself)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
    )


class Answer(NamedTuple):
    status: int
    text: str  # the answer's first ANSWER_BYTES, decoded
    retry_after: str | None  # the header, unparsed


class Target(NamedTuple):
    """Where a URL's requests go, and the start of their head."""

    scheme: str
    host: str
    port: int
    head: bytes  # request line, host, user-agent and, for a URL with credentials, their auth

    @classmethod
    def of(cls, url: str, user_agent: str) -> Target:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"POST {path} HTTP/1.1",
            f"host: {parts.netloc.rpartition('@')[2]}",
            f"user-agent: {user_agent}",
        ]
        if parts.username is not None:  # as httpx sent them: basic auth
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            lines.append("authorization: Basic " + base64.b64encode(pair.encode()).decode())
        head = "".join(line + "\r\n" for line in lines).encode("latin-1")
        return cls(parts.scheme, parts.hostname or "", port, head)

    def request(self, headers: dict[str, str], body: bytes) -> bytes:
        """The whole request, in one buffer: one write, so one segment for a small one."""
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        return b"%s%scontent-length: %d\r\n\r\n%s" % (
            self.head,
            lines.encode("latin-1"),
            len(body),
            body,
        )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """certifi's roots, as httpx verified with before (made once: loading them costs ms)."""
    return ssl.create_default_context(cafile=certifi.where())


class _Reading:
    """httptools' callbacks for one answer (an interim 1xx one is skipped)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.complete = False
        self.keep_alive = False
        self.retry_after: str | None = None
        self.kept = bytearray()
        self.body_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if len(self.kept) < ANSWER_BYTES:
            self.kept += body[: ANSWER_BYTES - len(self.kept)]

    def on_message_complete(self) -> None:
        if self.status >= 200:
            self.complete = True
            # Asked now: once the message is done, the parser answers for the next one.
            self.keep_alive = self.parser.should_keep_alive()
        else:
            self.status, self.retry_after = 0, None


class ReceiverConnection:
    """POSTs to one receiver, one at a time, over a connection kept between them.

    A POST cancelled (by the caller's timeout) or failed part way leaves the connection
    closed: what the receiver would send next on it is unknown.
    """

    def __init__(self, *, allow_private: bool) -> None:
        self._allow_private = allow_private
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.StreamReader | None = None
        self._origin: tuple[str, str, int] | None = None
        self._idle_since = 0.0

    async def post(self, target: Target, headers: dict[str, str], body: bytes) -> Answer:
        request = target.request(headers, body)
        if self._writer is not None and (
            self._origin != target[:3]
            or time.monotonic() - self._idle_since > KEEPALIVE_SECONDS
            or self._writer.is_closing()
            or (self._reader is not None and self._reader.at_eof())
        ):
            self.close()
        reused = self._writer is not None
        try:
            try:
                return await self._exchange(target, request)
            except (BrokenAnswer, ConnectionError) as error:
                if not (reused and getattr(error, "nothing_read", True)):
                    raise
                self.close()  # the receiver closed it meanwhile: once more, on a new one
                return await self._exchange(target, request)
        except BaseException:
            self.close()
            raise

    async def _open(self, target: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        self._reader, self._writer, self._origin = reader, writer, target[:3]
        peer = writer.get_extra_info("peername")
        if not self._allow_private and (peer is None or refused(str(peer[0]))):
            self.close()
            raise RefusedAddress(
                f"refused: {peer[0] if peer else 'an unknown address'} is a loopback, "
                f"private or link-local address ({ALLOW_PRIVATE_ENV}=on allows it)"
            )
        if target.scheme == "https":
            await writer.start_tls(_tls_context(), server_hostname=target.host)
        return reader, writer

    async def _exchange(self, target: Target, request: bytes) -> Answer:
        if self._writer is None or self._reader is None:
            reader, writer = await self._open(target)
        else:
            reader, writer = self._reader, self._writer
        writer.write(request)
        reading = _Reading()
        read_any = False
        while not reading.complete:
            data = await reader.read(READ_BYTES)
            if not data:
                if reading.status:  # an answer delimited by the connection's end
                    self.close()
                    break
                raise BrokenAnswer("closed before answering", nothing_read=not read_any)
            read_any = True
            try:
                reading.parser.feed_data(data)
            except httptools.HttpParserError as error:
                raise BrokenAnswer(f"not an HTTP answer ({error})") from None
            if reading.body_bytes > DRAIN_BYTES:
                self.close()  # not worth reading to the end to keep the connection
                break
        if not reading.keep_alive:
            self.close()
        self._idle_since = time.monotonic()
        text = bytes(reading.kept).decode("utf-8", "replace")
        return Answer(reading.status, text, reading.retry_after)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = self._origin = None
