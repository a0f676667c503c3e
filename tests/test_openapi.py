"""The OpenAPI document at /schema/openapi.json: valid, complete, and true.

"True" is checked the way a generated client would find out: real responses of every
documented kind (pages, a cursor page, a sync page, a record, 304, each error status)
are validated against the response schemas of the document itself, `$ref`s resolved
inside it, formats checked. Expected values come from CONTRACT.md, not from the code.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from jsonschema import Draft202012Validator
from litestar.testing import AsyncTestClient
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from leasestar.applicants import records
from leasestar.applicants.storage import ApplicantReader
from leasestar.client import records as responses
from leasestar.config import RateLimit, Settings
from leasestar.main import create_app
from tests.contract import (
    ERROR_CODES,
    LIST_ONLY_PARAMETERS,
    NEVER_NULL,
    SHARED_PARAMETERS,
    SORTABLE,
)
from tests.test_rate_limit import budget

Client = AsyncTestClient  # type: ignore[type-arg]
Document = dict[str, Any]
DOCUMENT_URI = "urn:leasestar:openapi"

LIST = "/v1/applicants"
RECORD = "/v1/applicants/{id}"
HEALTH = "/health"
METRICS = "/metrics"


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


@pytest.fixture
async def document(client: Client) -> Document:
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    return dict(response.json())


def _pointer(*parts: str) -> str:
    return "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


def response_validator(document: Document, path: str, status: int) -> Draft202012Validator:
    """A validator for the JSON body the document declares for (GET path, status)."""
    registry: Registry[Any] = Registry().with_resource(
        DOCUMENT_URI, Resource(contents=document, specification=DRAFT202012)
    )
    pointer = _pointer(
        "paths", path, "get", "responses", str(status), "content", "application/json", "schema"
    )
    return Draft202012Validator(
        {"$ref": f"{DOCUMENT_URI}#/{pointer}"},
        registry=registry,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


def assert_conforms(document: Document, path: str, response: Any) -> None:
    """The status is documented for the operation, its headers are sent, the body fits."""
    operation = document["paths"][path]["get"]
    documented = operation["responses"].get(str(response.status_code))
    assert documented is not None, f"{response.status_code} is not documented for {path}"
    for header in documented.get("headers", {}):
        if header.startswith("RateLimit") and "ratelimit" not in response.headers:
            continue  # only when the server runs with a rate limit
        assert header.lower() in response.headers, (path, response.status_code, header)
    if "content" not in documented:
        assert response.content == b""
        return
    assert response.headers["content-type"].startswith("application/json")
    errors = sorted(
        response_validator(document, path, response.status_code).iter_errors(response.json()),
        key=str,
    )
    assert not errors, [f"{list(error.absolute_path)}: {error.message}" for error in errors[:5]]


# --- the document itself ----------------------------------------------------------------


async def test_document_is_valid_openapi_3_1(document: Document) -> None:
    assert document["openapi"].startswith("3.1")
    validate(document)  # openapi-spec-validator, 3.1 schema and semantic checks


async def test_every_route_is_documented(client: Client, document: Document) -> None:
    served = {
        re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        for route in client.app.routes
        if not route.path.startswith("/schema")
    }
    # The webhook routes (issue 28) answer only tokens with the webhooks permission.
    assert served == {LIST, RECORD, HEALTH, METRICS, "/v1/webhooks", "/v1/webhooks/{webhook_id}"}
    assert set(document["paths"]) == served
    assert document["paths"][LIST]["get"]["operationId"] == "listApplicants"
    assert document["paths"][RECORD]["get"]["operationId"] == "getApplicant"
    for path in served:
        assert document["paths"][path]["get"]["description"], path


def _query_parameters(document: Document, path: str) -> dict[str, dict[str, Any]]:
    return {
        parameter["name"]: parameter
        for parameter in document["paths"][path]["get"]["parameters"]
        if parameter["in"] == "query"
    }


async def test_query_parameters_are_documented_with_their_rules(document: Document) -> None:
    listed = _query_parameters(document, LIST)
    single = _query_parameters(document, RECORD)
    assert set(listed) == {*SHARED_PARAMETERS, *LIST_ONLY_PARAMETERS}
    assert set(single) == set(SHARED_PARAMETERS)
    for name, parameter in (listed | single).items():
        assert parameter["required"] is False, name
        assert parameter["description"], name
        assert parameter["schema"].get("type") in ("string", "integer", None), name
    # changed_since: a sequence, or `latest` (issue 28): the integer branch holds the rule.
    integer_since, latest = listed["changed_since"]["schema"]["anyOf"]
    assert latest == {"type": "string", "enum": ["latest"]}
    schemas = {name: listed[name]["schema"] for name in ("offset", "limit", "wait")}
    bounds = {
        name: {key: schema.get(key) for key in ("minimum", "maximum", "format")}
        for name, schema in (schemas | {"changed_since": integer_since}).items()
    }
    assert bounds == {
        "offset": {"minimum": 0, "maximum": 2**63 - 1, "format": "int64"},
        "limit": {"minimum": 1, "maximum": 250, "format": None},
        "changed_since": {"minimum": 0, "maximum": 2**63 - 1, "format": "int64"},
        "wait": {"minimum": 0, "maximum": 60, "format": None},
    }
    order_by = listed["order-by"]
    assert "field[:asc|desc]" in order_by["description"]
    assert "at most 4" in order_by["description"]
    for field in SORTABLE:
        assert field in order_by["description"], field
    assert listed["phone_1"]["schema"]["pattern"] == "^[0-9]{10}$"
    for bound in ("updated_at_gte", "updated_at_lte", "last_seen_gte", "last_seen_lte"):
        assert "YYYY-MM-DD" in listed[bound]["description"], bound
        # The forms it takes, each with a format generators know: a datetime or a date.
        assert listed[bound]["schema"] == {
            "anyOf": [
                {"type": "string", "format": "date-time"},
                {"type": "string", "format": "date"},
            ]
        }
    path_id = document["paths"][RECORD]["get"]["parameters"][0]
    assert (path_id["name"], path_id["in"], path_id["required"]) == ("id", "path", True)
    for path in (LIST, RECORD):
        headers = {
            p["name"] for p in document["paths"][path]["get"]["parameters"] if p["in"] == "header"
        }
        assert headers == {"If-None-Match", "X-Request-ID"}


# What each defaulted parameter does when absent (CONTRACT.md), said in its description.
DEFAULTS_IN_WORDS = {
    "offset": "absent: 0",
    "limit": "absent: 100",
    "order-by": "Absent: `created_at:desc`",
}


async def test_no_parameter_declares_a_default(document: Document) -> None:
    """Generated clients send every declared default (openapi-python-client does), and a
    cursor or the sync feed refuses offset, limit or order-by beside it: so no parameter
    of any operation declares one; the defaults are in the descriptions."""
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                assert "default" not in parameter["schema"], (path, method, parameter["name"])
                for branch in parameter["schema"].get("anyOf", []):
                    assert "default" not in branch, (path, method, parameter["name"])
    listed = _query_parameters(document, LIST)
    for name, words in DEFAULTS_IN_WORDS.items():
        assert words in listed[name]["description"], name


def _plain(schema: dict[str, Any]) -> bool:
    """A schema generators read as one type: no oneOf/anyOf wrapping a single member."""
    return all(len(schema.get(key, [None, None])) != 1 for key in ("oneOf", "anyOf"))


async def test_the_schemas_are_typed_for_generators(document: Document) -> None:
    schemas = document["components"]["schemas"]
    detail = schemas["ErrorDetail"]
    assert set(detail["properties"]["code"]["enum"]) == {*ERROR_CODES.values(), "request_too_large"}
    details = schemas["ErrorDetails"]
    assert details["properties"] == {
        "parameter": {"type": "string", "description": "The query parameter refused."},
        "value": {"type": "string", "description": "The value refused, as sent."},
    }
    assert not details.get("required")
    assert schemas["SortKey"]["properties"]["field"]["enum"] == [*SORTABLE, "change_seq"]
    meta = schemas["PageMeta"]["properties"]
    assert meta["next"]["type"] == "string"
    assert (meta["changeSeq"]["type"], meta["changeSeq"]["format"]) == ("integer", "int64")
    for name in ("offset", "total"):
        assert (meta[name]["type"], meta[name]["format"]) == ("integer", "int64"), name
    amount = schemas["Income"]["properties"]["amount_in_cents"]
    assert {"type": "integer", "format": "int64"} in amount["oneOf"]
    for name, schema in schemas.items():
        for field, property_schema in schema.get("properties", {}).items():
            assert _plain(property_schema), (name, field)


async def test_bearer_scheme_guards_the_api_and_not_health(document: Document) -> None:
    schemes = document["components"]["securitySchemes"]
    assert schemes == {
        "BearerToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `leasestar token create`.",
        }
    }
    assert document["paths"][LIST]["get"]["security"] == [{"BearerToken": []}]
    assert document["paths"][RECORD]["get"]["security"] == [{"BearerToken": []}]
    assert not document["paths"][HEALTH]["get"].get("security")
    assert not document.get("security")


async def test_every_error_status_is_documented_with_the_error_body(document: Document) -> None:
    expected = {
        LIST: {400, 401, 405, 413, 414, 429, 431, 500, 503},
        RECORD: {400, 401, 404, 405, 413, 414, 429, 431, 500, 503},
        HEALTH: {400, 405, 413, 414, 431, 500, 503},
        METRICS: {400, 404, 405, 413, 414, 431, 500},
    }
    for path, statuses in expected.items():
        documented = document["paths"][path]["get"]["responses"]
        assert {int(status) for status in documented if int(status) >= 400} == statuses
        for status in statuses:
            content = documented[str(status)]["content"]["application/json"]
            assert content["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
            (example,) = content["examples"].values()
            assert example["value"]["error"]["code"] == ERROR_CODES[status]
            validator = response_validator(document, path, status)
            assert validator.is_valid(example["value"]), (path, status)
    detail = document["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"code", "message", "details"}


def _component(document: Document, name: str) -> dict[str, Any]:
    return dict(document["components"]["schemas"][name])


def _nullable(schema: dict[str, Any]) -> bool:
    variants = schema.get("oneOf") or schema.get("anyOf") or [schema]
    return any(variant.get("type") == "null" for variant in variants)


async def test_applicant_schema_is_the_served_record(client: Client, document: Document) -> None:
    served = (await client.get(LIST, params={"limit": 1})).json()["results"][0]
    applicant = _component(document, "Applicant")
    # Every field, in the served order, always present.
    assert list(applicant["properties"]) == list(served)
    assert set(applicant["required"]) == set(served)
    nullable = {name for name, schema in applicant["properties"].items() if _nullable(schema)}
    assert nullable == set(served) - NEVER_NULL
    for instant in ("created_at", "updated_at", "last_seen"):
        assert applicant["properties"][instant] == {"type": "string", "format": "date-time"}
    assert {"type": "string", "format": "date"} in applicant["properties"]["date_of_birth"]["oneOf"]
    for nested in ("Application", "Pet", "Screening", "Income"):
        schema = _component(document, nested)
        assert set(schema["required"]) == set(schema["properties"]), nested


async def test_the_list_documents_its_ndjson_stream(document: Document) -> None:
    ok = document["paths"][LIST]["get"]["responses"]["200"]
    assert set(ok["content"]) == {"application/json", "application/x-ndjson"}
    assert ok["content"]["application/x-ndjson"]["schema"] == {
        "$ref": "#/components/schemas/Applicant"
    }
    assert "changeSeq" in ok["description"]
    record = document["paths"][RECORD]["get"]["responses"]["200"]
    assert set(record["content"]) == {"application/json"}


def test_response_structs_have_the_record_fields_in_order() -> None:
    """The served-shape Structs cannot drift from the Structs import and storage use."""
    pairs = [
        (responses.Applicant, records.Applicant),
        (responses.Application, records.Application),
        (responses.Pet, records.Pet),
        (responses.Screening, records.Screening),
        (responses.Income, records.Income),
    ]
    for served, stored in pairs:
        assert served.__struct_fields__ == stored.__struct_fields__, served.__name__


# --- real responses against the document ------------------------------------------------


def remove_database(path: Path) -> None:
    """Delete the database file (and its WAL files) from under a running server."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _first_id(db_path: Path) -> str:
    connection = sqlite3.connect(db_path)
    try:
        return str(connection.execute("SELECT id FROM applicants ORDER BY id").fetchone()[0])
    finally:
        connection.close()


