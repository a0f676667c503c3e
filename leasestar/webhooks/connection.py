"""One subscription's connection to its receiver: aiohttp's client, a POST at a time, kept
alive.

aiohttp rather than httpx or a client of our own. Against a loopback receiver in another
process a POST cost the sender 0.22 ms of CPU through aiohttp, 0.93 ms through httpx's
client, transport and anyio layers, and 0.064 ms through the HTTP/1.1 client on asyncio
streams and httptools this module held before: 242 lines of framing, keep-alive, TLS and
retry handling for us to keep correct, which aiohttp's maintainers keep instead.

What it keeps of the sender's promises (deliverer.py):
- no connection is made to a loopback, private or link-local address (`RefusedAddress`):
  the resolver drops such answers, so a name cannot resolve into a private network, and
  an address written in the URL, which aiohttp connects to without the resolver, is
  checked before the request;
- TLS verified against certifi's roots; redirects not followed (a 3xx is an answer like
  any other); no proxy, whatever the environment says;
- one timeout bounds the whole exchange, its answer's body included;
- of the answer only ANSWER_BYTES are kept, and at most DRAIN_BYTES read to keep the
  connection: a larger answer closes it instead.

A kept connection idle for KEEPALIVE_SECONDS is closed before the next POST (httpx's
default too): a receiver's own idle timeout may close it at any moment after, and a POST
written into a connection the receiver is closing gets no answer. A reused connection
that ends before the answer is tried once more on a new one, as browsers do (aiohttp
does so itself only for idempotent methods); the receiver may have had the first, which
at least once allows.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from typing import Any, Final, NamedTuple

import aiohttp
import certifi
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.connector import Connection
from aiohttp.resolver import DefaultResolver
from aiohttp.tracing import Trace
from yarl import URL

ANSWER_BYTES: Final = 1024
DRAIN_BYTES: Final = 64 * 1024
KEEPALIVE_SECONDS: Final = 5.0


# Loopback, link-local (cloud metadata), private, ULA, multicast, unspecified: off
# limits unless the operator says otherwise, so a token allowed to subscribe cannot make
# the server POST into its own network.
ALLOW_PRIVATE_ENV: Final = "LEASESTAR_WEBHOOK_ALLOW_PRIVATE"


class RefusedAddress(Exception):
    """The receiver's address is one deliveries may not go to."""

    def __init__(self, address: str) -> None:
        super().__init__(
            f"refused: {address} is a loopback, private or link-local address "
            f"({ALLOW_PRIVATE_ENV}=on allows it)"
        )


def refused(address: str) -> bool:
    """Whether a peer address is off limits: anything not globally reachable (private,
    loopback, link-local, carrier-grade NAT's 100.64.0.0/10, where a cloud's metadata
    service may be, reserved, unspecified) or multicast; an IPv4 address inside IPv6
    (mapped, 6to4, Teredo) judged as itself."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None:
            ip = inner
    return not ip.is_global or ip.is_multicast


def _check_address_in(url: URL) -> None:
    """Refuses a URL whose host is an address aiohttp would connect to as written.

    aiohttp's own test for such a host (`helpers.is_ip_address`): a colon, or only digits
    and dots. One of those `ipaddress` cannot read is refused too, not let through.
    """
    host = url.raw_host or ""
    if ":" in host or host.replace(".", "").isdigit():
        try:
            off_limits = refused(host)
        except ValueError:
            off_limits = True
        if off_limits:
            raise RefusedAddress(host)


class PublicResolver(AbstractResolver):
    """The system's resolver, less the answers deliveries may not go to.

    aiohttp connects only to addresses its resolver returns, so filtering them here
    refuses a private address before a connection is even attempted, whichever answer
    DNS gives at the moment of connecting.
    """

    def __init__(self) -> None:
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._resolver.resolve(host, port, family)
        allowed = [answer for answer in answers if not refused(answer["host"])]
        if answers and not allowed:
            raise RefusedAddress(answers[0]["host"])
        return allowed

    async def close(self) -> None:
        await self._resolver.close()


class Answer(NamedTuple):
    status: int | None  # None: no answer (`text` says why)
    text: str  # the answer's first ANSWER_BYTES, decoded
    retry_after: str | None  # the header, unparsed


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """certifi's roots, as httpx verified with before (made once: loading them costs ms)."""
    return ssl.create_default_context(cafile=certifi.where())


