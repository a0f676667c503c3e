"""Every error the API can give, in the contract's one body shape, and no 5xx for any input.

`{"error": {"code", "message", "details"}}` with the code fixed by the status
(CONTRACT.md, "Errors"). Malformed input of every kind must end in a 4xx.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from tests.contract import ERROR_CODES

Client = AsyncTestClient  # type: ignore[type-arg]


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


@pytest.fixture
def some_id(seeded_db: Path) -> str:
    connection = sqlite3.connect(seeded_db)
    try:
        (applicant_id,) = connection.execute("SELECT id FROM applicants LIMIT 1").fetchone()
    finally:
        connection.close()
    return str(applicant_id)


def assert_error(status: int, headers: Any, body: bytes, expected_status: int) -> dict[str, Any]:
    """The contract's error body for `expected_status`; returns the `error` object."""
    assert status == expected_status, body[:300]
    assert headers["content-type"].startswith("application/json")
    document = json.loads(body)
    assert list(document) == ["error"]
    error: dict[str, Any] = document["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == ERROR_CODES[expected_status]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["details"], dict)
    return error


async def raw_get(
    client: Client, path: bytes, query: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int, dict[str, str], bytes]:
    """Send bytes no HTTP client would send (invalid UTF-8 in the query) straight to the app."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path.decode("latin-1"),
        "raw_path": path,
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"testserver.local"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver.local", 80),
        "state": {},
        "extensions": {},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await client.app(scope, receive, send)  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    response_headers = {k.decode().lower(): v.decode("latin-1") for k, v in start["headers"]}
    return start["status"], response_headers, body


# --- 400 ----------------------------------------------------------------------------------


async def test_400_body_names_parameter_rule_and_value(client: Client, some_id: str) -> None:
    for url in ("/v1/applicants?limit=0", f"/v1/applicants/{some_id}?limit=0"):
        response = await client.get(url)
        error = assert_error(response.status_code, response.headers, response.content, 400)
        assert error == {
            "code": "invalid_request",
            "message": "limit must be an integer between 1 and 250",
            "details": {"parameter": "limit", "value": "0"},
        }


@pytest.mark.parametrize(
    ("query", "parameter", "value"),
    [
        ("offset=-1", "offset", "-1"),
        ("order-by=nope", "order-by", "nope"),
        ("updated_at_gte=2024-02-30", "updated_at_gte", "2024-02-30"),
        ("phone_1=123", "phone_1", "123"),
        ("x_id=S7-0000001", "x_id", "S7-0000001"),
        ("bogus=1", "bogus", "1"),
        ("limit=5&limit=6", "limit", "6"),
    ],
)
async def test_400_details_for_each_rule(
    client: Client, query: str, parameter: str, value: str
) -> None:
    response = await client.get(f"/v1/applicants?{query}")
    error = assert_error(response.status_code, response.headers, response.content, 400)
    assert error["details"] == {"parameter": parameter, "value": value}
    assert parameter in error["message"]


# --- 404, 405 -----------------------------------------------------------------------------


async def test_404_for_unknown_ids_and_routes(client: Client) -> None:
    for path in (
        "/v1/applicants/app_000000000000000000000000",
        "/v1/applicants/%00",
        "/v1/applicants/" + "x" * 2000,
        "/v1/applicants/%E2%9C%93",
        "/v1",
        "/v1/",
        "/v1/nope",
        "/v1/applicants/abc/def",
        "/v1/properties",
        "/v2/applicants",
    ):
        response = await client.get(path)
        error = assert_error(response.status_code, response.headers, response.content, 404)
        assert error["details"] == {}, path


async def test_unknown_id_body_is_the_not_found_body(client: Client) -> None:
    response = await client.get("/v1/applicants/app_nope")
    assert response.json() == {
        "error": {
            "code": "not_found",
            "message": response.json()["error"]["message"],
            "details": {},
        }
    }


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_405_for_other_methods(client: Client, some_id: str, method: str) -> None:
    for path in ("/v1/applicants", f"/v1/applicants/{some_id}", "/health"):
        response = await client.request(method, path, content=b"{}")
        error = assert_error(response.status_code, response.headers, response.content, 405)
        assert error["details"] == {}
        allowed = {m.strip() for m in response.headers["allow"].split(",")}
        assert allowed == {"GET", "HEAD", "OPTIONS"}, (path, response.headers["allow"])


async def test_every_method_allow_names_is_answered(client: Client, some_id: str) -> None:
    """Allow (on a 405, and OPTIONS' 204) names exactly the methods a path answers: HEAD
    is served beside GET, so it is named too."""
    for path in ("/v1/applicants", f"/v1/applicants/{some_id}", "/health"):
        options = await client.options(path)
        assert options.status_code == 204
        allowed = {m.strip() for m in options.headers["allow"].split(",")}
        assert allowed == {"GET", "HEAD", "OPTIONS"}, path
        for method in allowed - {"OPTIONS"}:
            assert (await client.request(method, path)).status_code == 200, (method, path)


# --- unauthenticated routes ---------------------------------------------------------------


async def test_health_needs_no_token(client: Client) -> None:
    del client.headers["Authorization"]
    response = await client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_openapi_document_needs_no_token(client: Client) -> None:
    del client.headers["Authorization"]
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    paths = document["paths"]
    listing = paths["/v1/applicants"]["get"]
    single = paths["/v1/applicants/{id}"]["get"]
    list_names = {p["name"] for p in listing["parameters"] if p["in"] == "query"}
    single_names = {p["name"] for p in single["parameters"] if p["in"] == "query"}
    shared = {"offset", "limit", "order-by", "updated_at_gte", "updated_at_lte"}
    shared |= {"last_seen_gte", "last_seen_lte"}
    filters = {"integration_id", "integration_vendor", "property_id", "x_property_id"}
    filters |= {"email_1", "phone_1", "x_id"}
    assert shared | filters <= list_names
    assert shared <= single_names
    assert not filters & single_names
    schemes = document["components"]["securitySchemes"]
    assert any(s.get("type") == "http" and s.get("scheme") == "bearer" for s in schemes.values())
    page = await client.get("/schema")
    assert page.status_code == 200


# --- 500 ------------------------------------------------------------------------------------


async def test_500_says_nothing_about_the_internals(
    client: Client, db: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    db.execute("DROP TABLE applicants")  # a broken database: the one way left to a 5xx
    with caplog.at_level("CRITICAL"):  # the trace goes to the log, not the test output
        response = await client.get("/v1/applicants")
    error = assert_error(response.status_code, response.headers, response.content, 500)
    assert error == {"code": "internal_error", "message": error["message"], "details": {}}
    text = response.text.lower()
    for leak in ("applicants", "sqlite", "select", "traceback", "/", ".py"):
        assert leak not in text, leak


async def test_a_500_on_a_path_holding_a_token_keeps_its_secret_out_of_the_log(
    client: Client, db: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: the 500 handler logged the raw path."""
    secret = "S3cr3t-" + "x" * 36
    db.execute("DROP TABLE applicants")
    with caplog.at_level("ERROR"):
        response = await client.get(f"/v1/applicants/lst_0123456789ab_{secret}")
    assert response.status_code == 500
    assert "lst_0123456789ab_REDACTED" in caplog.text
    assert secret not in caplog.text


# --- no 5xx for malformed input -----------------------------------------------------------


MALFORMED_QUERIES = (
    "%",
    "%%",
    "%zz",
    "%E0%A4%A",
    "%FF",
    "%C3%28",
    "%ED%A0%80",  # an encoded surrogate is not UTF-8
    "limit=%00",
    "limit=%",
    "limit=1%",
    "=",
    "==",
    "=1",
    "&&&",
    "a=b=c",
    ";",
    "limit=1;offset=2",
    "order-by=%",
    "order-by=" + "id," * 500,
    "order-by=created_at:" + "a" * 3000,
    "updated_at_gte=" + "9" * 3000,
    "updated_at_gte=9999-12-31T23:59:59.999999-23:59",
    "updated_at_lte=0001-01-01T00:00:00+23:59",
    "last_seen_gte=2024-01-01T12:00:00.123456789+00:00",
    "offset=" + "9" * 3000,
    "limit=" + "1" + "0" * 3000,
    "offset=" + "0" * 3000 + "5",
    "email_1=" + "a" * 4000,
    "email_1=%00%01%02",
    "email_1=%F0%9F%98%80",
    "integration_id=%27%20OR%201%3D1%20--",
    "phone_1=" + "5" * 3000,
    "x_id=a&integration_id=b&x_property_id=c",
    "limit=+",
    "limit=%2B5",
    "limit=5%20",
    "a" * 3000,
    "&".join(f"p{n}=1" for n in range(100)),
)


async def test_malformed_query_strings_never_give_5xx(client: Client, some_id: str) -> None:
    for query in MALFORMED_QUERIES:
        for path in ("/v1/applicants", f"/v1/applicants/{some_id}"):
            response = await client.get(f"{path}?{query}")
            assert response.status_code < 500, (query[:60], response.text[:300])
            if response.status_code >= 400:
                assert_error(
                    response.status_code, response.headers, response.content, response.status_code
                )


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        (b"email_1=\xff\xfe", "email_1"),
        (b"limit=\x80", "limit"),
        (b"\xc3\x28=1", "\xc3\x28"),  # a name that is not UTF-8 is named as sent
        (b"email_1=jos\xc3\xa9", "email_1"),  # raw (unencoded) UTF-8 is not a query string
        (b"limit=" + b"9" * 5000, "limit"),  # beyond int()'s 4300-digit limit
        (b"offset=" + b"9" * 5000, "offset"),
    ],
)
async def test_raw_bytes_in_the_query_give_400(
    client: Client, token: str, query: bytes, parameter: str
) -> None:
    status, headers, body = await raw_get(
        client, b"/v1/applicants", query, [(b"authorization", f"Bearer {token}".encode())]
    )
    error = assert_error(status, headers, body, 400)
    assert error["details"]["parameter"] == parameter


