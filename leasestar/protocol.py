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
- a bound on pipelined requests: at most `MAX_PIPELINED` requests wait behind the one
  being answered; past it the connection reads and parses nothing more until they are
  answered (issue 29: uvicorn parsed every request a client sent ahead, 2 MB of them
  took the server from 71 to 212 MB, and resumed reading after every answer);
- a minimum pace for a response the client reads slowly or not at all: while the
  connection's send buffer is full, the client must take `MIN_SEND_RATE` bytes a second
  of it, measured over each `send_timeout` seconds, or the connection is aborted
  (uvicorn would wait for the client for ever, holding the response and the connection);
- a cap on open connections per worker: past `max_connections`, a request is answered
  503 and its connection closed (uvicorn's `limit_concurrency` answers plain text and
  counts running requests as well); the last `reserved_connections` of the cap serve only
  requests that carry a bearer token, which may also close idle connections that carry
  none to make room; and one client address holds at most `max_connections_per_address`;
- no request body but a small one on POST (creating a webhook subscription is the one
  route that takes a body): any other request announcing one, or a POST body over
  `MAX_BODY_BYTES` or sent chunked, is answered 413 at once instead of being read, and a
  body must arrive whole within the head's deadline;
- the API's JSON error body on every refusal, the parser's own 400 included.

Why httptools and not h11, whose `max_incomplete_event_size` bounds the head by itself:
measured interleaved on the list default and get by id routes (benchmarks/RESULTS.md,
"Server"), h11 cost 40-50 % more server CPU per request; these checks cost a counter per
read and a deadline moved per request (one timer per connection checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import struct
from typing import TYPE_CHECKING, Any, Final

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from leasestar.config import Settings
from leasestar.errors import error_body

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application

# A head over this is refused (431): twice the largest head the app accepts (8 KiB of
# target and 16 KiB of header names and values, with their separators), so every head the
# app would judge still reaches it and gets its precise 414 or 431.
MAX_HEAD_BYTES: Final = 64 * 1024
# Past this many bytes of request line, the refusal is 414 (the app's own limit is 8 KiB).
MAX_REQUEST_LINE_BYTES: Final = 32 * 1024
# The largest request body: a webhook subscription (`POST /v1/webhooks/`) is a few hundred
# bytes of JSON; bodies go to POST only, with a Content-Length (not chunked).
MAX_BODY_BYTES: Final = 16 * 1024
# Seconds a client is asked to wait before retrying after a 503 at the connection cap.
RETRY_AFTER_SECONDS: Final = 1
# Requests parsed ahead of the one being answered, at most (plus what one PARSE_SLICE
# holds): enough for a client that pipelines a few requests, and a bound on what a client
# that sends thousands and reads nothing costs (each queued request is a few KiB).
MAX_PIPELINED: Final = 8
# A read longer than this is parsed a slice at a time, so parsing stops within a slice of
# the MAX_PIPELINED-th request (at most 1024 / 18 minimal requests more). A request head
# rarely exceeds it, so an ordinary read is still parsed in one call.
PARSE_SLICE: Final = 1024
# The socket send buffer of a connection with requests held back (`_shrink_send_buffer`).
PIPELINED_SEND_BUFFER: Final = 64 * 1024
# Bytes a second a client must take of a response while the send buffer is full, over
# each send_timeout: a pace rather than a deadline per response, because a large NDJSON
# stream to a steady client may rightly take minutes, while a client that takes a few
# hundred bytes at a time keeps a response, its SQLite snapshot and a connection for as
# long as it likes under any timer that any progress restarts (issue 29). 8 KiB/s is
# 64 kbit/s, slower than any link an integration runs on; a stalled client is cut after
# send_timeout, one that trickles below this pace at the end of the first window it
# falls short in.
MIN_SEND_RATE: Final = 8 * 1024
# Seconds over which a connection holding pipelined requests back must keep that pace: a
# client that reads its answers drains 64 KiB (PIPELINED_SEND_BUFFER) in a round trip.
PIPELINED_PACE_WINDOW: Final = 2


_RESET_ON_CLOSE: Final = struct.pack("ii", 1, 0)  # struct linger {l_onoff, l_linger}
# struct tcp_info up to tcpi_bytes_acked, a u64 at offset 120 (Linux 4.1 and later).
_TCP_INFO: Final[int | None] = getattr(socket, "TCP_INFO", None)
_TCP_INFO_BYTES: Final = 128
_BYTES_ACKED: Final = struct.Struct("Q")


@functools.cache
def _settings() -> Settings:
    """The connection limits of this process, read once from `LEASESTAR_*` (each worker
    process reads them as the app factory does)."""
    return Settings.from_env()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request already refused."""


def reserved_share(settings: Settings) -> int:
    """Connections of the cap only requests carrying a bearer token may use: the
    setting, at most half the cap (a cap of 5 still serves 3 unauthenticated)."""
    return min(settings.reserved_connections, settings.max_connections // 2)


def address_key(host: str) -> str:
    """The unit the per-address cap counts: an IPv4 address, or an IPv6 /64 (one host
    on IPv6 commonly holds a whole /64)."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        # An IPv4 client of a listener on `::`: its own address, not the one /64 that
        # holds every IPv4 address.
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network(f"{address}/64", strict=False))


