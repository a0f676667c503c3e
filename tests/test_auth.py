"""Bearer authentication and integration scopes (CONTRACT.md, "Authentication and tenancy")."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from leasestar.config import Settings
from leasestar.main import create_app
from leasestar.tokens import create_token, revoke_token
from tests.json_body import register_json_body

Client = AsyncTestClient  # type: ignore[type-arg]
Record = dict[str, Any]

UNAUTHORIZED_CODE = "unauthorized"


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


@pytest.fixture
def records(seeded_db: Path) -> list[Record]:
    connection = sqlite3.connect(seeded_db)
    register_json_body(connection)
    try:
        return [
            json.loads(body)
            for (body,) in connection.execute("SELECT json_body(body) FROM applicants")
        ]
    finally:
        connection.close()


@pytest.fixture
async def anonymous(seeded_db: Path) -> AsyncIterator[Client]:
    """The app over the seeded database, with no Authorization header by default."""
    async with AsyncTestClient(app=create_app(Settings(db_path=seeded_db))) as test_client:
        yield test_client


def assert_unauthorized(response: Any) -> bytes:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == UNAUTHORIZED_CODE
    assert error["details"] == {}
    assert set(response.json()) == {"error"}
    return bytes(response.content)


# --- 401 ----------------------------------------------------------------------------------


async def test_every_kind_of_bad_token_gets_the_same_401(
    anonymous: Client, db: sqlite3.Connection, token: str, records: list[Record]
) -> None:
    revoked = create_token(db, "revoked-one")
    revoke_token(db, "revoked-one")
    public_part, secret = token.rsplit("_", 1)
    wrong_secret = public_part + "_" + ("A" if secret[0] != "A" else "B") + secret[1:]
    headers: list[dict[str, str]] = [
        {},
        {"Authorization": ""},
        {"Authorization": f"Basic {token}"},
        {"Authorization": "Basic x"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer a b"},
        {"Authorization": f"Bearer {token} {token}"},
        {"Authorization": f"Token {token}"},
        {"Authorization": f"Bearer{token}"},
        {"Authorization": token},
        {"Authorization": "Bearer lst_000000000000_" + "A" * 43},  # well formed, unknown
        {"Authorization": f"Bearer {wrong_secret}"},  # known id, wrong secret
        {"Authorization": f"Bearer {token[:-1]}"},
        {"Authorization": f"Bearer {revoked}"},
    ]
    bodies = set()
    for header in headers:
        for path in ("/v1/applicants", f"/v1/applicants/{records[0]['id']}", "/v1/applicants/x"):
            response = await anonymous.get(path, headers=header)
            bodies.add(assert_unauthorized(response))
    assert len(bodies) == 1  # the 401 says nothing about which way the token was bad


async def test_authentication_comes_before_validation(anonymous: Client) -> None:
    assert_unauthorized(await anonymous.get("/v1/applicants?limit=0&bogus=1"))


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_scheme_word_is_case_insensitive(anonymous: Client, token: str, scheme: str) -> None:
    response = await anonymous.get(
        "/v1/applicants?limit=1", headers={"Authorization": f"{scheme} {token}"}
    )
    assert response.status_code == 200
    assert response.json()["meta"]["total"] == 300


async def test_revocation_takes_effect_on_the_next_request(
    anonymous: Client, db: sqlite3.Connection
) -> None:
    fresh = create_token(db, "short-lived")
    header = {"Authorization": f"Bearer {fresh}"}
    assert (await anonymous.get("/v1/applicants?limit=1", headers=header)).status_code == 200
    revoke_token(db, "short-lived")
    assert_unauthorized(await anonymous.get("/v1/applicants?limit=1", headers=header))


async def test_only_a_hash_of_the_token_is_stored(db: sqlite3.Connection, token: str) -> None:
    dump = "\n".join(db.iterdump())
    assert token not in dump
    # lst_<12 hex digits>_<secret>, and the secret may itself hold "_".
    secret = token.split("_", 2)[2]
    assert len(secret) == 43
    assert secret not in dump


# --- tenancy --------------------------------------------------------------------------------


SCOPE = ("int_mri_01", "int_entrata_01")


async def test_scoped_token_sees_only_its_integrations(
    anonymous: Client, db: sqlite3.Connection, records: list[Record]
) -> None:
    scoped = create_token(db, "scoped", SCOPE)
    anonymous.headers["Authorization"] = f"Bearer {scoped}"
    expected = sorted(r["id"] for r in records if r["integration_id"] in SCOPE)
    assert 0 < len(expected) < len(records)
    seen: list[str] = []
    offset = 0
    while True:
        response = await anonymous.get(
            "/v1/applicants", params={"order-by": "id", "limit": "40", "offset": str(offset)}
        )
        body = response.json()
        assert body["meta"]["total"] == len(expected)
        assert {r["integration_id"] for r in body["results"]} <= set(SCOPE)
        seen.extend(r["id"] for r in body["results"])
        if not body["meta"]["hasMore"]:
            break
        offset += 40
    assert seen == expected
    # filters apply inside the scope, never widen it
    mri = await anonymous.get("/v1/applicants?integration_vendor=MRI")
    assert mri.json()["meta"]["total"] == sum(
        1 for r in records if r["integration_id"] == "int_mri_01"
    )
    foreign = await anonymous.get("/v1/applicants?integration_id=int_realpage_01")
    assert foreign.json()["meta"]["total"] == 0
    assert foreign.json()["results"] == []


async def test_foreign_id_answers_exactly_like_an_unknown_id(
    anonymous: Client, db: sqlite3.Connection, records: list[Record]
) -> None:
    scoped = create_token(db, "scoped", SCOPE)
    anonymous.headers["Authorization"] = f"Bearer {scoped}"
    own = next(r for r in records if r["integration_id"] == "int_mri_01")
    foreign = next(r for r in records if r["integration_id"] not in SCOPE)
    mine = await anonymous.get(f"/v1/applicants/{own['id']}")
    assert mine.status_code == 200
    assert mine.json()["results"] == own
    theirs = await anonymous.get(f"/v1/applicants/{foreign['id']}")
    unknown = await anonymous.get("/v1/applicants/app_ffffffffffffffffffffffff")
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.content == unknown.content
    assert theirs.headers["content-type"] == unknown.headers["content-type"]
    # and with date bounds that the foreign record satisfies
    bounded = await anonymous.get(
        f"/v1/applicants/{foreign['id']}", params={"updated_at_gte": "2000-01-01"}
    )
    assert bounded.status_code == 404
    assert bounded.content == unknown.content
    # an unscoped token sees that record
    everyone = create_token(db, "everyone")
    response = await anonymous.get(
        f"/v1/applicants/{foreign['id']}", headers={"Authorization": f"Bearer {everyone}"}
    )
    assert response.status_code == 200


async def test_foreign_x_id_lookup_finds_nothing(
    anonymous: Client, db: sqlite3.Connection, records: list[Record]
) -> None:
    scoped = create_token(db, "scoped", ("int_resman_01",))
    anonymous.headers["Authorization"] = f"Bearer {scoped}"
    foreign = next(r for r in records if r["integration_id"] == "int_mri_02")
    response = await anonymous.get(
        "/v1/applicants",
        params={
            "x_id": foreign["x_id"],
            "integration_id": foreign["integration_id"],
            "x_property_id": foreign["x_property_id"],
        },
    )
    assert response.status_code == 200
    assert response.json()["results"] == []
    assert response.json()["meta"]["total"] == 0


async def test_token_scoped_to_an_integration_without_records(
    anonymous: Client, db: sqlite3.Connection
) -> None:
    scoped = create_token(db, "nobody", ("int_none",))
    response = await anonymous.get("/v1/applicants", headers={"Authorization": f"Bearer {scoped}"})
    assert response.status_code == 200
    assert response.json()["results"] == []
    assert response.json()["meta"]["total"] == 0
    assert response.json()["meta"]["hasMore"] is False


async def test_two_tokens_same_url_different_scopes(
    anonymous: Client, db: sqlite3.Connection, token: str, records: list[Record]
) -> None:
    # The same URL must never answer one token with what another token saw.
    scoped = create_token(db, "scoped", ("int_buildium_01",))
    wide = await anonymous.get(
        "/v1/applicants?limit=5", headers={"Authorization": f"Bearer {token}"}
    )
    narrow = await anonymous.get(
        "/v1/applicants?limit=5", headers={"Authorization": f"Bearer {scoped}"}
    )
    assert wide.json()["meta"]["total"] == 300
    assert narrow.json()["meta"]["total"] == sum(
        1 for r in records if r["integration_id"] == "int_buildium_01"
    )
    assert {r["integration_id"] for r in narrow.json()["results"]} == {"int_buildium_01"}
    if "etag" in wide.headers:
        conditional = await anonymous.get(
            "/v1/applicants?limit=5",
            headers={"Authorization": f"Bearer {scoped}", "If-None-Match": wide.headers["etag"]},
        )
        assert conditional.status_code == 200
        assert conditional.json()["meta"]["total"] == narrow.json()["meta"]["total"]
