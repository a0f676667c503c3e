"""The HTTP/1.1 connection: uvicorn's httptools protocol, with the limits a server that
faces the internet alone needs before any request reaches the app (issue 18).

uvicorn's parsers keep a request head in memory until it is complete: with httptools, 100
MB of header lines on one connection raised the server's RSS by 116 MB, and no timer ran
until a first response had been sent, so a connection that never finished its head stayed
open for ever. This subclass adds, per connection:

- a bound on the bytes of a request head (request line and headers), counted as they
  arrive: past `MAX_HEAD_BYTES` the head is refused with 431 (414 while the request line
  is still arriving) and the connection closed, so no connection holds more than that plus
  one socket read (256 KiB under uvloop);
- a deadline for the head: `head_timeout` seconds after the connection opened or its
  previous response was sent, a connection with no complete head is closed, however
  slowly its bytes trickle in (uvicorn's keep-alive timer, which any byte restarts, still
  closes idle connections sooner);
- a deadline for a response the client does not read: when the connection's send
  buffer stays full for `send_timeout` seconds, the connection is closed (uvicorn would
  wait for the client for ever, holding the response and the connection);
- a cap on open connections per worker: past `max_connections`, a request is answered
  503 and its connection closed (uvicorn's `limit_concurrency` answers plain text and
  counts running requests as well);
- no request body: this API has only GET routes, so a request announcing one is answered
  413 at once instead of being read;
- the API's JSON error body on every refusal, the parser's own 400 included.

Why httptools and not h11, whose `max_incomplete_event_size` bounds the head by itself:
measured interleaved on the list default and get by id routes (benchmarks/RESULTS.md,
"Server"), h11 cost 40-50 % more server CPU per request; these checks cost a counter per
read and a deadline moved per request (one timer per connection checks it).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Final

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from leasestar.config import Settings
from leasestar.errors import error_body

# A head over this is refused (431): twice the largest head the app accepts (8 KiB of
# target and 16 KiB of header names and values, with their separators), so every head the
# app would judge still reaches it and gets its precise 414 or 431.
MAX_HEAD_BYTES: Final = 64 * 1024
# Past this many bytes of request line, the refusal is 414 (the app's own limit is 8 KiB).
MAX_REQUEST_LINE_BYTES: Final = 32 * 1024
# Seconds a client is asked to wait before retrying after a 503 at the connection cap.
RETRY_AFTER_SECONDS: Final = 1


@functools.cache
def _settings() -> Settings:
    """The connection limits of this process, read once from `LEASESTAR_*` (each worker
    process reads them as the app factory does)."""
    return Settings.from_env()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request already refused."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools connection with head, time, connection and body limits."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        settings = _settings()
        self.head_timeout = settings.head_timeout
        self.send_timeout = settings.send_timeout
        self.send_timer: asyncio.TimerHandle | None = None
        self.max_connections = settings.max_connections
        self.head_bytes = 0  # bytes received since the last complete head
        self.heads = 0  # complete heads on this connection
        # The head's deadline (loop time), None while no head is awaited; and the timer
        # that checks it, armed at most once at a time (`_start_head_timer`).
        self.head_deadline: float | None = None
        self.head_timer: asyncio.TimerHandle | None = None
        self.refused = False

    # --- connection events ------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The client reads slower than the server writes: from now, it has send_timeout
        seconds to take some of it."""
        super().pause_writing()
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(self.send_timeout, self.transport.close)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # what follows a refusal is not read
        self._unset_keepalive_if_required()
        heads = self.heads
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no WebSocket here: the request is answered as plain HTTP
        except httptools.HttpParserError:
            if not self.refused:  # a refusal raises _Refused through the parser
                self.refuse(400, "the request is not valid HTTP/1.1")
            return
        # The part of this read after a completed head is not counted (at most one read),
        # so a head is refused a little late rather than ever too early.
        self.head_bytes = self.head_bytes + len(data) if self.heads == heads else 0
        over = self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing()
        if over and not self._refuse_long_target():
            self.refuse(431, f"the request head is longer than {MAX_HEAD_BYTES} bytes")

    # --- parser callbacks -------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.heads += 1
        self._stop_head_timer()
        if len(self.connections) > self.max_connections:
            self.refuse(
                503,
                f"the server holds its maximum of {self.max_connections} connections; "
                "retry shortly",
                ((b"retry-after", str(RETRY_AFTER_SECONDS).encode()),),
            )
            raise _Refused
        if self._refuse_long_target():
            raise _Refused
        if self._announces_body():
            self.refuse(413, "this API takes no request body")
            raise _Refused
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._start_head_timer()

    # --- limits -----------------------------------------------------------------------

    def _refuse_long_target(self) -> bool:
        """Refuse with 414 a request line over MAX_REQUEST_LINE_BYTES; True if it was.

        Checked here because httptools' URL parser fails on 64 KiB and more, which would
        otherwise reach the client as a 400."""
        if len(getattr(self, "url", b"")) <= MAX_REQUEST_LINE_BYTES:
            return False
        self.refuse(414, f"the request target is longer than {MAX_REQUEST_LINE_BYTES} bytes")
        return True

    def _announces_body(self) -> bool:
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                return True
        return False

    def _start_head_timer(self) -> None:
        """The next head is due within `head_timeout` seconds from now.

        Only the deadline moves with each request: the timer stays armed and, when it
        fires before the deadline (a later request moved it), waits for the rest. A new
        timer for every response, and cancelling it at every head, cost 2-3 us a request
        in a loop of them (`loop.call_later` and `cancel` under uvloop).
        """
        self.head_deadline = self.loop.time() + self.head_timeout
        if self.head_timer is None:
            self.head_timer = self.loop.call_at(self.head_deadline, self._head_timer_fired)

    def _stop_head_timer(self) -> None:
        """No head is awaited (one is complete, or the connection is refused or lost)."""
        self.head_deadline = None

    def _head_timer_fired(self) -> None:
        self.head_timer = None
        deadline = self.head_deadline
        if deadline is None:
            return  # no head awaited: the next response arms the timer again
        if self.loop.time() < deadline:
            self.head_timer = self.loop.call_at(deadline, self._head_timer_fired)
            return
        self.head_deadline = None
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy and not self.pipeline and not self.transport.is_closing():
            self.transport.close()

    def refuse(
        self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        """Answer `status` with the error body and close the connection; nothing more is read.

        While a response is still being written on this connection (a client that pipelines),
        a second one cannot be put beside it: the connection is only closed.
        """
        self.refused = True
        self._stop_head_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        body = error_body(status, message)
        head = [STATUS_LINE[status]]
        for name, value in (
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *headers,
        ):
            head += [name, b": ", value, b"\r\n"]
        self.transport.write(b"".join([*head, b"\r\n", body]))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's plain-text 400 for a request it cannot parse, as the API's error body."""
        if not self.refused:
            self.refuse(400, "the request is not valid HTTP/1.1")
