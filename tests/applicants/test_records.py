"""The applicant id rule of leasestar/applicants/records.py, end to end.

An applicant is served at GET /v1/applicants/{id}, so import accepts only ids that
route reaches: 1-128 characters of A-Z a-z 0-9 . _ ~ : -, and not "." or "..". Here the
rule is checked against a statement of it written independently of the code; every id
it accepts must be reachable, written raw or fully percent-encoded; and a path that names
an id which cannot exist must answer 404 with the error body, from the test client and
from a real server (whose own parser percent-decodes the path before the app sees it).
(`tests/test_cli_data.py` checks the command line: line-numbered errors, nothing written.)
"""

from __future__ import annotations

import io
import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from leasestar.applicants.ndjson import parse_applicant
from leasestar.applicants.pipeline import import_ndjson
from leasestar.applicants.records import APPLICANT_ID_RULE
from leasestar.applicants.writer import RecordError
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.tokens import create_token
from tests.strategies import MINIMAL
from tests.test_fuzz import assert_error_body
from tests.test_hardening import Server, copy_database, new_token, raw_request, serve

Client = AsyncTestClient  # type: ignore[type-arg]

ID_CHARACTERS = frozenset(string.ascii_letters + string.digits + "._~:-")
REFUSED = f"id: {APPLICANT_ID_RULE}"


def allowed(identifier: str) -> bool:
    """The rule as the README states it."""
    return (
        1 <= len(identifier) <= 128
        and set(identifier) <= ID_CHARACTERS
        and identifier not in (".", "..")
    )


def line(**fields: Any) -> bytes:
    return json.dumps({**MINIMAL, **fields}).encode() + b"\n"


def refusal(identifier: str) -> str | None:
    """What import says of a line with this id; None when it accepts it."""
    try:
        parse_applicant(line(id=identifier))
    except RecordError as error:
        return str(error)
    return None


def percent_encoded(identifier: str) -> str:
    """Every byte escaped, as an over-cautious client might write it."""
    return "".join(f"%{byte:02X}" for byte in identifier.encode())


# --- the rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "identifier",
    [
        pytest.param("a/b", id="slash"),
        pytest.param(".", id="dot"),
        pytest.param("..", id="dot-dot"),
        pytest.param("", id="empty"),
        pytest.param("a" * 129, id="129-characters"),
        pytest.param("app_é", id="non-ASCII-letter"),
        pytest.param("\uff41", id="fullwidth-a"),
        pytest.param("\u0663", id="arabic-indic-digit"),
        pytest.param("😀", id="non-BMP"),
        pytest.param("a b", id="space"),
        pytest.param("a%2Fb", id="percent"),
        pytest.param("a?b", id="question-mark"),
        pytest.param("a#b", id="hash"),
        pytest.param("a\\b", id="backslash"),
        pytest.param("ab\n", id="trailing-newline"),
        pytest.param("a\x00b", id="NUL"),
    ],
)
def test_an_id_outside_the_rule_is_refused_by_name(identifier: str) -> None:
    with pytest.raises(RecordError) as refused:
        parse_applicant(line(id=identifier))
    assert str(refused.value) == REFUSED


@pytest.mark.parametrize(
    "identifier",
    ["a" * 128, "app_0123456789abcdef01234567", "...", ".a", "a..b", "urn:crm:42", "~", "-", "_"],
)
def test_ids_within_the_rule_are_accepted(identifier: str) -> None:
    assert parse_applicant(line(id=identifier))[0].id == identifier


@given(
    st.one_of(
        st.text(max_size=130),
        st.text(sorted(ID_CHARACTERS | set("/%é \n")), max_size=130),
        st.sampled_from((".", "..", "...")),
    )
)
def test_import_accepts_exactly_the_ids_of_the_rule(identifier: str) -> None:
    assert refusal(identifier) == (None if allowed(identifier) else REFUSED)


# --- every accepted id is reachable -----------------------------------------------------

# Candidates: ids of the rule, and short text mixing its characters with ones a path
# segment cannot carry as they are, so that a rule grown too wide shows up as an
# accepted id that no route reaches.
PIECES = (
    "a",
    "Z",
    "0",
    ".",
    "_",
    "~",
    ":",
    "-",
    "/",
    "%",
    "%2F",
    "%41",
    "é",
    " ",
    "?",
    "#",
    ";",
    "\\",
)
candidate_ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9._~:-]{1,128}", fullmatch=True),
    st.lists(st.sampled_from(PIECES), max_size=5).map("".join),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(candidates=st.lists(candidate_ids, min_size=1, max_size=8, unique=True))
async def test_every_id_import_accepts_is_reachable_at_its_route(
    candidates: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    identifiers = [i for i in candidates if refusal(i) is None]
    assume(identifiers)
    # One directory per example: Hypothesis shares function-scoped fixtures between them.
    path = tmp_path_factory.mktemp("ids") / "leasestar.db"
    connection = open_for_write(path)
    try:
        data = b"".join(line(id=i, x_id=f"X{n}") for n, i in enumerate(identifiers))
        assert import_ndjson(connection, io.BytesIO(data)).ok
        token = create_token(connection, "reader")
    finally:
        connection.close()
    async with AsyncTestClient(app=create_app(Settings(db_path=path))) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        for identifier in identifiers:
            for written in (identifier, percent_encoded(identifier)):
                response = await client.get(f"/v1/applicants/{written}")
                assert response.status_code == 200, (written, response.text)
                assert response.json()["results"]["id"] == identifier


# --- ids that cannot exist --------------------------------------------------------------

# Path segments naming no possible id, as sent on the wire. The server decodes them
# before routing: an encoded slash becomes a second segment, so no route matches.
IMPOSSIBLE = [
    "a%2Fb",
    "a%2fb",
    "a/b",
    "%2E",
    "%2E%2E",
    "%2e%2e%2fhealth",
    "%00",
    "%FF",
    "%C3%A9",
    "%",
    "%zz",
    "a%20b",
    "a%3Fb",
    "a%23b",
    "a%5Cb",
    "a;b",
    "a" * 129,
]


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


@pytest.mark.parametrize("segment", IMPOSSIBLE)
async def test_an_id_that_cannot_exist_is_404_with_the_error_body(
    client: Client, segment: str
) -> None:
    response = await client.get(f"/v1/applicants/{segment}")
    assert response.status_code == 404, response.text
    assert_error_body(404, response.content)


@pytest.fixture(scope="module")
def real_server(
    seeded_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, str]]:
    path = copy_database(seeded_template, tmp_path_factory.mktemp("ids") / "leasestar.db")
    token = new_token(path, "id-reader")
    with serve(path, "--log-format", "off", "--rate-limit", "off") as running:
        yield running, token


@pytest.mark.parametrize("segment", [*IMPOSSIBLE, ".", ".."])
def test_a_real_server_answers_an_impossible_id_404_with_the_error_body(
    real_server: tuple[Server, str], segment: str
) -> None:
    server, token = real_server
    status, _, body = raw_request(
        server.port,
        f"GET /v1/applicants/{segment} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode(),
    )
    assert status == 404, body[:200]
    assert_error_body(404, body)
