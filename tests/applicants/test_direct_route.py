"""The direct routes of the list and get by id answer exactly as Litestar's routes do.

Two apps over two copies of one database (tokens included, each with its own rate-limit
file), one built with the direct route and one without (`create_app(direct_route=False)`),
are sent the same requests through ASGI. Every answer must be the same: status, every
header in order (but the request id), body, the access log line (but its id and
duration) and the metrics. The requests are drawn broadly: lists asking for JSON or
NDJSON, valid, unknown and foreign ids, odd path segments and paths Litestar normalises,
every kind of token, conditional requests, encodings, methods, query strings valid and
refused, invalid Host headers; the rate limit on (and exhausted) and off. Time stands
still, so the limit's headers agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from litestar import Litestar

from leasestar.config import RateLimit, Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.tokens import create_token, revoke_token

SCOPE = "int_entrata_01"
FROZEN_TIME = 1_800_000_000.25
PREFIX = "/v1/applicants/"


@dataclass
class Sent:
    """One request as a server hands it to the app."""

    method: str = "GET"
    path: str = PREFIX
    raw_path: bytes | None = None
    query: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def scope(self) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": self.method,
            "scheme": "http",
            "path": self.path,
            "raw_path": self.raw_path if self.raw_path is not None else quote(self.path).encode(),
            "query_string": self.query,
            "root_path": "",
            "headers": list(self.headers),
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }


@dataclass(frozen=True)
class Answer:
    """What a client and an operator see of one answer, less what differs every time."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    log: dict[str, Any]

    def header(self, name: bytes) -> bytes | None:
        return next((value for key, value in self.headers if key == name), None)


class LogLines(logging.Handler):
    """The lines a logger receives."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Pair:
    """The app with the direct route, and the app without it."""

    direct: Litestar
    routed: Litestar
    lines: LogLines
    tokens: dict[str, str]
    ids: dict[str, list[str]]

    async def ask(self, app: Litestar, sent: Sent) -> Answer:
        messages: list[dict[str, Any]] = []
        requests = [{"type": "http.request", "body": b"", "more_body": False}]
        answered = asyncio.Event()

        async def receive() -> dict[str, Any]:
            """The request, then nothing until the answer has ended, then the end of the
            connection, as uvicorn's (a stream listens for the client's leaving)."""
            if requests:
                return requests.pop()
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            messages.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered.set()

        before = len(self.lines.lines)
        await app(sent.scope(), receive, send)  # type: ignore[arg-type]
        start = messages[0]
        assert start["type"] == "http.response.start"
        (line,) = self.lines.lines[before:]
        log = json.loads(line)
        for varying in ("request_id", "duration_ms"):
            del log[varying]
        return Answer(
            status=start["status"],
            headers=tuple(
                (key, _methods_in_order(value) if key == b"allow" else value)
                for key, value in start["headers"]
                if key != b"x-request-id"
            ),
            body=b"".join(m.get("body", b"") for m in messages[1:]),
            log=log,
        )

    async def both(self, sent: Sent) -> Answer:
        """The answer of both apps, asserted identical."""
        direct = await self.ask(self.direct, sent)
        routed = await self.ask(self.routed, sent)
        assert direct == routed
        return direct

    def request_counts(self, app: Litestar) -> list[str]:
        from prometheus_client.exposition import generate_latest

        text = generate_latest(app.state.metrics.registry).decode()
        return [line for line in text.splitlines() if line.startswith("leasestar_http_requests")]


def _methods_in_order(allow: bytes) -> bytes:
    """An `Allow` header's methods sorted: Litestar lists a route's methods from a set, in
    an order that differs between two apps of one process (a 405 never reaches the direct
    route: it is a method other than GET)."""
    return b", ".join(sorted(method.strip() for method in allow.split(b",")))


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wall-clock time stands still: both apps' rate-limit windows read the same second."""
    monkeypatch.setattr(time, "time", lambda: FROZEN_TIME)