class _HeldFlow(FlowControl):
    """uvicorn's flow control, except that reading stays paused while the protocol
    holds it: uvicorn resumes reading after every response and at every `receive()` of
    the app, which would read (and parse) the next 256 KiB of pipelined requests each
    time."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__(transport)
        self.held = False

    def resume_reading(self) -> None:  # FlowControl's, inlined: it runs after every answer
        if self.read_paused and not self.held:
            self.read_paused = False
            self._transport.resume_reading()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools connection with head, time, connection and body limits."""

    # Open connections of this worker process per address_key (one event loop: no lock).
    open_per_address: dict[str, int] = {}  # noqa: RUF012 (shared on purpose)
    flow: _HeldFlow

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
        # While writes are paused: the timer checking the client's pace, and what it had
        # taken (`_taken`) when the current window began.
        self.send_timer: asyncio.TimerHandle | None = None
        self.taken_before = 0
        self.pace_window = self.send_timeout  # the seconds the timer's window lasts
        # Without TCP_INFO: bytes drained from the transport's buffer while writes were
        # paused, and its size when they last paused.
        self.drained = 0
        self.paused_size = 0
        self.max_connections = settings.max_connections
        # Past this many open connections only requests with a bearer token are served.
        self.open_to_all = settings.max_connections - reserved_share(settings)
        self.max_per_address = settings.max_connections_per_address
        self.address: str | None = None  # counted in open_per_address under this key
        self.bearer = False  # the last request on this connection carried a bearer token
        # Bytes read but not parsed yet, held while MAX_PIPELINED requests wait.
        self.unparsed = bytearray()
        self.send_buffer_shrunk = False
        self.head_bytes = 0  # bytes received since the last complete head
        self.heads = 0  # complete heads on this connection
        # The head's deadline (loop time), None while no head is awaited; and the timer
        # that checks it, armed at most once at a time (`_start_head_timer`).
        self.head_deadline: float | None = None
        self.head_timer: asyncio.TimerHandle | None = None
        self.refused = False
        self.body_due = False  # a request body announced and not complete yet
        self.running: RequestResponseCycle | None = None  # the request being answered

    # --- connection events ------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _HeldFlow(transport)
        if self.client is not None:
            address = address_key(self.client[0])
            count = self.open_per_address.get(address, 0)
            if count >= self.max_per_address:
                self.refuse(
                    503,
                    f"this address holds the server's maximum of {self.max_per_address} "
                    "connections from one address; retry shortly",
                    ((b"retry-after", str(RETRY_AFTER_SECONDS).encode()),),
                )
                return
            self.open_per_address[address] = count + 1
            self.address = address
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.address is not None:
            left = self.open_per_address[self.address] - 1
            if left:
                self.open_per_address[self.address] = left
            else:
                del self.open_per_address[self.address]
            self.address = None
        self.unparsed.clear()
        self._stop_head_timer()
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The client reads slower than the server writes: from now, it must keep the
        pace MIN_SEND_RATE (`_check_send_pace`)."""
        super().pause_writing()
        self.paused_size = self.transport.get_write_buffer_size()
        if self.send_timer is None:
            self.taken_before = self._taken()
            self._arm_send_pace()

    def resume_writing(self) -> None:
        """The client took the buffer down to its low-water mark. The timer is not
        cancelled: a client that takes a few bytes whenever writes pause would otherwise
        restart it for ever (issue 29: 200 bytes every 0.1 s was never cut)."""
        super().resume_writing()
        self.drained += self.paused_size - self.transport.get_write_buffer_size()

    def _check_send_pace(self) -> None:
        self.send_timer = None
        if not self.flow.write_paused:
            return  # the client caught up: the next pause starts a new window
        taken = self._taken()
        if taken - self.taken_before < MIN_SEND_RATE * self.pace_window:
            self.abort()
            return
        self.taken_before = taken
        self._arm_send_pace()

    def _arm_send_pace(self) -> None:
        """Check the client's pace in one window from now: `send_timeout`, or
        PIPELINED_PACE_WINDOW for a connection holding pipelined requests back, whose
        client has sent more requests than it reads answers of (issue 29: the attacker
        that pipelines and never reads was cut after a whole send timeout, 32 s)."""
        held = bool(self.unparsed)
        self.pace_window = (
            min(self.send_timeout, PIPELINED_PACE_WINDOW) if held else self.send_timeout
        )
        self.send_timer = self.loop.call_later(self.pace_window, self._check_send_pace)

    def _taken(self) -> int:
        """Bytes the client has taken of what was sent on this connection.

        TCP's own count where the kernel gives it (Linux TCP_INFO, tcpi_bytes_acked): the
        transport's buffer only drains when the kernel's send buffer, which Linux grows to
        4 MiB, has room for a third of itself, so a client reading 128 KiB/s could leave it
        full for 10 s and more. Elsewhere, that coarser count: bytes drained from the
        transport's buffer while writes were paused."""
        sock = self.transport.get_extra_info("socket")
        if _TCP_INFO is not None and sock is not None:
            with contextlib.suppress(OSError):
                info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_BYTES)
                if len(info) >= _TCP_INFO_BYTES:
                    acked: int = _BYTES_ACKED.unpack_from(info, _TCP_INFO_BYTES - 8)[0]
                    return acked
        paused = self.paused_size - self.transport.get_write_buffer_size()
        return self.drained + (paused if self.flow.write_paused else 0)

    def abort(self) -> None:
        """Drop the connection and what its send buffer holds.

        Not close(), which waits for the buffer to drain, as a client that reads nothing
        never lets it (issue 29: a stalled stream lasted 95 s, until its client gave up).
        The request being answered sees the disconnection first (its `send` returns, its
        `receive` says http.disconnect, so a stream ends now): uvloop refuses a write to
        an aborted transport, and uvicorn only learns of it in connection_lost, later."""
        if self.running is not None:
            self.running.disconnected = True
            self.running.message_event.set()
        self.flow.resume_writing()  # wakes a `send` waiting to write, to return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            # Linger 0: the kernel drops what it holds too, and resets the connection;
            # a plain close leaves it sending the client up to 4 MiB, on its own time.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        self.transport.abort()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self.running = cycle
        super()._start_asgi_task(cycle, app)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # what follows a refusal is not read
        self._unset_keepalive_if_required()
        if self.unparsed or len(data) > PARSE_SLICE or len(self.pipeline) >= MAX_PIPELINED:
            self.unparsed += data
            self._parse_held()
        else:
            self._parse(data)  # an ordinary read: one request head, or a few

    def _parse_held(self) -> None:
        """Parse the unparsed bytes a slice at a time while fewer than MAX_PIPELINED
        requests wait; then hold the rest, and reading, until they are answered."""
        unparsed = self.unparsed
        start = 0
        while start < len(unparsed) and not self.refused:
            if len(self.pipeline) >= MAX_PIPELINED:
                break
            self._parse(unparsed[start : start + PARSE_SLICE])
            start += PARSE_SLICE
        del unparsed[:start]
        if self.refused:
            unparsed.clear()
        held, self.flow.held = bool(unparsed), bool(unparsed)
        if held:
            self.flow.pause_reading()
            if not self.send_buffer_shrunk:
                self._shrink_send_buffer()
        elif not self.pipeline:
            self.flow.resume_reading()

    def _shrink_send_buffer(self) -> None:
        """Hold at most PIPELINED_SEND_BUFFER of answers in the kernel for this client.

        Linux grows a socket's send buffer to 4 MiB: a client that pipelines requests
        and reads none of the answers had about 25,000 of them answered before writes
        paused and the send timeout could start (issue 29). Only a connection that has
        requests held back pays: its throughput becomes two of these buffers per round
        trip, enough for answers that are pipelined, which are small."""
        self.send_buffer_shrunk = True
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPELINED_SEND_BUFFER)

    def _parse(self, data: bytes | bytearray) -> None:
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
        announces_body = self._scan_head()
        if len(self.connections) > self.open_to_all and not self._room_at_the_cap():
            self.refuse(
                503,
                f"the server holds its maximum of {self.max_connections} connections; "
                "retry shortly",
                ((b"retry-after", str(RETRY_AFTER_SECONDS).encode()),),
            )
            raise _Refused
        if self._refuse_long_target():
            raise _Refused
        if announces_body:
            if not self._body_allowed():
                self.refuse(
                    413,
                    "this API takes a request body only on POST, with a Content-Length "
                    f"of at most {MAX_BODY_BYTES} bytes",
                )
                raise _Refused
            # The body is bounded in size; the head's deadline bounds it in time too.
            self.body_due = True
            self.head_deadline = self.loop.time() + self.head_timeout
            if self.head_timer is None:
                self.head_timer = self.loop.call_at(self.head_deadline, self._head_timer_fired)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self.body_due:
            self.body_due = False
            self._stop_head_timer()
        super().on_message_complete()

    def _body_allowed(self) -> bool:
        """A POST whose Content-Length is at most MAX_BODY_BYTES (no chunked body)."""
        if self.parser.get_method() != b"POST":
            return False
        length = None
        for name, value in self.headers:
            if name == b"transfer-encoding":
                return False
            if name == b"content-length":
                length = value
        return length is not None and length.isdigit() and int(length) <= MAX_BODY_BYTES

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.unparsed and len(self.pipeline) < MAX_PIPELINED:
            self._parse_held()  # the requests held back, now that one is answered
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

    def _scan_head(self) -> bool:
        """Whether the request announces a body; notes whether it carries a bearer token
        (`self.bearer`). One pass over the headers, which this check made anyway."""
        announces_body = bearer = False
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                announces_body = True
            elif name == b"authorization":
                bearer = value[:7].lower() == b"bearer "
        self.bearer = bearer
        return announces_body

    def _room_at_the_cap(self) -> bool:
        """Whether this request may be served with the worker's connections past
        `open_to_all`: only one carrying a bearer token, within `max_connections`, or by
        closing idle connections to get there.

        The token is not checked here (the app does, and answers 401): a bearer header is
        what a client must send to be served at all, so the reserve is for clients that
        try; it costs nothing per request below the cap. Idle connections (waiting for a
        head, or kept alive between requests) whose last request carried no token are
        closed first: HTTP lets a server close an idle connection at any time, and
        otherwise sockets that never send a request hold the cap until the head timeout,
        reopened as fast as they are closed (issue 29: 94 of 94 authenticated requests
        answered 503)."""
        if not self.bearer:
            return False
        excess = len(self.connections) - self.max_connections
        if excess <= 0:
            return True
        for tokenless_first in (True, False):
            for other in list(self.connections):
                if excess <= 0:
                    return True
                if (
                    other is not self
                    and isinstance(other, GuardedHttpToolsProtocol)
                    and not (tokenless_first and other.bearer)
                    and other._idle()
                ):
                    self.connections.discard(other)  # counted out now, closed next
                    other.transport.close()
                    excess -= 1
        return excess <= 0

    def _idle(self) -> bool:
        """No request in progress or waiting, nothing to send: closing loses nothing."""
        return (
            (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.unparsed
            and not self.transport.is_closing()
            and self.transport.get_write_buffer_size() == 0
        )

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
        if self.body_due:  # a body that did not arrive in time
            self.abort()
            return
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy and not self.pipeline and not self.transport.is_closing():
            # A client that left part of its last answer unread gets no more time to:
            # close() would wait for it to read the rest.
            if self.transport.get_write_buffer_size():
                self.abort()
            else:
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
