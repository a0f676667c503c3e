"""Access logs, request ids, Prometheus metrics and the health check (leasestar/observability.py,
leasestar/service.py), seen from outside: through requests, the log lines and /metrics."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from leasestar.applicants.pipeline import write_records
from leasestar.config import LogFormat, Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.observability import Metrics, access_logger
from leasestar.seed.generator import synthetic_applicants
from tests.conftest import TEST_CLIENT_ADDRESS

Client = AsyncTestClient  # type: ignore[type-arg]
GENERATED_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_log() -> list[str]:
    """The access lines the app writes, one per request."""
    return []


async def _app_client(
    db: Path, token: str, log_format: LogFormat, lines: list[str]
) -> AsyncIterator[Client]:
    app = create_app(
        Settings(db_path=db, log_format=log_format, metrics_address=TEST_CLIENT_ADDRESS)
    )
    # create_app configures the access logger afresh; listen beside its own handler.
    handler = _Lines(lines)
    access_logger.addHandler(handler)
    try:
        async with AsyncTestClient(app=app) as client:
            client.headers["Authorization"] = f"Bearer {token}"
            yield client
    finally:
        access_logger.removeHandler(handler)


@pytest.fixture
async def json_client(seeded_db: Path, token: str, access_log: list[str]) -> AsyncIterator[Client]:
    async for client in _app_client(seeded_db, token, "json", access_log):
        yield client


@pytest.fixture
async def text_client(seeded_db: Path, token: str, access_log: list[str]) -> AsyncIterator[Client]:
    async for client in _app_client(seeded_db, token, "text", access_log):
        yield client


# --- access log -------------------------------------------------------------------------


async def test_json_access_log_has_one_object_per_request(
    json_client: Client, access_log: list[str], token: str
) -> None:
    await json_client.get("/v1/applicants", params={"limit": 2}, headers={"X-Request-ID": "r-1"})
    await json_client.get("/v1/applicants", headers={"Authorization": "Bearer wrong"})
    await json_client.get("/health")
    assert len(access_log) == 3
    ok, refused, health = (json.loads(line) for line in access_log)
    assert ok["method"] == "GET"
    assert ok["path"] == "/v1/applicants"
    assert ok["query"] == "limit=2"
    assert ok["status"] == 200
    assert ok["token"] == "test-all"  # the token's name
    assert ok["request_id"] == "r-1"
    assert isinstance(ok["duration_ms"], float)
    assert ok["duration_ms"] >= 0
    assert ok["bytes"] > 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ok["time"])
    assert (refused["status"], refused["token"]) == (401, None)
    assert (health["path"], health["status"], health["token"]) == ("/health", 200, None)
    for line in access_log:
        assert token not in line
        assert "wrong" not in line


async def test_personal_filter_values_stay_out_of_the_log(
    json_client: Client, access_log: list[str]
) -> None:
    await json_client.get(
        "/v1/applicants", params={"email_1": "ann@example.com", "phone_1": "5125550100"}
    )
    (line,) = access_log
    assert "ann@example.com" not in line
    assert "5125550100" not in line
    assert json.loads(line)["query"] == "email_1=REDACTED&phone_1=REDACTED"


async def test_a_token_in_the_url_stays_out_of_the_log(
    json_client: Client, access_log: list[str], token: str
) -> None:
    """A client that puts its token in the URL by mistake (as a query parameter, raw or
    percent-encoded, or as a path segment) gets a 400 or 404, and the log keeps only the
    token's public id."""
    public_id, secret = token.removeprefix("lst_").split("_", 1)
    encoded = token.replace("_", "%5F")
    await json_client.get(f"/v1/applicants?access_token={token}&limit=2")
    await json_client.get(f"/v1/applicants?access%5Ftoken={encoded}")
    await json_client.get(f"/v1/applicants/{token}")
    assert len(access_log) == 3
    for line in access_log:
        assert secret not in line, line
        assert secret.replace("_", "%5F") not in line, line
    logged = [json.loads(line) for line in access_log]
    assert logged[0]["query"] == "access_token=REDACTED&limit=2"
    assert logged[1]["query"] == "access%5Ftoken=REDACTED"
    assert logged[2]["path"] == f"/v1/applicants/lst_{public_id}_REDACTED"


