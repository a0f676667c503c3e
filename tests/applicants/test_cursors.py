"""Keyset cursors (issue 7): `meta.next`, following it, and refusing every bad cursor.

Expected orders are computed here from the stored records (sqlite3 + json, sorted in
plain Python by the contract's rules), never by the code under test. A cursor walk is
compared with that order and with the offset walk of the same query, for orderings
over nullable fields in both directions, multi-key orderings in mixed directions, the
empty ordering, and filters.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import sqlite3
import string
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from leasestar.applicants.cursors import CursorCodec, CursorState, last_record_start
from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant, SortKey
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import create_token
from tests.json_body import register_json_body

Client = AsyncTestClient  # type: ignore[type-arg]
Record = dict[str, Any]
Params = dict[str, Any]
SEEDED = 300
B64URL = string.ascii_letters + string.digits + "-_"


# --- the expected side -----------------------------------------------------------------


def stored_records(path: Path) -> list[Record]:
    connection = sqlite3.connect(path)
    register_json_body(connection)
    try:
        return [
            json.loads(body)
            for (body,) in connection.execute("SELECT json_body(body) FROM applicants")
        ]
    finally:
        connection.close()


def parse_order(text: str | None) -> list[tuple[str, str]]:
    """The total order the contract reads from an `order-by` value (None: absent)."""
    if text is None:
        keys = [("created_at", "desc")]
    elif text == "":
        keys = []
    else:
        keys = []
        for part in text.split(","):
            name, _, direction = part.partition(":")
            keys.append((name, (direction or "asc").lower()))
    if not keys:
        return [("id", "asc")]
    if all(name != "id" for name, _ in keys):
        keys.append(("id", keys[-1][1]))
    return keys


def expected_ids(records: list[Record], order_by: str | None) -> list[str]:
    """Ids in the contract's order. Served instants (UTC, ms, `Z`) sort as text; null is
    first ascending and last descending; strings by code point (Python's own order)."""
    rows = list(records)
    for name, direction in reversed(parse_order(order_by)):  # stable, least significant first
        rows.sort(key=lambda r, n=name: (r[n] is not None, r[n] or ""), reverse=direction == "desc")
    return [row["id"] for row in rows]


def matching(records: list[Record], filters: Params) -> list[Record]:
    def keep(record: Record) -> bool:
        for name, value in filters.items():
            if name.endswith(("_gte", "_lte")):
                stored = record[name[:-4]]
                if (name.endswith("_gte") and stored < value) or (
                    name.endswith("_lte") and stored > value
                ):
                    return False
            elif record[name] != value:
                return False
        return True

    return [record for record in records if keep(record)]


# --- walking ----------------------------------------------------------------------------


async def get_ok(client: Client, params: Params) -> Record:
    response = await client.get("/v1/applicants", params=params)
    assert response.status_code == 200, (params, response.text)
    body: Record = response.json()
    meta = body["meta"]
    # meta.next is there exactly when hasMore is.
    assert ("next" in meta) == meta["hasMore"], meta
    if "next" in meta:
        assert isinstance(meta["next"], str)
        assert set(meta["next"]) <= set(B64URL), meta["next"]  # URL-safe as it stands
    return body


async def cursor_walk(client: Client, params: Params, limit: int) -> list[list[str]]:
    """Pages of ids: the first by the query, the rest by `cursor` alone."""
    body = await get_ok(client, {**params, "limit": limit})
    pages = [[r["id"] for r in body["results"]]]
    first_meta = body["meta"]
    while "next" in body["meta"]:
        position = body["meta"]["offset"] + len(body["results"])
        body = await get_ok(client, {"cursor": body["meta"]["next"]})
        meta = body["meta"]
        # The cursor's page keeps the ordering, limit and walk total; offset is the position.
        assert meta["limit"] == limit
        assert meta["orderBy"] == first_meta["orderBy"]
        assert meta["total"] == first_meta["total"]
        assert meta["offset"] == position
        assert meta["hasMore"] == (meta["offset"] + len(body["results"]) < meta["total"])
        assert body["results"], "a cursor was given for an empty page"
        pages.append([r["id"] for r in body["results"]])
        assert len(pages) <= SEEDED + 1, "the walk does not end"
    return pages


async def offset_walk(client: Client, params: Params, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    offset = 0
    while True:
        body = await get_ok(client, {**params, "offset": offset, "limit": limit})
        pages.append([r["id"] for r in body["results"]])
        if not body["meta"]["hasMore"]:
            return pages
        offset += limit


def assert_invalid(response: Any, parameter: str, value: str | None = None) -> None:
    """A 400 in the contract's error shape naming `parameter` (and echoing `value`)."""
    assert response.status_code == 400, (parameter, value, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == "invalid_request"
    assert body["error"]["details"]["parameter"] == parameter
    if value is not None:
        assert body["error"]["details"]["value"] == value
    assert parameter in body["error"]["message"]


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    """The conftest data set, copied from a once-seeded template: this module makes many."""
    return seeded_copy


@pytest.fixture
def records(seeded_db: Path) -> list[Record]:
    return stored_records(seeded_db)


@pytest.fixture
async def first_next(client: Client) -> str:
    """The `meta.next` of the default first page of 7."""
    body = await get_ok(client, {"limit": 7})
    cursor: str = body["meta"]["next"]
    return cursor


def cursor_key(path: Path) -> bytes:
    connection = sqlite3.connect(path)
    try:
        return bytes(connection.execute("SELECT cursor_key FROM sync_state").fetchone()[0])
    finally:
        connection.close()


# --- cursor walk == offset walk == the contract's order ----------------------------------

# Grouped (one app per group, not per ordering): absent and empty; one nullable key each
# way; several keys in one direction (a row-value seek) and in mixed directions.
ORDERINGS: dict[str, tuple[str | None, ...]] = {
    "default-and-empty": (None, "", "id:desc", "last_seen"),
    "nullable-single": (
        "middle_name",
        "middle_name:desc",
        "email_1:asc",
        "email_1:desc",
        "date_of_birth:desc",
        "zip:desc",
    ),
    "multi-key": (
        "city,middle_name,email_1",  # one direction, nullable keys: a row-value seek
        "city:desc,middle_name:desc",
        "city:desc,middle_name:asc",
        "middle_name:desc,first_name:asc",
        "last_name:asc,first_name:desc,created_at:asc",
        "state:desc,zip:asc,middle_name:desc,email_1:asc",
        "integration_vendor:desc,updated_at:asc",
        "first_name:desc,id:asc",  # id requested: no hidden key
        "x_id,x_property_id:desc",
    ),
}


@pytest.mark.parametrize("group", ORDERINGS)
async def test_cursor_walk_equals_offset_walk_and_the_contract_order(
    client: Client, records: list[Record], group: str
) -> None:
    for index, order_by in enumerate(ORDERINGS[group]):
        params: Params = {} if order_by is None else {"order-by": order_by}
        limit = (37, 100, 13)[index % 3]
        by_cursor = await cursor_walk(client, params, limit)
        assert by_cursor == await offset_walk(client, params, limit), order_by
        assert [i for page in by_cursor for i in page] == expected_ids(records, order_by), order_by


FILTERS: tuple[tuple[Params, str | None, int], ...] = (
    ({"integration_id": "int_mri_01"}, None, 1),
    ({"integration_id": "int_mri_02"}, "middle_name:desc", 9),
    ({"integration_vendor": "MRI"}, "last_name,first_name:desc", 8),
    ({"updated_at_gte": "2023-01-01T00:00:00Z"}, "email_1:desc", 11),
    ({"updated_at_gte": "2022-01-01", "updated_at_lte": "2024-06-30T12:00:00+02:00"}, "", 6),
    ({"integration_id": "int_entrata_01", "last_seen_gte": "2020-01-01"}, "city:desc,zip", 4),
    ({"integration_id": "no-such-integration"}, None, 5),
)


async def test_cursor_walk_keeps_the_filters(client: Client, records: list[Record]) -> None:
    for filters, order_by, limit in FILTERS:
        params: Params = dict(filters)
        if order_by is not None:
            params["order-by"] = order_by
        comparable = {
            name: value if not name.endswith(("_gte", "_lte")) else served(value)
            for name, value in filters.items()
        }
        expected = expected_ids(matching(records, comparable), order_by)
        by_cursor = await cursor_walk(client, params, limit)
        assert by_cursor == await offset_walk(client, params, limit), params
        assert [i for page in by_cursor for i in page] == expected, params


def served(instant: str) -> str:
    """A bound as the API writes instants, so bounds compare with served values as text."""
    text = instant.replace("Z", "+00:00")
    moment = datetime.fromisoformat(text if "T" in text else text + "T00:00:00+00:00")
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


async def test_next_is_absent_on_the_last_page_and_on_empty_pages(client: Client) -> None:
    for params in (
        {"limit": 250, "offset": 50},  # exactly the rest: hasMore false
        {"limit": 100, "offset": 200},
        {"limit": 250, "offset": 299},
        {"offset": 300},
        {"offset": 2**63 - 1},
        {"integration_id": "nothing-here"},
    ):
        body = await get_ok(client, params)
        assert not body["meta"]["hasMore"]
        assert "next" not in body["meta"]


async def test_next_of_an_offset_page_continues_after_it(
    client: Client, records: list[Record]
) -> None:
    expected = expected_ids(records, "last_name,first_name")
    body = await get_ok(client, {"order-by": "last_name,first_name", "offset": 123, "limit": 50})
    following = await get_ok(client, {"cursor": body["meta"]["next"]})
    assert following["meta"]["offset"] == 173
    assert [r["id"] for r in following["results"]] == expected[173:223]


async def test_ties_on_every_key_are_walked_by_id(
    empty_client: Client, db: sqlite3.Connection
) -> None:
    """Records equal on every requested key (nulls included) are split by the hidden id."""
    base = {
        "created_at": "2024-01-01T00:00:00.000Z",
        "updated_at": "2024-01-01T00:00:00.000Z",
        "last_seen": "2024-01-01T00:00:00.000Z",
        "x_property_id": "P",
        "property_id": "prop",
        "integration_id": "int",
        "integration_vendor": "V",
    }
    write_records(
        db,
        [
            Applicant(id=f"app_{n:02d}", x_id=f"X{n}", last_name=None if n % 3 else "Same", **base)
            for n in range(20)
        ],
    )
    for order_by in ("last_name", "last_name:desc", "created_at,last_name:desc,middle_name"):
        records = stored_records_of(db)
        expected = expected_ids(records, order_by)
        for limit in (1, 2, 3):
            pages = await cursor_walk(empty_client, {"order-by": order_by}, limit)
            assert [i for page in pages for i in page] == expected


def stored_records_of(db: sqlite3.Connection) -> list[Record]:
    register_json_body(db)
    return [json.loads(body) for (body,) in db.execute("SELECT json_body(body) FROM applicants")]


@pytest.fixture
async def empty_client(db_path: Path, token: str) -> AsyncIterator[Client]:
    app = create_app(Settings(db_path=db_path))
    async with AsyncTestClient(app=app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


async def test_a_scoped_token_walks_only_its_integrations(
    seeded_db: Path, records: list[Record]
) -> None:
    connection = open_for_write(seeded_db)
    try:
        scoped = create_token(connection, "scoped", ["int_mri_01", "int_resman_01"])
    finally:
        connection.close()
    async with AsyncTestClient(app=create_app(Settings(db_path=seeded_db))) as client:
        client.headers["Authorization"] = f"Bearer {scoped}"
        visible = [r for r in records if r["integration_id"] in ("int_mri_01", "int_resman_01")]
        pages = await cursor_walk(client, {"order-by": "middle_name:desc"}, 11)
        assert [i for page in pages for i in page] == expected_ids(visible, "middle_name:desc")


async def test_a_cursor_works_only_for_the_token_scope_that_received_it(
    seeded_db: Path, token: str
) -> None:
    """Replayed under another scope, a cursor would start that scope's walk at a position
    counted among other records: it is refused like a tampered one. Another token of the
    same scope may go on with it."""
    connection = open_for_write(seeded_db)
    try:
        mri = create_token(connection, "mri", ["int_mri_01"])
        mri_too = create_token(connection, "mri-too", ["int_mri_01"])
        entrata = create_token(connection, "entrata", ["int_entrata_01"])
    finally:
        connection.close()
    async with AsyncTestClient(app=create_app(Settings(db_path=seeded_db))) as client:
        client.headers["Authorization"] = f"Bearer {mri}"
        first = await get_ok(client, {"limit": 3})
        cursor = first["meta"]["next"]
        second = await get_ok(client, {"cursor": cursor})
        client.headers["Authorization"] = f"Bearer {mri_too}"
        assert await get_ok(client, {"cursor": cursor}) == second
        for other in (entrata, token):
            client.headers["Authorization"] = f"Bearer {other}"
            await assert_bad_cursor(client, cursor)


# --- parameters given with a cursor ------------------------------------------------------


async def test_parameters_repeated_with_the_cursor_must_match(
    client: Client, records: list[Record]
) -> None:
    params: Params = {
        "order-by": "last_name:desc,first_name",
        "integration_vendor": "MRI",
        "updated_at_gte": "2021-01-01T00:00:00Z",
        "limit": 5,
    }
    first = await get_ok(client, params)
    cursor = first["meta"]["next"]
    alone = await get_ok(client, {"cursor": cursor})
    # Every parameter repeated with its value (written another way where it can be).
    same_again: list[Params] = [
        {"limit": 5},
        {"limit": "005"},
        {"order-by": "last_name:DESC,first_name:asc"},
        {"integration_vendor": "MRI"},
        {"updated_at_gte": "2021-01-01"},
        {"updated_at_gte": "2020-12-31T19:00:00-05:00"},
        params,
        {"limit": ""},  # empty means absent
        {"cursor": cursor, "offset": ""},
    ]
    for extra in same_again:
        body = await get_ok(client, {**extra, "cursor": cursor})
        assert body == alone, extra
    # Any other value is a 400 naming the parameter.
    different: list[tuple[str, Any]] = [
        ("limit", 6),
        ("order-by", "last_name:desc"),
        ("order-by", ""),
        ("integration_vendor", "ENTRATA"),
        ("integration_id", "int_mri_01"),  # not in the cursor's query at all
        ("updated_at_gte", "2021-01-01T00:00:00.001Z"),
        ("updated_at_lte", "2030-01-01"),
        ("email_1", "nobody@example.com"),
        ("phone_1", "5125550100"),
        ("changed_since", 0),
    ]
    for name, value in different:
        response = await client.get("/v1/applicants", params={"cursor": cursor, name: value})
        assert_invalid(response, name, str(value))


async def test_offset_cannot_be_given_with_a_cursor(client: Client, first_next: str) -> None:
    for offset in ("0", "7", "100"):
        response = await client.get(
            "/v1/applicants", params={"cursor": first_next, "offset": offset}
        )
        assert_invalid(response, "offset", offset)


async def test_cursor_given_twice_or_with_unknown_parameters_is_400(
    client: Client, first_next: str
) -> None:
    response = await client.get(f"/v1/applicants?cursor={first_next}&cursor={first_next}")
    assert_invalid(response, "cursor", first_next)
    response = await client.get("/v1/applicants", params={"cursor": first_next, "page": "2"})
    assert_invalid(response, "page", "2")


async def test_empty_cursor_means_absent(client: Client) -> None:
    assert await get_ok(client, {"cursor": "", "limit": 3}) == await get_ok(client, {"limit": 3})


async def test_changed_since_refuses_order_by_and_offset(client: Client) -> None:
    for name, value in (("order-by", "last_name"), ("order-by", ""), ("offset", "0")):
        response = await client.get("/v1/applicants", params={"changed_since": 0, name: value})
        assert_invalid(response, name, value)


async def test_cursor_of_the_sync_feed_checks_changed_since(client: Client) -> None:
    first = await get_ok(client, {"changed_since": 10, "limit": 4})
    cursor = first["meta"]["next"]
    alone = await get_ok(client, {"cursor": cursor})
    assert await get_ok(client, {"cursor": cursor, "changed_since": "10"}) == alone
    for name, value in (("changed_since", "11"), ("order-by", "id"), ("offset", "4")):
        response = await client.get("/v1/applicants", params={"cursor": cursor, name: value})
        assert_invalid(response, name, value)
    # A list cursor given with changed_since is not a sync cursor.
    listed = await get_ok(client, {"limit": 4})
    response = await client.get(
        "/v1/applicants", params={"cursor": listed["meta"]["next"], "changed_since": "0"}
    )
    assert_invalid(response, "changed_since", "0")


# --- bad cursors -------------------------------------------------------------------------


async def assert_bad_cursor(client: Client, cursor: str) -> None:
    response = await client.get("/v1/applicants", params={"cursor": cursor})
    assert_invalid(response, "cursor", cursor)


async def test_every_single_character_change_is_refused(client: Client, first_next: str) -> None:
    """Flip any character to any other URL-safe one, or to a character outside the
    alphabet: the signature (or the encoding) no longer holds."""
    for index, char in enumerate(first_next):
        others = [c for c in B64URL if c != char]
        for replacement in (others[index % len(others)], others[-1 - index % len(others)]):
            await assert_bad_cursor(
                client, first_next[:index] + replacement + first_next[index + 1 :]
            )
    for odd in ("+", "/", "=", ".", "!", " ", "é", "\x00"):
        await assert_bad_cursor(client, first_next[:10] + odd + first_next[11:])
        await assert_bad_cursor(client, first_next[:10] + odd + first_next[10:])


async def test_low_bits_of_the_last_character_are_checked(client: Client, first_next: str) -> None:
    """The last base64 character can carry unused bits; a cursor that differs only there
    is still not the cursor that was given, so it is refused too."""
    for char in B64URL:
        if char != first_next[-1]:
            await assert_bad_cursor(client, first_next[:-1] + char)


async def test_padding_and_appended_characters_are_refused(client: Client, first_next: str) -> None:
    for extra in ("=", "==", "===", "A", "AA", "AAAA", "-", "_", "%3D"):
        await assert_bad_cursor(client, first_next + extra)
    await assert_bad_cursor(client, "=" + first_next)


async def test_truncated_cursors_are_refused(client: Client, first_next: str) -> None:
    for length in range(1, len(first_next)):
        await assert_bad_cursor(client, first_next[:length])
    for start in (1, 2, 3, 4, 22):
        await assert_bad_cursor(client, first_next[start:])


GARBAGE: tuple[str, ...] = (
    "x",
    "abc",
    "null",
    "!!!!",
    "😀",
    "%00",
    "\x00" * 30,
    "A" * 30,
    "_" * 64,
    "A" * 2000,
    "eyJhIjoxfQ",  # base64 of {"a":1}
    base64.urlsafe_b64encode(b"\x00" * 16 + b"[1,7,[],[],null,7,[]]").decode(),
    base64.b64encode(b"\xff" * 40).decode(),  # standard alphabet (+, /) and padding
)


async def test_garbage_is_refused(client: Client) -> None:
    for garbage in GARBAGE:
        await assert_bad_cursor(client, garbage)


def foreign_cursor(state: CursorState, key: bytes) -> str:
    """A cursor in the app's own format, signed as a database of `key` signs cursors for
    an unscoped token (the tests' `token`)."""
    return CursorCodec(key).for_scope(None).encode(state)


def a_state(**changes: Any) -> CursorState:
    values: dict[str, Any] = {
        "version": 1,
        "limit": 7,
        "order_by": (SortKey("created_at", "desc"),),
        "filters": (),
        "changed_since": None,
        "position": 7,
        "after": (1_700_000_000_000_000, "app_0"),
    }
    values.update(changes)
    return CursorState(**values)


async def test_other_json_well_signed_under_another_key_is_refused(client: Client) -> None:
    other_key = hashlib.sha256(b"another database").digest()
    await assert_bad_cursor(client, foreign_cursor(a_state(), other_key))
    # Any JSON at all behind a signature made with the wrong key.
    for payload in (b"{}", b"[]", b'{"limit": 250}', b"[1]", msgspec.json.encode(a_state())):
        signature = hmac.new(other_key, payload, hashlib.sha256).digest()[:16]
        token = base64.urlsafe_b64encode(signature + payload).rstrip(b"=").decode()
        await assert_bad_cursor(client, token)


async def test_a_cursor_from_another_database_is_refused(
    client: Client, tmp_path: Path, first_next: str
) -> None:
    """Two database files have two keys: a cursor does not travel between them, even
    when the other database holds the very same records."""
    other = tmp_path / "other.db"
    connection = open_for_write(other)
    try:
        write_records(connection, synthetic_applicants(SEEDED, seed=7))
        other_token = create_token(connection, "other")
    finally:
        connection.close()
    async with AsyncTestClient(app=create_app(Settings(db_path=other))) as other_client:
        other_client.headers["Authorization"] = f"Bearer {other_token}"
        theirs = (await get_ok(other_client, {"limit": 7}))["meta"]["next"]
        # The other database answers its own cursor, and refuses ours.
        await get_ok(other_client, {"cursor": theirs})
        await assert_bad_cursor(other_client, first_next)
    assert theirs != first_next
    await assert_bad_cursor(client, theirs)


BROKEN_STATES: tuple[Callable[[], CursorState], ...] = (
    lambda: a_state(version=2),
    lambda: a_state(version=0),
    lambda: a_state(after=(1,)),  # fewer values than the ordering has keys
    lambda: a_state(after=(1, "app_0", "extra")),
    lambda: a_state(filters=(("offset", 5),)),
    lambda: a_state(filters=(("body", "x"),)),
    lambda: a_state(order_by=(SortKey("body", "asc"),), after=("x", "app_0")),
    lambda: a_state(order_by=(SortKey("no such column", "asc"),), after=("x", "app_0")),
    lambda: a_state(order_by=(SortKey("change_seq", "asc"),), after=(1,)),
    lambda: a_state(limit=0),
    lambda: a_state(limit=251),
    lambda: a_state(limit=-1),
    lambda: a_state(position=-1),
)


async def test_signed_but_impossible_states_are_refused(client: Client, seeded_db: Path) -> None:
    """Cursors the server would never write (another API version, fields it does not
    know, values out of their rules), even under the database's own key: 400, not 5xx."""
    for make in BROKEN_STATES:
        await assert_bad_cursor(client, foreign_cursor(make(), cursor_key(seeded_db)))


async def test_a_well_formed_cursor_under_the_right_key_is_followed(
    client: Client, seeded_db: Path, records: list[Record]
) -> None:
    """The app's codec with the database's key makes a cursor the API follows: the
    format the benchmark relies on to jump to a depth."""
    expected = expected_ids(records, None)
    target = next(r for r in records if r["id"] == expected[149])
    created = datetime.fromisoformat(target["created_at"].replace("Z", "+00:00"))
    micros = (created - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    cursor = foreign_cursor(
        a_state(limit=10, position=150, after=(micros, target["id"])), cursor_key(seeded_db)
    )
    body = await get_ok(client, {"cursor": cursor})
    assert [r["id"] for r in body["results"]] == expected[150:160]
    assert body["meta"]["offset"] == 150


# --- fuzz ------------------------------------------------------------------------------

FUZZ_SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def mutations(valid: str) -> st.SearchStrategy[str]:
    """A valid cursor with characters replaced, inserted or removed."""
    position = st.integers(0, len(valid))
    char = st.sampled_from(B64URL) | st.characters(exclude_categories=("Cs",))

    def edit(data: tuple[list[tuple[int, str, str]], str]) -> str:
        edits, text = data
        for index, kind, c in edits:
            index = min(index, len(text))
            if kind == "replace":
                text = text[:index] + c + text[index + 1 :]
            elif kind == "insert":
                text = text[:index] + c + text[index:]
            else:
                text = text[:index] + text[index + 1 :]
        return text

    return st.tuples(
        st.lists(
            st.tuples(position, st.sampled_from(("replace", "insert", "delete")), char),
            min_size=1,
            max_size=4,
        ),
        st.just(valid),
    ).map(edit)


@FUZZ_SETTINGS
@given(data=st.data())
async def test_fuzzed_cursors_are_always_400(
    client: Client, first_next: str, data: st.DataObject
) -> None:
    cursor = data.draw(
        st.one_of(
            st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=300),
            st.text(B64URL, min_size=1, max_size=300),
            st.binary(max_size=200).map(
                lambda raw: base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
            ),
            mutations(first_next),
        ).filter(lambda text: text not in ("", first_next)),  # empty: cursor absent
        label="cursor",
    )
    response = await client.get("/v1/applicants", params={"cursor": cursor})
    assert_invalid(response, "cursor", cursor)


# --- finding the last record of a page ---------------------------------------------------

_SORT_FIELDS = ("created_at", "updated_at", "last_seen", "x_id", "x_property_id", "property_id")


def _record_like(identifier: str, nested: Any) -> dict[str, Any]:
    """An object shaped like a served record (id first), with `nested` as custom_data."""
    record: dict[str, Any] = {"id": identifier}
    record.update(dict.fromkeys(_SORT_FIELDS, "2024-01-01T00:00:00.000Z"))
    record.update(integration_id="int_a", integration_vendor="V")
    record.update(dict.fromkeys(("first_name", "middle_name", "last_name", "email_1"), None))
    record.update(dict.fromkeys(("date_of_birth", "city", "state", "zip"), None))
    record["custom_data"] = nested
    return record


# custom_data holding objects that look exactly like records, up to the record's last byte
_decoys = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(alphabet='{}[]",:id ', max_size=12)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.builds(_record_like, st.text(alphabet="abc,{}", max_size=4), inner),
    ),
    max_leaves=6,
)


@given(st.lists(st.tuples(st.text(alphabet="xyz", max_size=3), _decoys), min_size=1, max_size=5))
def test_the_last_record_is_found_whatever_its_nested_data_holds(
    records: list[tuple[str, Any]],
) -> None:
    bodies = [
        msgspec.json.encode(_record_like(f"app_{i}{s}", d)) for i, (s, d) in enumerate(records)
    ]
    joined = b",".join(bodies)
    assert joined[last_record_start(joined) :] == bodies[-1]
