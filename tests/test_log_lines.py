"""The log cannot be forged through a request (issue 29, point 7 and Deliver 2): newlines,
carriage returns, NUL, Unicode line separators and JSON in the path, the query and each
header a request line logs, sent raw to a real `leasestar serve`; every line of its log is
then one JSON object (`--log-format json`) or one escaped line (`text`), and no line is
one the client wrote. And every odd path under `/schema` answers the API's 404, never a
500 (a NUL reached the static files router's `stat`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from leasestar.log_lines import LogLineFormatter
from tests.test_fuzz import assert_error_body
from tests.test_hardening import Server, copy_database, new_token, raw_request, serve

FORGED = '{"time":"2026-01-01T00:00:00Z","request_id":"forged","status":200}'
# Each a request target (path and query): sent as bytes, percent-encoded or raw where
# HTTP/1.1 lets them through.
TARGETS = (
    "/v1/applicants/%0a" + FORGED.replace('"', "%22"),
    "/v1/applicants/%0d%0a%00" + FORGED.replace('"', "%22"),
    "/schema/assets/%00",
    "/schema/assets/%0a%7B%22status%22:200%7D",
    "/v1/%E2%80%A8%C2%85x%E2%80%A9",
    '/v1/a"b\\c',
    "/v1/applicants?limit=%0a" + FORGED.replace('"', "%22"),
    '/v1/applicants?x="}%0d%0a{"status":200}',
    "/v1/applicants?email_1=%0a%00&phone_1=%E2%80%A8",
    "/health?%0a=%0d",
)
# Each logged header (only X-Request-ID reaches the access line; the token's name, never
# the Authorization header) and some that are not, in case one ever is.
HEADERS = (
    ("X-Request-ID", FORGED),
    ("X-Request-ID", "a\\u000a" + FORGED),
    ("Authorization", f"Bearer lst_{FORGED}"),
    ("User-Agent", FORGED),
    ("Referer", FORGED),
)
ACCESS_FIELDS = {
    "time", "request_id", "method", "path", "query", "status", "duration_ms", "bytes", "token",
}  # fmt: skip
RECORD_FIELDS = {"time", "level", "logger", "message", "exception"}


@pytest.fixture(scope="module")
def logs_db(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_database(seeded_template, tmp_path_factory.mktemp("logs") / "leasestar.db")


@pytest.fixture(scope="module")
def logs_token(logs_db: Path) -> str:
    return new_token(logs_db, "logs")


def attack(server: Server, token: str) -> int:
    """Every hostile request, raw; how many reached the app (each is logged once)."""
    heads = [f"GET {target} HTTP/1.1\r\nHost: x\r\n" for target in TARGETS]
    heads += [
        f"GET /v1/applicants HTTP/1.1\r\nHost: x\r\n{name}: {value}\r\n" for name, value in HEADERS
    ]
    heads.append(f"GET /v1/applicants HTTP/1.1\r\nHost: x\r\nX-Request-ID: {FORGED}\r\n")
    for head in heads:
        authorized = head if "Authorization" in head else f"{head}Authorization: Bearer {token}\r\n"
        status, _, body = raw_request(
            server.port, f"{authorized}Connection: close\r\n\r\n".encode()
        )
        assert status < 500, (head, status, body)
    # Refused by the HTTP parser (a NUL or a bare LF in a header): uvicorn's own lines.
    for head in (b"GET / HTTP/1.1\r\nHost: x\r\nX-Request-ID: a\x00b\r\n\r\n",):
        raw_request(server.port, head)
    return len(heads)


def served(logs_db: Path, log_format: str) -> Iterator[Server]:
    return serve(logs_db, "--rate-limit", "off", "--log-format", log_format)


def test_no_request_forges_a_line_of_the_json_log(logs_db: Path, logs_token: str) -> None:
    with served(logs_db, "json") as server:
        sent = attack(server, logs_token)
    lines = server.log().splitlines()
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    assert all(isinstance(record, dict) for record in records)
    access = [record for record in records if "request_id" in record]
    attacks = [r for r in access if (r["path"], r["query"]) != ("/health", "")]  # (the start's)
    assert len(attacks) == sent  # no more access lines than requests: none forged
    for record in access:
        assert set(record) == ACCESS_FIELDS
        assert record["request_id"] != "forged"
    for record in records:
        if "request_id" not in record:
            assert set(record) <= RECORD_FIELDS, record
            assert "status" not in record
    # Every separator a reader may split at, escaped (str.splitlines splits at them all).
    assert server.log().splitlines() == server.log().split("\n")[:-1]


TEXT_ACCESS = re.compile(r"[A-Z]+ \S+ \d{3} \d+\.\dms \d+B token=\S+ request_id=[0-9a-f]{32}")
TEXT_RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) - \S+Z - [\w.]+ - .*")


def test_no_request_forges_a_line_of_the_text_log(logs_db: Path, logs_token: str) -> None:
    with served(logs_db, "text") as server:
        sent = attack(server, logs_token)
    lines = server.log().splitlines()
    assert lines == server.log().split("\n")[:-1]
    access = [line for line in lines if TEXT_ACCESS.fullmatch(line)]
    attacks = [line for line in access if not line.startswith("GET /health 200 ")]
    assert len(attacks) == sent
    for line in lines:
        assert TEXT_ACCESS.fullmatch(line) or TEXT_RECORD.fullmatch(line), line
        assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", line), line


def _record(message: str, *args: object, error: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(error), error, error.__traceback__) if error is not None else None
    return logging.LogRecord(
        "leasestar.errors", logging.ERROR, __file__, 1, message, args, exc_info
    )


def test_a_record_is_one_line_whatever_its_message_and_trace_hold() -> None:
    hostile = f"/x\n{FORGED}\r\x00\u2028\x85\\"
    try:
        raise ValueError(f"bad {hostile}")
    except ValueError:
        error = sys.exc_info()[1]
    record = _record("unhandled error on GET %s", hostile, error=error)
    line = LogLineFormatter("json").format(record)
    assert line.splitlines() == [line]
    parsed = json.loads(line)
    assert parsed["message"] == f"unhandled error on GET {hostile}"  # escaped, not lost
    assert parsed["exception"].endswith(f"ValueError: bad {hostile}")
    text = LogLineFormatter("text").format(
        _record("unhandled error on GET %s", hostile, error=error)
    )
    assert text.splitlines() == [text]
    assert "unhandled error on GET /x\\n{" in text
    assert "\\r\\x00\\u2028\\x85\\\\" in text


# --- odd paths under /schema ---------------------------------------------------------


ODD_SCHEMA_PATHS = (
    "/schema/assets/%00",
    "/schema/assets/swagger-ui.css%00",
    "/schema/assets/swagger-ui.css/",
    "/schema/assets/%2e%2e/%2e%2e/etc/passwd",
    "/schema/assets/..%2f..%2fetc%2fpasswd",
    "/schema/assets/..%5c..%5cleasestar.db",
    "/schema/assets/..\\..\\leasestar.db",
    "/schema/assets/",
    "/schema/assets/" + "a" * 4000,
    "/schema/assets/" + "%C0%AE" * 200,
    "/schema/%00",
    "/schema/openapi.json%00",
    "/schema/assets/%ff%fe",
)


def test_every_odd_path_under_schema_is_the_apis_404(logs_db: Path) -> None:
    with served(logs_db, "json") as server:
        for path in ODD_SCHEMA_PATHS:
            head = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
            status, _, body = raw_request(server.port, head)
            assert status == 404, (path, status, body)
            assert_error_body(404, body)
        # The real assets are still served.
        head = b"GET /schema/assets/swagger-ui.css HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        status, headers, _ = raw_request(server.port, head)
        assert (status, headers["content-type"].split(";")[0]) == (200, "text/css")
    assert "Traceback" not in server.log()
