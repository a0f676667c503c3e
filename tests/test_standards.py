"""The standards points of issue 29, against a real `leasestar serve`: every negotiated
answer says what it varies by (RFC 9110, 12.5.5), its 304 included (15.4.5), and the
OpenAPI document passes a third-party linter (Redocly CLI, installed by `make install`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_hardening import Server, copy_database, new_token, query_one, serve

LIST = "/v1/applicants"
# What each route negotiates: the list JSON or NDJSON (Accept) and its encoding; a record
# its encoding alone.
LIST_VARY = {"accept", "accept-encoding"}
RECORD_VARY = {"accept-encoding"}
ENCODINGS = ("identity", "gzip", "br", "zstd")
# Where `make install` puts the linter: beside the virtual environment running the tests.
REDOCLY = Path(sys.prefix) / "node" / "node_modules" / ".bin" / "redocly"


@pytest.fixture(scope="module")
def db(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_database(seeded_template, tmp_path_factory.mktemp("standards") / "leasestar.db")


@pytest.fixture(scope="module")
def server(db: Path) -> Iterator[Server]:
    with serve(db, "--rate-limit", "off", "--log-format", "off") as running:
        yield running


@pytest.fixture(scope="module")
def http(server: Server, db: Path) -> Iterator[httpx.Client]:
    token = new_token(db, "standards")
    with httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield client


def varies_by(response: httpx.Response) -> set[str]:
    """The field names of every Vary line of the answer, lower case."""
    return {
        name.strip().lower()
        for line in response.headers.get_list("vary")
        for name in line.split(",")
        if name.strip()
    }


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_list_pages_and_their_304_vary_by_accept_and_encoding(
    http: httpx.Client, encoding: str
) -> None:
    page = http.get(LIST, headers={"Accept-Encoding": encoding})
    assert page.status_code == 200
    assert page.headers.get("content-encoding", "identity") == encoding
    assert varies_by(page) == LIST_VARY
    again = http.get(
        LIST, headers={"Accept-Encoding": encoding, "If-None-Match": page.headers["etag"]}
    )
    assert again.status_code == 304
    assert varies_by(again) == LIST_VARY


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_ndjson_streams_vary_by_accept_and_encoding(http: httpx.Client, encoding: str) -> None:
    stream = http.get(LIST, headers={"Accept": "application/x-ndjson", "Accept-Encoding": encoding})
    assert stream.status_code == 200
    assert stream.headers["content-type"].startswith("application/x-ndjson")
    assert stream.headers.get("content-encoding", "identity") == encoding
    assert varies_by(stream) == LIST_VARY


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_records_and_their_304_vary_by_encoding(
    http: httpx.Client, db: Path, encoding: str
) -> None:
    applicant_id = query_one(db, "SELECT min(id) FROM applicants")
    record = http.get(f"{LIST}/{applicant_id}", headers={"Accept-Encoding": encoding})
    assert record.status_code == 200
    assert varies_by(record) == RECORD_VARY
    again = http.get(
        f"{LIST}/{applicant_id}",
        headers={"Accept-Encoding": encoding, "If-None-Match": record.headers["etag"]},
    )
    assert again.status_code == 304
    assert varies_by(again) == RECORD_VARY


def test_the_document_varies_by_encoding_in_identity_too(http: httpx.Client) -> None:
    """Large enough to be compressed for a client that asks: so its identity answer
    varies as well, or a shared cache would hand it to everyone."""
    identity = http.get("/schema/openapi.json", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in identity.headers
    assert varies_by(identity) == {"accept-encoding"}
    assert varies_by(http.get("/schema/openapi.json", headers={"Accept-Encoding": "gzip"})) == {
        "accept-encoding"
    }


def test_small_answers_that_are_never_compressed_do_not_vary(http: httpx.Client) -> None:
    health = http.get("/health", headers={"Accept-Encoding": "gzip"})
    assert health.status_code == 200
    assert "vary" not in health.headers


# --- the OpenAPI document, linted ---------------------------------------------------------

# Redocly's recommended rules, and operation tags declared at the top (Spectral's
# `operation-tag-defined`, which Redocly leaves off by default).
LINT_CONFIG = """\
extends:
  - recommended
rules:
  operation-tag-defined: error
"""


def test_the_openapi_document_is_lint_clean(http: httpx.Client, tmp_path: Path) -> None:
    assert REDOCLY.exists(), f"{REDOCLY} is missing: `make install` installs Redocly CLI"
    document = tmp_path / "openapi.json"
    document.write_bytes(http.get("/schema/openapi.json").content)
    config = tmp_path / "redocly.yaml"
    config.write_text(LINT_CONFIG)
    linted = subprocess.run(
        [str(REDOCLY), "lint", str(document), "--config", str(config), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        # No telemetry nor update check: the linter runs offline.
        env={**os.environ, "REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true"},
        check=False,
    )
    report = json.loads(linted.stdout)
    problems = [(p["ruleId"], p["message"]) for p in report["problems"]]
    assert problems == [], linted.stdout
    assert linted.returncode == 0, linted.stderr


def test_public_operations_declare_no_security_and_tags_are_declared(
    http: httpx.Client,
) -> None:
    document = http.get("/schema/openapi.json").json()
    assert document["paths"]["/health"]["get"]["security"] == []
    assert document["paths"]["/metrics"]["get"]["security"] == []
    assert document["paths"][LIST]["get"]["security"] == [{"BearerToken": []}]
    declared = {tag["name"] for tag in document["tags"]}
    used = {
        tag for path in document["paths"].values() for op in path.values() for tag in op["tags"]
    }
    assert used <= declared