class _OneConnection(aiohttp.TCPConnector):
    """A pool that says whether its last connection handed out was a kept one: only a
    POST on a kept connection that ends unanswered is worth a second try. (aiohttp's
    tracing says so too, but its signals cost a quarter of a delivery's CPU.)"""

    def __init__(self, **options: Any) -> None:
        super().__init__(limit=1, **options)
        self.reused = False
        self._last: object = None  # the last connection's protocol, kept to compare

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
    ) -> Connection:
        connection = await super().connect(req, traces, timeout)
        self.reused = connection.protocol is self._last
        self._last = connection.protocol
        return connection


class ReceiverConnection:
    """POSTs to one receiver, one at a time, over a connection kept between them.

    A session of its own (a pool of one connection) rather than one shared by every
    subscription: a shared pool limited to one connection per host would queue two
    subscriptions to the same host behind each other, and one slow receiver must only
    ever delay itself. Made inside the event loop; `close` it when done.
    """

    def __init__(self, *, user_agent: str, allow_private: bool, timeout: float) -> None:
        self._seconds = timeout
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._allow_private = allow_private
        self._connector = _OneConnection(
            keepalive_timeout=KEEPALIVE_SECONDS,
            ssl=_tls_context(),
            resolver=None if allow_private else PublicResolver(),
        )
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            headers={"user-agent": user_agent},
            # Neither asked for nor decoded: only the answer's first KiB is kept, as sent.
            skip_auto_headers=["accept-encoding"],
            auto_decompress=False,
            trust_env=False,  # never through a proxy the environment names
        )

    async def attempt(self, url: str, headers: dict[str, str], body: bytes) -> Answer:
        """`post`'s answer, or one without a status whose text says why there was none."""
        try:
            return await self.post(url, headers, body)
        except TimeoutError:
            return Answer(None, f"no answer within {self._seconds:g} s", None)
        except RefusedAddress as error:
            return Answer(None, str(error), None)
        except (OSError, aiohttp.ClientError) as error:  # refused, reset, DNS, TLS, not HTTP
            return Answer(None, f"{type(error).__name__}: {error}"[:ANSWER_BYTES], None)

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> Answer:
        target = URL(url)
        if not self._allow_private:
            _check_address_in(target)
        deadline = asyncio.get_running_loop().time() + self._seconds
        self._connector.reused = False
        try:
            return await self._exchange(target, headers, body, self._timeout)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if not self._connector.reused:
                raise
        # The receiver closed the kept connection meanwhile: once more, on a new one,
        # within what is left of the one timeout.
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise TimeoutError
        return await self._exchange(target, headers, body, aiohttp.ClientTimeout(total=left))

    async def _exchange(
        self,
        target: URL,
        headers: dict[str, str],
        body: bytes,
        within: aiohttp.ClientTimeout,
    ) -> Answer:
        async with self._session.post(
            target,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=within,  # the whole exchange, the answer's body included
        ) as answer:
            kept = bytearray()
            read = 0
            while chunk := await answer.content.readany():
                read += len(chunk)
                if len(kept) < ANSWER_BYTES:
                    kept += chunk[: ANSWER_BYTES - len(kept)]
                if read > DRAIN_BYTES:
                    # Not worth reading to the end to keep the connection: aiohttp closes
                    # one whose answer is released unread instead of keeping it.
                    break
            text = bytes(kept).decode("utf-8", "replace")
            return Answer(answer.status, text, answer.headers.get("retry-after"))

    async def close(self) -> None:
        await self._session.close()