async def test_percent_encoded_personal_filter_names_are_redacted_too(
    json_client: Client, access_log: list[str]
) -> None:
    await json_client.get("/v1/applicants?email%5F1=ann%40example.com&phone%5f1=5125550100")
    (line,) = access_log
    assert json.loads(line)["query"] == "email%5F1=REDACTED&phone%5f1=REDACTED"


async def test_cursors_stay_out_of_the_log(json_client: Client, access_log: list[str]) -> None:
    """A cursor is signed, not encrypted: it carries the walk's filter values and the
    last record's sort keys (names, emails), so its value is not logged."""
    first = await json_client.get("/v1/applicants", params={"limit": 1, "order-by": "email_1"})
    cursor = first.json()["meta"]["next"]
    await json_client.get("/v1/applicants", params={"cursor": cursor})
    assert len(access_log) == 2
    assert cursor not in access_log[1]
    assert json.loads(access_log[1])["query"] == "cursor=REDACTED"


async def test_text_access_log(text_client: Client, access_log: list[str]) -> None:
    await text_client.get("/v1/applicants", params={"limit": 1}, headers={"X-Request-ID": "t-9"})
    (line,) = access_log
    assert re.fullmatch(
        r"GET /v1/applicants\?limit=1 200 \d+\.\dms \d+B token=test-all request_id=t-9", line
    ), line


async def test_access_log_off(seeded_db: Path, token: str, access_log: list[str]) -> None:
    async for client in _app_client(seeded_db, token, "off", access_log):
        assert (await client.get("/health")).status_code == 200
    assert access_log == []


# --- request ids ------------------------------------------------------------------------


async def test_request_id_is_echoed_when_safe(json_client: Client, access_log: list[str]) -> None:
    for sent in ("abc-123", "A.b_c:D-9", "x" * 128):
        response = await json_client.get("/health", headers={"X-Request-ID": sent})
        assert response.headers["x-request-id"] == sent
        assert json.loads(access_log[-1])["request_id"] == sent


@pytest.mark.parametrize(
    "sent", [None, "", "has space", "x" * 129, 'quote"d', "new\\nline", "semi;colon"]
)
async def test_request_id_is_generated_otherwise(
    json_client: Client, access_log: list[str], sent: str | None
) -> None:
    headers = {} if sent is None else {"X-Request-ID": sent}
    response = await json_client.get("/v1/applicants/app_missing", headers=headers)
    assert response.status_code == 404
    generated = response.headers["x-request-id"]
    assert GENERATED_ID.fullmatch(generated)
    assert json.loads(access_log[-1])["request_id"] == generated
    assert (await json_client.get("/health")).headers["x-request-id"] != generated


# --- /metrics ---------------------------------------------------------------------------


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_requests_and_latency_per_route_and_status(
    json_client: Client,
) -> None:
    for _ in range(3):
        await json_client.get("/v1/applicants", params={"limit": 1})
    await json_client.get("/v1/applicants/app_missing")
    await json_client.get("/v1/applicants", params={"limit": 0})
    await json_client.head("/health")
    await json_client.get("/no/such/route")
    response = await json_client.get("/metrics", headers={"Authorization": ""})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    samples = _samples(response.text)

    def requests(route: str, method: str, status: str) -> float:
        labels = frozenset({"route": route, "method": method, "status": status}.items())
        return samples[("leasestar_http_requests_total", labels)]

    def latency(suffix: str, route: str, status: str, **extra: str) -> float:
        labels = frozenset({"route": route, "status": status, **extra}.items())
        return samples[(f"leasestar_http_request_duration_seconds_{suffix}", labels)]

    assert requests("/v1/applicants", "GET", "200") == 3
    assert requests("/v1/applicants/{id}", "GET", "404") == 1
    assert requests("/v1/applicants", "GET", "400") == 1
    assert requests("/health", "HEAD", "200") == 1
    assert requests("unmatched", "GET", "404") == 1
    assert latency("count", "/v1/applicants", "200") == 3
    assert latency("sum", "/v1/applicants", "200") > 0
    assert latency("bucket", "/v1/applicants", "200", le="+Inf") == 3
    assert latency("count", "/v1/applicants/{id}", "404") == 1
    assert samples[("leasestar_applicants", frozenset())] == 300