async def test_pages_conform(client: Client, document: Document) -> None:
    first = await client.get(LIST, params={"limit": 7, "order-by": "last_name,first_name:desc"})
    assert first.status_code == 200
    assert_conforms(document, LIST, first)
    meta = first.json()["meta"]
    assert meta["hasMore"]
    assert meta["next"]

    walked = await client.get(LIST, params={"cursor": meta["next"]})
    assert walked.status_code == 200
    assert_conforms(document, LIST, walked)

    sync = await client.get(LIST, params={"changed_since": 0, "limit": 5})
    assert sync.status_code == 200
    assert "changeSeq" in sync.json()["meta"]
    assert_conforms(document, LIST, sync)

    past_end = await client.get(LIST, params={"offset": 10_000})
    assert past_end.json()["results"] == []
    assert_conforms(document, LIST, past_end)

    full = await client.get(LIST, params={"limit": 250})
    for body in (first, walked, sync, full):
        msgspec.json.decode(body.content, type=responses.ApplicantList, strict=True)


async def test_record_and_not_modified_conform(
    client: Client, document: Document, seeded_db: Path
) -> None:
    url = f"/v1/applicants/{_first_id(seeded_db)}"
    record = await client.get(url)
    assert record.status_code == 200
    assert_conforms(document, RECORD, record)
    msgspec.json.decode(record.content, type=responses.ApplicantSingle, strict=True)

    again = await client.get(url, headers={"If-None-Match": record.headers["etag"]})
    assert again.status_code == 304
    assert_conforms(document, RECORD, again)