@pytest.fixture
def databases(seeded_copy: Path, tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """Two identical databases with four tokens: all, scoped, revoked, and a second one
    with the same scope as none (a token the rate limit has not seen)."""
    connection = open_for_write(seeded_copy)
    try:
        tokens = {
            "all": create_token(connection, "all"),
            "scoped": create_token(connection, "scoped", (SCOPE,)),
            "revoked": create_token(connection, "revoked"),
        }
        revoke_token(connection, "revoked")
    finally:
        connection.close()
    twin = tmp_path / "twin" / "leasestar.db"
    twin.parent.mkdir()
    source, target = sqlite3.connect(seeded_copy), sqlite3.connect(twin)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    return seeded_copy, twin, tokens


@contextlib.contextmanager
def log_lines(name: str) -> Iterator[LogLines]:
    handler = LogLines()
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@contextlib.asynccontextmanager
async def pair_of(
    databases: tuple[Path, Path, dict[str, str]], rate_limit: RateLimit | None
) -> AsyncIterator[Pair]:
    first, twin, tokens = databases
    connection = sqlite3.connect(first)
    try:
        rows = connection.execute(
            "SELECT id, integration_id FROM applicants ORDER BY id"
        ).fetchall()
    finally:
        connection.close()
    ids = {
        "own": [i for i, integration in rows if integration == SCOPE][:5],
        "foreign": [i for i, integration in rows if integration != SCOPE][:5],
    }
    assert ids["own"]
    assert ids["foreign"]
    common = {"log_format": "json", "rate_limit": rate_limit}
    direct = create_app(Settings(db_path=first, **common))  # type: ignore[arg-type]
    routed = create_app(Settings(db_path=twin, **common), direct_route=False)  # type: ignore[arg-type]
    with log_lines("leasestar.access") as lines:
        async with direct.lifespan(), routed.lifespan():
            pair = Pair(direct, routed, lines, tokens, ids)
            yield pair
            assert pair.request_counts(direct) == pair.request_counts(routed)


# --- what is drawn ---------------------------------------------------------------------

CREDENTIALS = ("all", "scoped", "revoked", "unknown", "malformed", "lower-case", "none")
QUERIES = (
    b"",
    b"limit=5",
    b"limit=0",
    b"limit=",
    b"offset=3&limit=1",
    b"order-by=",
    b"order-by=last_name:desc,first_name",
    b"order-by=nope",
    b"updated_at_gte=2020-01-01",
    b"updated_at_lte=2000-01-01T00:00Z",
    b"last_seen_gte=not-a-date",
    b"bogus=1",
    b"limit=1&limit=2",
    b"limit=%FF",
    b"\xff",
    b"integration_id=int_entrata_01",
    b"cursor=abc",
    b"wait=3",
    b"changed_since=0&limit=3",
    b"changed_since=latest",
    b"fields=id,first_name,email_1&limit=4",
    b"fields=id,middle_name&offset=2&limit=2",
    b"fields=nope",
    b"order-by=updated_at:desc&integration_vendor=entrata&limit=3",
)
ACCEPTS = (
    None,
    "application/json",
    "application/x-ndjson",
    "application/x-ndjson;q=0.5, application/json",
    "*/*",
)
CONDITIONS = (None, "*", " * ", "current", "current-strong", "listed", "other")
ENCODINGS = (None, "gzip", "br", "zstd", "gzip;q=0, br;q=0.5, zstd", "*", "identity")
METHODS = ("GET", "GET", "GET", "HEAD", "POST", "OPTIONS", "DELETE")
ODD_PATHS = (
    ("/v1/applicants/", None),
    ("/v1/applicants", None),
    ("/v1/applicants/a/b", None),
    ("/v1/applicants/\ufffd", b"/v1/applicants/%FF"),  # uvicorn's decoding of non-UTF-8
    ("/v1/applicants/caf\xe9", None),
    ("/v1/applicants/%zz", b"/v1/applicants/%zz"),
    ("/v1/applicants/ spaced ", None),
    ("/v1/applicantsX/abc", None),
    ("/health", None),
)


@st.composite
def requests(draw: st.DrawFn, pair: Pair) -> tuple[Sent, str | None]:
    """A request, and what its If-None-Match should be made of (the ETag is the answer's)."""
    kinds = ("list", "list", "own", "foreign", "unknown", "text", "odd", "slashes")
    kind = draw(st.sampled_from(kinds))
    raw_path = None
    if kind == "list":
        path = "/v1/applicants"
    elif kind in ("own", "foreign"):
        path = PREFIX + draw(st.sampled_from(pair.ids[kind]))
    elif kind == "unknown":
        path = PREFIX + "app_" + draw(st.text("0123456789abcdef", min_size=1, max_size=24))
    elif kind == "text":
        path = PREFIX + draw(st.text(st.characters(exclude_categories=("Cs",)), min_size=1))
    elif kind == "odd":
        path, raw_path = draw(st.sampled_from(ODD_PATHS))
    else:  # what Litestar normalises: a trailing slash, doubled slashes
        known = draw(st.sampled_from(pair.ids["own"]))
        path = draw(st.sampled_from((f"{PREFIX}{known}/", f"/v1//applicants/{known}")))
    headers: list[tuple[bytes, bytes]] = []
    host = draw(st.sampled_from((b"testserver", b"127.0.0.1:8000", b"bad host", None)))
    if host is not None:
        headers.append((b"host", host))
    credential = draw(st.sampled_from(CREDENTIALS))
    token = {
        "unknown": "lst_0123456789ab_" + "A" * 43,
        "malformed": "lst_nope",
        "lower-case": pair.tokens["all"],
    }.get(credential) or pair.tokens.get(credential)
    if token is not None:
        scheme = b"bearer" if credential == "lower-case" else b"Bearer"
        headers.append((b"authorization", scheme + b" " + token.encode()))
    encoding = draw(st.sampled_from(ENCODINGS))
    if encoding is not None:
        headers.append((b"accept-encoding", encoding.encode()))
    accept = draw(st.sampled_from(ACCEPTS))
    if accept is not None:
        headers.append((b"accept", accept.encode()))
    condition = draw(st.sampled_from(CONDITIONS))
    sent = Sent(
        method=draw(st.sampled_from(METHODS)),
        path=path,
        raw_path=raw_path,
        query=draw(st.sampled_from(QUERIES)),
        headers=headers,
    )
    return sent, condition


async def with_condition(pair: Pair, sent: Sent, condition: str | None) -> Sent:
    """`sent` with its If-None-Match; an ETag is taken from the same request's answer
    (asked of both apps, and compared too)."""
    if condition is None:
        return sent
    value = condition
    if condition in ("current", "current-strong", "listed"):
        first = await pair.both(sent)
        etag = (first.header(b"etag") or b'W/"none"').decode()
        value = {
            "current": etag,
            "current-strong": etag.removeprefix("W/"),
            "listed": f'"other", {etag} ,W/"more"',
        }[condition]
    elif condition == "other":
        value = 'W/"0-0000000000000000"'
    return Sent(
        sent.method,
        sent.path,
        sent.raw_path,
        sent.query,
        [*sent.headers, (b"if-none-match", value.encode())],
    )


PROPERTY_SETTINGS = settings(
    max_examples=100,
    deadline=None,
    # The two apps are made once per test and serve every example: the state examples
    # leave (rate-limit counts) is the same in both.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize(
    "rate_limit", [None, RateLimit(10**8, "day")], ids=["no rate limit", "rate limit"]
)
@PROPERTY_SETTINGS
@given(data=st.data())
async def test_every_request_is_answered_as_litestars_route_answers_it(
    databases: tuple[Path, Path, dict[str, str]],
    frozen_clock: None,
    rate_limit: RateLimit | None,
    data: st.DataObject,
) -> None:
    async with pair_of(databases, rate_limit) as pair:
        for _ in range(data.draw(st.integers(1, 4), label="requests")):
            sent, condition = data.draw(requests(pair), label="request")
            sent = await with_condition(pair, sent, condition)
            note(f"{sent}")
            await pair.both(sent)


async def test_each_kind_of_answer_is_met(
    databases: tuple[Path, Path, dict[str, str]], frozen_clock: None
) -> None:
    """The answers the property test compares include each kind the route gives."""
    async with pair_of(databases, RateLimit(10**8, "day")) as pair:
        own, foreign = pair.ids["own"][0], pair.ids["foreign"][0]
        bearer = [(b"authorization", f"Bearer {pair.tokens['scoped']}".encode())]

        async def status(path: str, headers: list[tuple[bytes, bytes]], **kw: Any) -> Answer:
            return await pair.both(Sent(path=path, headers=headers, **kw))

        found = await status(PREFIX + own, bearer)
        assert found.status == 200
        etag = found.header(b"etag")
        assert etag is not None
        assert (await status(PREFIX + own, [*bearer, (b"if-none-match", etag)])).status == 304
        assert (await status(PREFIX + own, [*bearer, (b"if-none-match", b"*")])).status == 304
        assert (await status(PREFIX + foreign, bearer)).status == 404
        assert (await status(PREFIX + foreign, [*bearer, (b"if-none-match", b"*")])).status == 404
        assert (await status(PREFIX + own, [])).status == 401
        assert (await status(PREFIX + own, bearer, query=b"limit=0")).status == 400
        # The server drops a HEAD's body (hygiene.py): the app sends the GET's.
        head = await status(PREFIX + own, bearer, method="HEAD")
        assert (head.status, head.body, head.log["method"]) == (200, found.body, "HEAD")
        zipped = await status(PREFIX + own, [*bearer, (b"accept-encoding", b"gzip")])
        assert zipped.header(b"content-encoding") == b"gzip"
        assert (await status(PREFIX + own + "/", bearer)).status == 200
        assert (await status(PREFIX + own, [*bearer, (b"host", b"bad host")])).status == 400
        assert (await status(PREFIX + own, bearer, method="POST")).status == 405
        # The list: a page, its cursor's page, a 304, a refusal, a stream (Litestar's).
        page = await status("/v1/applicants", bearer, query=b"limit=2")
        assert page.status == 200
        cursor = json.loads(page.body)["meta"]["next"]
        follow = await status("/v1/applicants", bearer, query=f"cursor={cursor}".encode())
        assert follow.status == 200
        assert json.loads(follow.body)["results"]
        listed = page.header(b"etag")
        assert listed is not None
        conditional = [*bearer, (b"if-none-match", listed)]
        assert (await status("/v1/applicants", conditional, query=b"limit=2")).status == 304
        assert (await status("/v1/applicants", bearer, query=b"cursor=abc")).status == 400
        ndjson = [*bearer, (b"accept", b"application/x-ndjson")]
        streamed = await status("/v1/applicants", ndjson, query=b"limit=")
        assert streamed.header(b"content-type") == b"application/x-ndjson"


async def test_a_long_poll_is_answered_alike(
    databases: tuple[Path, Path, dict[str, str]], frozen_clock: None
) -> None:
    """A long poll with nothing to bring waits out its time on both routes, then answers
    the same empty page (its position where it started)."""
    async with pair_of(databases, None) as pair:
        bearer = [(b"authorization", f"Bearer {pair.tokens['all']}".encode())]
        sent = Sent(path="/v1/applicants", headers=bearer, query=b"changed_since=latest&wait=1")
        answer = await pair.both(sent)
        assert answer.status == 200
        assert json.loads(answer.body)["results"] == []


async def test_the_rate_limit_refuses_alike_on_both(
    databases: tuple[Path, Path, dict[str, str]], frozen_clock: None
) -> None:
    """One budget per token, counted by both routes alike: a refused token is refused with
    the same 429, whatever it asks; an unauthenticated request is not counted."""
    budget = 6
    async with pair_of(databases, RateLimit(budget, "minute")) as pair:
        bearer = [(b"authorization", f"Bearer {pair.tokens['all']}".encode())]
        own = PREFIX + pair.ids["own"][0]
        plan = [
            Sent(path=own, headers=bearer),
            Sent(path=PREFIX + "app_nope", headers=bearer),
            Sent(path=own, headers=[]),
            Sent(path=own, headers=bearer, query=b"limit=0"),
            Sent(path=own, headers=[*bearer, (b"if-none-match", b"*")]),
            Sent(path=own, headers=bearer, method="HEAD"),
            Sent(path="/v1/applicants", headers=bearer),  # the list shares the budget
        ]
        statuses = [(await pair.both(sent)).status for sent in plan * 2]
        assert statuses.count(429) == len(plan) * 2 - budget - 2  # the two 401s uncounted
        refused = await pair.both(Sent(path=own, headers=bearer))
        assert refused.status == 429
        assert refused.header(b"retry-after") is not None


async def test_a_fault_is_answered_and_logged_alike(
    databases: tuple[Path, Path, dict[str, str]],
    frozen_clock: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault of the database while answering: the same 500, and the same log record."""
    from leasestar.applicants.storage import ApplicantReader

    async def broken(*_: Any, **__: Any) -> Any:
        raise sqlite3.DatabaseError("disk I/O error")

    async with pair_of(databases, RateLimit(10**8, "day")) as pair:
        monkeypatch.setattr(ApplicantReader, "fetch_one", broken)
        bearer = [(b"authorization", f"Bearer {pair.tokens['all']}".encode())]
        with log_lines("leasestar.errors") as errors:
            answer = await pair.both(Sent(path=PREFIX + "app_x", headers=bearer))
        assert answer.status == 500
        assert errors.lines == ["unhandled error on GET /v1/applicants/app_x"] * 2
        assert "disk I/O error" not in answer.body.decode()


async def test_the_direct_routes_answer_without_litestars_router(
    databases: tuple[Path, Path, dict[str, str]],
    frozen_clock: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparisons above hold whether or not a request takes the direct route: here,
    a JSON list and a get by id never reach the direct app's router; a stream does."""
    from litestar._asgi.asgi_router import ASGIRouter

    async with pair_of(databases, RateLimit(10**8, "day")) as pair:
        routed: list[str] = []
        route = ASGIRouter.__call__

        async def counting(router: ASGIRouter, scope: Any, receive: Any, send: Any) -> None:
            if router is pair.direct.asgi_router:
                routed.append(scope["path"])
            await route(router, scope, receive, send)

        monkeypatch.setattr(ASGIRouter, "__call__", counting)
        bearer = [(b"authorization", f"Bearer {pair.tokens['scoped']}".encode())]
        for path, query in (("/v1/applicants", b"limit=3"), (PREFIX + pair.ids["own"][0], b"")):
            assert (await pair.both(Sent(path=path, query=query, headers=bearer))).status == 200
        assert routed == []
        ndjson = [*bearer, (b"accept", b"application/x-ndjson")]
        assert (await pair.both(Sent(path="/v1/applicants", headers=ndjson))).status == 200
        assert routed == ["/v1/applicants"]