async def test_metrics_row_count_follows_writes(json_client: Client, seeded_db: Path) -> None:
    connection = open_for_write(seeded_db)
    try:
        counts = write_records(connection, synthetic_applicants(5, seed=1234))
    finally:
        connection.close()
    assert counts.inserted == 5
    samples = _samples((await json_client.get("/metrics")).text)
    assert samples[("leasestar_applicants", frozenset())] == 305


# --- /health ----------------------------------------------------------------------------


async def test_health_needs_no_token(json_client: Client) -> None:
    json_client.headers.pop("Authorization")
    response = await json_client.get("/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _replace_with_garbage(path: Path) -> None:
    _remove(path)
    path.write_bytes(b"not a database" * 100)


def _replace_with_other_database(path: Path) -> None:
    other = path.with_name("other.db")
    open_for_write(other).close()
    _remove(path)
    shutil.move(other, path)


@pytest.mark.parametrize("damage", [_remove, _replace_with_garbage, _replace_with_other_database])
async def test_health_answers_503_when_the_database_is_unusable(
    json_client: Client,
    seeded_db: Path,
    damage: Callable[[Path], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert (await json_client.get("/health")).status_code == 200
    damage(seeded_db)
    with caplog.at_level(logging.WARNING, logger="leasestar.health"):
        response = await json_client.get("/health")
    assert response.status_code == 503
    assert response.json() == {
        "error": {
            "code": "service_unavailable",
            "message": "the database is unavailable",
            "details": {},
        }
    }
    assert "health check failed" in caplog.text


# --- the request counts, against prometheus_client's own metrics --------------------------

_ROUTES = st.sampled_from(["/v1/applicants", "/v1/applicants/{id}", "unmatched"])
_STATUSES = st.sampled_from(["200", "304", "404", "429"])
# Latencies on every side of every bucket bound, the bounds themselves included.
_SECONDS = st.one_of(
    st.sampled_from([0.0, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]),
    st.sampled_from([2.5, 3.0, 60.0]),
    st.floats(min_value=0, max_value=5, allow_nan=False),
)


@settings(max_examples=60)
@given(
    requests=st.lists(
        st.tuples(_ROUTES, st.sampled_from(["GET", "HEAD"]), _STATUSES, _SECONDS), max_size=40
    )
)
def test_request_counts_expose_what_prometheus_client_metrics_would(
    requests: list[tuple[str, str, str, float]],
) -> None:
    """The service counts requests with plain numbers (no lock per increment); scraped,
    they read as prometheus_client's Counter and Histogram fed the same requests would,
    sample for sample, but for the `_created` times."""
    metrics = Metrics()
    oracle = CollectorRegistry()
    counter = Counter("leasestar_http_requests", "", ("route", "method", "status"), registry=oracle)
    histogram = Histogram(
        "leasestar_http_request_duration_seconds",
        "",
        ("route", "status"),
        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        registry=oracle,
    )
    for route, method, status, seconds in requests:
        metrics.requests.count(route, method, status, seconds)
        counter.labels(route, method, status).inc()
        histogram.labels(route, status).observe(seconds)

    def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {
            key: value
            for key, value in _samples(text).items()
            if key[0].startswith("leasestar_http") and not key[0].endswith("_created")
        }

    served = samples(metrics.render()[0].decode())
    assert served == pytest.approx(samples(generate_latest(oracle).decode()))
    created = {k for k in _samples(metrics.render()[0].decode()) if k[0].endswith("_created")}
    assert len(created) == len({(r, m, s) for r, m, s, _ in requests}) + len(
        {(r, s) for r, _, s, _ in requests}
    )