async def test_error_responses_conform(client: Client, document: Document) -> None:
    cases = [
        (LIST, await client.get(LIST, params={"limit": 0}), 400),
        (LIST, await client.get(LIST, params={"nope": 1}), 400),
        (LIST, await client.get(LIST, headers={"Authorization": "Bearer nope"}), 401),
        (RECORD, await client.get("/v1/applicants/app_missing"), 404),
        (RECORD, await client.get("/v1/nothing/here"), 404),
        (LIST, await client.post(LIST), 405),
        (LIST, await client.get(LIST + "?order-by=" + "x" * 9000), 414),
        (LIST, await client.get(LIST, headers={"X-Padding": "p" * 17_000}), 431),
        (HEALTH, await client.get(HEALTH + "?" + "&".join(["a=1"] * 70)), 400),
        (HEALTH, await client.post(HEALTH), 405),
    ]
    for path, response, status in cases:
        assert response.status_code == status, (path, status, response.text)
        assert response.json()["error"]["code"] == ERROR_CODES[status]
        assert_conforms(document, path, response)


async def test_internal_error_conforms(
    client: Client, document: Document, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError("SELECT secret FROM /var/lib/leasestar")

    monkeypatch.setattr(ApplicantReader, "fetch_page", broken)
    response = await client.get(LIST)
    assert response.status_code == 500
    assert "secret" not in response.text
    assert "/var" not in response.text
    assert_conforms(document, LIST, response)


@pytest.fixture
async def limited_client(seeded_db: Path, token: str) -> AsyncIterator[Client]:
    app = create_app(Settings(db_path=seeded_db, rate_limit=RateLimit(2, "minute")))
    async with AsyncTestClient(app=app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


async def test_rate_limited_responses_conform(limited_client: Client, document: Document) -> None:
    ok = await limited_client.get(LIST, params={"limit": 1})
    assert ok.status_code == 200
    assert budget(ok) == 2
    assert_conforms(document, LIST, ok)
    await limited_client.get(LIST, params={"limit": 1})
    refused = await limited_client.get(LIST, params={"limit": 1})
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0
    assert_conforms(document, LIST, refused)


async def test_metrics_conform(client: Client, document: Document) -> None:
    response = await client.get(METRICS, headers={"Authorization": ""})
    assert response.status_code == 200
    documented = document["paths"][METRICS]["get"]["responses"]["200"]["content"]
    assert response.headers["content-type"].split(";")[0] in documented
    assert "leasestar_applicants " in response.text


async def test_health_conforms(client: Client, document: Document, seeded_db: Path) -> None:
    healthy = await client.get(HEALTH, headers={"Authorization": ""})
    assert (healthy.status_code, healthy.json()) == (200, {"status": "ok"})
    assert_conforms(document, HEALTH, healthy)
    remove_database(seeded_db)
    broken = await client.get(HEALTH)
    assert broken.status_code == 503
    assert_conforms(document, HEALTH, broken)
    assert json.loads(broken.content)["error"]["message"] == "the database is unavailable"
