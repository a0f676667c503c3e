"""A webhook receiver for tests: a threaded http.server on a free loopback port that
records every request it is sent and answers as the test says."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WAIT_SECONDS = 90.0  # bounded, and generous: the machine is shared


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


# (status, headers) to answer a request with, given how many came before it.
Answer = Callable[[int, "Received"], tuple[int, dict[str, str]]]


@dataclass
class Receiver:
    url: str
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [request.event for request in self.received]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            if predicate(self.events()):
                return
            time.sleep(0.05)
        raise AssertionError(f"{what}: not within {WAIT_SECONDS} s; got {len(self.events())}")

    def wait_for_count(self, count: int) -> None:
        self.wait_for(lambda events: len(events) >= count, f"{count} requests")


def accept(number: int, request: Received) -> tuple[int, dict[str, str]]:
    return 204, {}


@contextmanager
def receiving(answer: Answer = accept, path: str = "/hook") -> Iterator[Receiver]:
    receiver = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver would
        disable_nagle_algorithm = True  # headers and body are two writes

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            headers = {name.lower(): value for name, value in self.headers.items()}
            body = self.rfile.read(length)
            if len(body) < length:  # the sender was killed mid-request: nothing arrived
                self.close_connection = True
                return
            request = Received(headers, body)
            with receiver.lock:
                number = len(receiver.received)
                receiver.received.append(request)
            status, headers = answer(number, request)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            content = b"" if status == 204 else b"ok"  # a 204 has no body
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class QuietServer(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a sender killed mid-request (tests/webhooks/test_kills.py) is expected

    server = QuietServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
