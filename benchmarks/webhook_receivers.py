"""Loopback webhook receivers for webhooks.py: `webhook_receivers.py N` prints N ports and
serves until SIGTERM, recording each POST's arrival; an asyncio protocol over httptools on
uvloop, so that a receiver is not what limits the sender."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Final, cast

import httptools
import msgspec
import uvloop

# Kept whole: the first requests and then one in SAMPLE_EVERY.
SAMPLE_FIRST: Final = 20
SAMPLE_EVERY: Final = 5000
_OK: Final = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


class _Head(msgspec.Struct):
    change_seq: int
    event_id: str


_decode_head = msgspec.json.Decoder(_Head).decode


@dataclass
class Record:
    arrivals: list[tuple[float, int, str]] = field(default_factory=list)
    samples: list[dict[str, object]] = field(default_factory=list)

    def add(self, headers: dict[str, str], body: bytes) -> None:
        arrived = time.time()
        head = _decode_head(body)
        self.arrivals.append((arrived, head.change_seq, head.event_id))
        count = len(self.arrivals)
        if count <= SAMPLE_FIRST or count % SAMPLE_EVERY == 0:
            self.samples.append({"headers": headers, "body": body.decode()})

    def answer(self, path: str) -> bytes:
        if path == "/arrivals":
            lines = b"".join(msgspec.json.encode(a) + b"\n" for a in self.arrivals)
            return _response(lines, "application/x-ndjson")
        if path == "/samples":
            return _response(json.dumps(self.samples).encode(), "application/json")
        if path == "/count":
            return _response(str(len(self.arrivals)).encode(), "text/plain")
        return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def _response(body: bytes, kind: str) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


class _Connection(asyncio.Protocol):
    def __init__(self, record: Record) -> None:
        self._record = record
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        if self._parser.get_method() == b"POST":
            self._record.add(self._headers, b"".join(self._body))
            self._transport.write(_OK)
        else:
            self._transport.write(self._record.answer(self._url.decode()))


async def _serve(count: int) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    for _ in range(count):
        record = Record()
        server = await loop.create_server(
            lambda record=record: _Connection(record), "127.0.0.1", 0, backlog=64
        )
        servers.append(server)
    ports = [server.sockets[0].getsockname()[1] for server in servers]
    print(json.dumps(ports), flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> None:
    uvloop.run(_serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