@pytest.mark.parametrize("route", ["list", "record"])
@pytest.mark.parametrize(
    ("query", "parameter", "value"),
    [
        ("limit=%FF", "limit", "%FF"),
        ("offset=2&email_1=ann%C3%28", "email_1", "ann%C3%28"),
        ("order-by=%ED%A0%80", "order-by", "%ED%A0%80"),  # an encoded surrogate is not UTF-8
        ("limit=1&%FF=2", "%FF", "2"),  # a name that is not UTF-8 is named as sent
    ],
)
async def test_a_value_not_utf8_is_a_400_naming_its_parameter(
    client: Client, some_id: str, route: str, query: str, parameter: str, value: str
) -> None:
    path = "/v1/applicants" if route == "list" else f"/v1/applicants/{some_id}"
    response = await client.get(f"{path}?{query}")
    error = assert_error(response.status_code, response.headers, response.content, 400)
    assert error["details"] == {"parameter": parameter, "value": value}
    assert parameter in error["message"]
    assert "UTF-8" in error["message"]


async def test_raw_bytes_in_the_path_never_give_5xx(client: Client, token: str) -> None:
    for path in (b"/v1/applicants/\xff\xfe", b"/v1/applicants/%FF", b"/v1/\xc3\x28"):
        status, headers, body = await raw_get(
            client, path, b"", [(b"authorization", f"Bearer {token}".encode())]
        )
        assert status < 500, (path, body[:200])
        assert_error(status, headers, body, status)


async def test_malformed_headers_never_give_5xx(client: Client, token: str) -> None:
    for value in (
        b"Bearer \xff\xfe",
        b"\xff",
        b"Bearer " + token.encode() + b"\x00",
        b"Bearer " + b"a" * 8000,
        b"Bearer " + token.encode() + b" extra",
    ):
        status, headers, body = await raw_get(
            client, b"/v1/applicants", b"", [(b"authorization", value)]
        )
        assert status < 500, (value[:40], body[:200])
        assert_error(status, headers, body, status)
