"""Response compression: the encoding that costs the server least, by fast libraries.

Nearly every HTTP client asks for compression (requests, httpx and curl `--compressed`
send `gzip, deflate` and often `br` or `zstd`), so a compressed page is the common
case, not the exception. Measured on 100-record pages (~200 KB) of seeded applicants,
one core, best of five (`benchmarks/codecs.py`, removed from the benchmarks since and
kept in the history at commit d986a0d):

| codec | us per page | ratio |
|---|---:|---:|
| zlib level 6 (Litestar's gzip, and ours before) | 2,600 | 6.9x |
| brotli quality 4 (Litestar's brotli, and ours before) | 1,340 | 7.2x |
| gzip by ISA-L (`isal`), level 1 | 260 | 5.0x |
| brotli quality 0 | 330 | 5.0x |
| zstd level 1 | 350 | 6.6x |

So gzip is made by ISA-L, brotli at quality 0 and zstd at level 1; and when a client
accepts several, the server picks by its own cost at a comparable size: gzip, then
brotli, then zstd (which buys a quarter fewer bytes for a third more CPU). A client
that wants the smaller zstd answer says so with a higher `q`: the client's preference
by `q` comes first, the server's cost breaks ties.

Litestar's `CompressionMiddleware` offers one encoding plus a stdlib-gzip fallback and
reads `Accept-Encoding` by substring (so `gzip;q=0` counts as yes); this one negotiates
by `q`, supports streamed bodies (the NDJSON lists), and is the only place a response is
compressed.

An answer with an ETag names its bytes (an unchanged ETag means unchanged bytes,
`applicants/controller.py`): its compressed form is kept, per encoding, from the second
time the same answer is compressed (`caches.RecentPages`), so the page a client polls
is compressed once per write rather than per request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import brotli  # type: ignore[import-untyped]
import zstandard
from isal import isal_zlib

from leasestar.applicants.caches import RecentPages
from leasestar.asgi import header_value

_KeptKey = tuple[str, str | None, str]
MINIMUM_SIZE: Final = 1024  # below this, compression saves less than the headers it adds
_GZIP_WBITS: Final = 31  # zlib's way of asking for a gzip header and trailer


class Compressor(Protocol):
    def compress(self, data: bytes) -> bytes: ...
    def sync(self) -> bytes:
        """What is buffered, ended so the client can decode everything sent so far."""
        ...

    def finish(self) -> bytes: ...


class _Gzip:
    def __init__(self) -> None:
        self._compressor = isal_zlib.compressobj(1, isal_zlib.DEFLATED, _GZIP_WBITS)

    def compress(self, data: bytes) -> bytes:
        return bytes(self._compressor.compress(data))

    def sync(self) -> bytes:
        return bytes(self._compressor.flush(isal_zlib.Z_SYNC_FLUSH))

    def finish(self) -> bytes:
        return bytes(self._compressor.flush())


class _Brotli:
    def __init__(self) -> None:
        self._compressor = brotli.Compressor(quality=0, mode=brotli.MODE_TEXT)

    def compress(self, data: bytes) -> bytes:
        return bytes(self._compressor.process(data))

    def sync(self) -> bytes:
        return bytes(self._compressor.flush())

    def finish(self) -> bytes:
        return bytes(self._compressor.finish())


class _Zstd:
    """By `zstandard`, the library that also decodes the stored bodies (`bodies.py`): one
    binding of libzstd for the product."""

    def __init__(self) -> None:
        # A compressor of its own: compressobj() works in its ZstdCompressor's context,
        # which two answers streamed at once must not share.
        self._compressor = zstandard.ZstdCompressor(level=1).compressobj()

    def compress(self, data: bytes) -> bytes:
        return bytes(self._compressor.compress(data))

    def sync(self) -> bytes:
        return bytes(self._compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))

    def finish(self) -> bytes:
        return bytes(self._compressor.flush())


# The server's order of preference: cheapest first at a comparable size.
ENCODINGS: Final[dict[str, Callable[[], Compressor]]] = {
    "gzip": _Gzip,
    "br": _Brotli,
    "zstd": _Zstd,
}
_SERVER_RANK: Final = {name: rank for rank, name in enumerate(ENCODINGS)}


def choose_encoding(accept_encoding: str | None) -> str | None:
    """The encoding to answer with: the client's highest `q`, the server's cost on ties;
    None for identity (nothing offered, or nothing we make)."""
    if not accept_encoding:
        return None
    offered: dict[str, float] = {}
    for element in accept_encoding.split(","):
        coding, _, parameters = element.partition(";")
        coding = coding.strip().lower()
        quality = 1.0
        name, _, value = parameters.partition("=")
        if name.strip().lower() == "q":
            try:
                quality = float(value)
            except ValueError:
                quality = 0.0
        if coding == "*":
            offered.update({name: quality for name in ENCODINGS if name not in offered})
        elif coding in ENCODINGS:
            offered[coding] = quality
    acceptable = [(quality, name) for name, quality in offered.items() if quality > 0]
    if not acceptable:
        return None
    return min(acceptable, key=lambda item: (-item[0], _SERVER_RANK[item[1]]))[1]


def _set_header(headers: list[tuple[bytes, bytes]], name: bytes, value: bytes | None) -> None:
    headers[:] = [(key, old) for key, old in headers if key.lower() != name]
    if value is not None:
        headers.append((name, value))


def _kept_key(headers: list[tuple[bytes, bytes]], encoding: str) -> _KeptKey | None:
    """What names a compressed answer: its ETag, its media type and the encoding; None
    for an answer without an ETag."""
    etag = header_value(headers, b"etag")
    return None if etag is None else (etag, header_value(headers, b"content-type"), encoding)


def _add_vary(headers: list[tuple[bytes, bytes]]) -> None:
    for index, (key, value) in enumerate(headers):
        if key.lower() == b"vary":
            if b"accept-encoding" not in value.lower():
                headers[index] = (key, value + b", Accept-Encoding")
            return
    headers.append((b"vary", b"Accept-Encoding"))


class CompressionMiddleware:
    """Compresses answers of MINIMUM_SIZE bytes or more, and streamed answers, in the
    encoding `choose_encoding` picks; leaves every other answer untouched, but for the
    `Vary: Accept-Encoding` of one it would have compressed."""

    def __init__(self, app: Any, kept_bytes: int = 0) -> None:
        self.app = app
        # (ETag, media type, encoding) -> the compressed body of that answer.
        self._kept: RecentPages[_KeptKey, bytes] = RecentPages(kept_bytes, weigh=len)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        encoding = choose_encoding(header_value(scope["headers"], b"accept-encoding"))
        # An identity answer that would have been compressed for another client varies by
        # Accept-Encoding as well. The API's routes declare their Vary themselves (on every
        # answer, 304s included), so their identity answers, the hot path, skip this wrapper.
        if encoding is None and scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _CompressingSend(send, encoding, self._kept))


class _CompressingSend:
    """The `send` of one response, compressing its body on the way out.

    A whole body (one message) is compressed at once and gets its new Content-Length; a
    streamed body is compressed part by part, each part flushed so that the client can
    decode every line it has received (a resumable stream needs that).
    """

    def __init__(self, send: Any, encoding: str | None, kept: RecentPages[_KeptKey, bytes]) -> None:
        self._send = send
        self._encoding = encoding
        self._kept = kept
        self._start: dict[str, Any] | None = None
        self._compressor: Compressor | None = None

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._start = message  # held until the first body part says how to answer
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        start, self._start = self._start, None
        if start is not None:
            await self._first(start, message)
            return
        if self._compressor is None:  # an answer left as it is
            await self._send(message)
            return
        more = bool(message.get("more_body"))
        body = self._compressor.compress(message.get("body", b""))
        body += self._compressor.sync() if more else self._compressor.finish()
        await self._send({"type": "http.response.body", "body": body, "more_body": more})

    async def _first(self, start: dict[str, Any], message: dict[str, Any]) -> None:
        headers: list[tuple[bytes, bytes]] = list(start.get("headers", ()))
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body"))
        if (
            start["status"] in (204, 304)
            or any(key.lower() == b"content-encoding" for key, _ in headers)
            or (not more and len(body) < MINIMUM_SIZE)
        ):
            await self._send(start)
            await self._send(message)
            return
        if self._encoding is None:  # identity asked for: only say that the answer varies
            _add_vary(headers)
            await self._send({**start, "headers": headers})
            await self._send(message)
            return
        # The key of an answer compressed before, which may be kept; its ETag holds the
        # data version, so every entry is kept at one version, 0.
        key = None if more or start["status"] != 200 else _kept_key(headers, self._encoding)
        kept = key if key is not None and self._kept.asked_before(key) else None
        compressed = None if kept is None else self._kept.get(kept, 0)
        if compressed is not None:
            body = compressed
        else:
            compressor = ENCODINGS[self._encoding]()
            body = compressor.compress(body)
            body += compressor.sync() if more else compressor.finish()
            if more:
                self._compressor = compressor
            elif kept is not None:
                self._kept.put(kept, 0, body)
        _set_header(headers, b"content-length", None if more else b"%d" % len(body))
        _set_header(headers, b"content-encoding", self._encoding.encode())
        _add_vary(headers)
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": more})
