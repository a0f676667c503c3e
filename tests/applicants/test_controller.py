"""The applicant read API against CONTRACT.md, parameter by parameter.

Expected values never come from the code under test: they are computed here from the
stored records (read with sqlite3 + json and filtered and sorted in plain Python), or
from hand-built records whose outcome is known by construction.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant
from leasestar.config import Settings
from leasestar.main import create_app
from tests.contract import LIST_ONLY_FILTERS, META_KEYS, SORTABLE
from tests.json_body import register_json_body

Client = AsyncTestClient  # type: ignore[type-arg]
Record = dict[str, Any]

SEEDED = 300


# --- helpers: the expected side, independent of app code ------------------------------


def stored_records(path: Path) -> list[Record]:
    """Every applicant as stored, straight from SQLite."""
    connection = sqlite3.connect(path)
    register_json_body(connection)
    try:
        return [
            json.loads(body)
            for (body,) in connection.execute("SELECT json_body(body) FROM applicants")
        ]
    finally:
        connection.close()


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _sort_key(field: str) -> Callable[[Record], tuple[bool, Any]]:
    # None sorts before every value ascending (and so after every value descending).
    return lambda record: (record[field] is not None, record[field] or "")


def expected_ids(records: list[Record], order: list[tuple[str, str]]) -> list[str]:
    """Ids in the contract's order: keys, then the hidden id key in the last key's direction."""
    keys = list(order) or [("id", "asc")]
    if all(field != "id" for field, _ in keys):
        keys.append(("id", keys[-1][1]))
    rows = list(records)
    for field, direction in reversed(keys):  # stable sorts, least significant key first
        rows.sort(key=_sort_key(field), reverse=direction == "desc")
    return [row["id"] for row in rows]


async def every_page(client: Client, params: dict[str, Any], limit: int = 128) -> list[Record]:
    """Walk the list with offset/limit until hasMore is false, checking meta on the way."""
    results: list[Record] = []
    offset = 0
    while True:
        response = await client.get(
            "/v1/applicants", params={**params, "offset": offset, "limit": limit}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["meta"]["offset"] == offset
        assert body["meta"]["limit"] == limit
        results.extend(body["results"])
        assert body["meta"]["hasMore"] == (offset + len(body["results"]) < body["meta"]["total"])
        if not body["meta"]["hasMore"]:
            return results
        offset += limit


def applicant(number: int, **fields: Any) -> Applicant:
    """A hand-built applicant with every service field given, so outcomes are known."""
    values: dict[str, Any] = {
        "id": f"app_hand_{number:03d}",
        "created_at": "2024-01-01T00:00:00.000Z",
        "updated_at": "2024-01-01T00:00:00.000Z",
        "last_seen": "2024-01-01T00:00:00.000Z",
        "x_id": f"X{number:03d}",
        "x_property_id": "HP-001",
        "property_id": "prop_hand_001",
        "integration_id": "int_hand_01",
        "integration_vendor": "HAND",
    }
    values.update(fields)
    return Applicant(**values)


def contract_meta(body: Record) -> Record:
    """The meta keys CONTRACT.md defines (a page may carry more, such as a cursor)."""
    meta: Record = body["meta"]
    assert set(META_KEYS) <= set(meta), meta
    return {key: meta[key] for key in META_KEYS}


def assert_invalid(response: Any, parameter: str, value: str) -> None:
    """A 400 in the contract's shape naming the parameter and echoing the value."""
    assert response.status_code == 400, (parameter, value, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == "invalid_request"
    assert body["error"]["details"] == {"parameter": parameter, "value": value}
    assert parameter in body["error"]["message"]


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    """The conftest data set, copied from a once-seeded template: this module makes many."""
    return seeded_copy


@pytest.fixture
def records(seeded_db: Path) -> list[Record]:
    return stored_records(seeded_db)


@pytest.fixture
async def empty_client(db_path: Path, token: str) -> AsyncIterator[Client]:
    """The app over a database holding no applicants yet (tests write their own)."""
    app = create_app(Settings(db_path=db_path))
    async with AsyncTestClient(app=app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


# --- offset, limit, meta ----------------------------------------------------------------


async def test_defaults_are_offset_0_limit_100_created_at_desc(
    client: Client, records: list[Record]
) -> None:
    response = await client.get("/v1/applicants")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert contract_meta(body) == {
        "offset": 0,
        "limit": 100,
        "orderBy": [{"field": "created_at", "direction": "desc"}],
        "hasMore": True,
        "total": SEEDED,
    }
    assert [r["id"] for r in body["results"]] == expected_ids(records, [("created_at", "desc")])[
        :100
    ]


SLICES = (
    (0, 1, 1, True),
    (0, 250, 250, True),
    (199, 100, 100, True),
    (200, 100, 100, False),
    (250, 100, 50, False),
    (298, 1, 1, True),
    (299, 1, 1, False),
    (299, 250, 1, False),
    (300, 10, 0, False),
    (10**6, 250, 0, False),
    (2**63 - 1, 250, 0, False),
)


async def test_offset_and_limit_slice_the_ordered_records(
    client: Client, records: list[Record]
) -> None:
    ids = sorted(r["id"] for r in records)
    for offset, limit, returned, has_more in SLICES:
        response = await client.get(
            "/v1/applicants", params={"offset": str(offset), "limit": str(limit), "order-by": "id"}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert contract_meta(body) == {
            "offset": offset,
            "limit": limit,
            "orderBy": [{"field": "id", "direction": "asc"}],
            "hasMore": has_more,
            "total": SEEDED,
        }, (offset, limit)
        assert [r["id"] for r in body["results"]] == ids[offset : offset + limit]
        assert len(body["results"]) == returned


async def test_empty_values_mean_absent(client: Client) -> None:
    response = await client.get(
        "/v1/applicants?offset=&limit=&updated_at_gte=&updated_at_lte=&last_seen_gte="
        "&last_seen_lte=&integration_id=&integration_vendor=&property_id=&x_property_id="
        "&email_1=&phone_1=&x_id="
    )
    assert response.status_code == 200, response.text
    meta = contract_meta(response.json())
    assert meta == {
        "offset": 0,
        "limit": 100,
        "orderBy": [{"field": "created_at", "direction": "desc"}],
        "hasMore": True,
        "total": SEEDED,
    }


BAD_PAGING = (
    ("limit", "0"),
    ("limit", "251"),
    ("limit", "-1"),
    ("limit", "1.5"),
    ("limit", "abc"),
    ("limit", " 5"),
    ("limit", "1e2"),
    ("limit", "0x10"),
    ("limit", "\u0665"),  # ARABIC-INDIC DIGIT FIVE is not an integer here
    ("limit", "9" * 4000),
    ("offset", "-1"),
    ("offset", "1.5"),
    ("offset", "abc"),
    ("offset", str(2**63)),
    ("offset", "9" * 4000),
    ("offset", "\uff11"),  # FULLWIDTH DIGIT ONE
)


async def test_offset_and_limit_out_of_rule_are_400(client: Client) -> None:
    for name, value in BAD_PAGING:
        assert_invalid(await client.get("/v1/applicants", params={name: value}), name, value)


async def test_limit_400_message_states_the_rule(client: Client) -> None:
    response = await client.get("/v1/applicants?limit=0")
    assert response.json() == {
        "error": {
            "code": "invalid_request",
            "message": "limit must be an integer between 1 and 250",
            "details": {"parameter": "limit", "value": "0"},
        }
    }


async def test_offset_accepts_the_largest_64_bit_integer(client: Client) -> None:
    response = await client.get("/v1/applicants", params={"offset": str(2**63 - 1)})
    assert response.status_code == 200
    body = response.json()
    assert body["results"] == []
    assert body["meta"]["offset"] == 2**63 - 1
    assert body["meta"]["hasMore"] is False
    assert body["meta"]["total"] == SEEDED


async def test_total_and_has_more_follow_the_filters(client: Client, records: list[Record]) -> None:
    expected = sorted(r["id"] for r in records if r["integration_id"] == "int_mri_02")
    assert 10 < len(expected) < 250
    first = await client.get(
        "/v1/applicants",
        params={"integration_id": "int_mri_02", "limit": "10", "order-by": "id"},
    )
    meta = first.json()["meta"]
    assert meta["total"] == len(expected)
    assert meta["hasMore"] is True
    assert [r["id"] for r in first.json()["results"]] == expected[:10]
    last = await client.get(
        "/v1/applicants",
        params={
            "integration_id": "int_mri_02",
            "limit": "10",
            "offset": str(len(expected) - 10),
            "order-by": "id",
        },
    )
    assert last.json()["meta"]["hasMore"] is False
    assert [r["id"] for r in last.json()["results"]] == expected[-10:]


# --- order-by ---------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["asc", "desc"])
async def test_every_sortable_field_orders_all_pages(
    client: Client, records: list[Record], direction: str
) -> None:
    for field in SORTABLE:
        results = await every_page(client, {"order-by": f"{field}:{direction}"})
        assert [r["id"] for r in results] == expected_ids(records, [(field, direction)]), field
        assert len(results) == SEEDED


MULTI_KEY_ORDERS = (
    [("last_name", "asc"), ("first_name", "desc")],
    [("state", "desc"), ("city", "asc"), ("zip", "desc"), ("created_at", "asc")],
    [("integration_vendor", "asc"), ("x_id", "desc")],
    [("middle_name", "desc"), ("id", "asc")],
    [("x_id", "asc"), ("integration_id", "desc")],
)


async def test_multi_key_orderings(client: Client, records: list[Record]) -> None:
    for order in MULTI_KEY_ORDERS:
        text = ",".join(f"{field}:{direction}" for field, direction in order)
        results = await every_page(client, {"order-by": text})
        assert [r["id"] for r in results] == expected_ids(records, order), text
        response = await client.get("/v1/applicants", params={"order-by": text, "limit": "1"})
        assert response.json()["meta"]["orderBy"] == [
            {"field": field, "direction": direction} for field, direction in order
        ]


async def test_direction_is_case_insensitive_and_defaults_to_asc(
    client: Client, records: list[Record]
) -> None:
    response = await client.get(
        "/v1/applicants", params={"order-by": "last_name:DESC,first_name,city:Asc", "limit": "250"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    order = [("last_name", "desc"), ("first_name", "asc"), ("city", "asc")]
    assert body["meta"]["orderBy"] == [{"field": f, "direction": d} for f, d in order]
    assert [r["id"] for r in body["results"]] == expected_ids(records, order)[:250]


async def test_empty_order_by_means_no_sorting_in_id_order(
    client: Client, records: list[Record]
) -> None:
    response = await client.get("/v1/applicants?order-by=&limit=250")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["meta"]["orderBy"] == []
    assert [r["id"] for r in body["results"]] == sorted(r["id"] for r in records)[:250]


async def test_nulls_first_ascending_last_descending(client: Client, records: list[Record]) -> None:
    nulls = sum(1 for r in records if r["middle_name"] is None)
    assert 0 < nulls < 250
    ascending = (await client.get("/v1/applicants?order-by=middle_name&limit=250")).json()
    assert [r["middle_name"] for r in ascending["results"][:nulls]] == [None] * nulls
    assert ascending["results"][nulls]["middle_name"] is not None
    descending = await every_page(client, {"order-by": "middle_name:desc"})
    assert [r["middle_name"] for r in descending[-nulls:]] == [None] * nulls
    assert descending[-nulls - 1]["middle_name"] is not None


@pytest.mark.parametrize("direction", ["asc", "desc"])
async def test_hidden_id_tiebreak_follows_the_last_key(
    empty_client: Client, db: sqlite3.Connection, direction: str
) -> None:
    # Five records on one instant, two on another: only the id can order them.
    same = "2024-05-05T05:05:05.005Z"
    write_records(
        db,
        [
            applicant(
                n, id=f"app_tie_{n}", created_at=same if n < 5 else "2024-06-06T00:00:00.000Z"
            )
            for n in (3, 0, 4, 1, 2, 6, 5)
        ],
    )
    response = await empty_client.get(
        "/v1/applicants", params={"order-by": f"created_at:{direction}"}
    )
    ids = [r["id"] for r in response.json()["results"]]
    tied = [f"app_tie_{n}" for n in range(5)]
    later = ["app_tie_5", "app_tie_6"]
    if direction == "asc":
        assert ids == [*tied, *later]
    else:
        assert ids == [*reversed(later), *reversed(tied)]
    assert response.json()["meta"]["orderBy"] == [{"field": "created_at", "direction": direction}]


async def test_tiebreak_uses_the_last_key_not_the_first(
    empty_client: Client, db: sqlite3.Connection
) -> None:
    write_records(db, [applicant(n, id=f"app_t_{n}", state="TX", city="Austin") for n in range(4)])
    response = await empty_client.get("/v1/applicants?order-by=state:desc,city:asc")
    assert [r["id"] for r in response.json()["results"]] == [f"app_t_{n}" for n in range(4)]
    response = await empty_client.get("/v1/applicants?order-by=state:asc,city:desc")
    assert [r["id"] for r in response.json()["results"]] == [f"app_t_{n}" for n in (3, 2, 1, 0)]


async def test_default_order_breaks_ties_by_id_descending(
    empty_client: Client, db: sqlite3.Connection
) -> None:
    write_records(db, [applicant(n, id=f"app_d_{n}") for n in (1, 0, 2)])
    response = await empty_client.get("/v1/applicants")
    assert [r["id"] for r in response.json()["results"]] == ["app_d_2", "app_d_1", "app_d_0"]


async def test_strings_compare_by_code_point(empty_client: Client, db: sqlite3.Connection) -> None:
    names = ["Zoë", "zoe", "Zoe", "Émile", "Ümit", "adam", "Adam", "Łukasz", "Ærø"]
    write_records(db, [applicant(n, first_name=name) for n, name in enumerate(names)])
    response = await empty_client.get("/v1/applicants?order-by=first_name")
    assert [r["first_name"] for r in response.json()["results"]] == sorted(names)


async def test_four_keys_are_accepted(client: Client) -> None:
    response = await client.get("/v1/applicants?order-by=state,city,zip,last_name")
    assert response.status_code == 200
    assert len(response.json()["meta"]["orderBy"]) == 4


BAD_ORDER_BY = (
    "state,city,zip,last_name,first_name",  # five keys
    "last_name,last_name:desc",  # a field twice
    "id,id",
    "unknown_field",
    "phone_1",  # a filter, not a sortable field
    "body",
    "content_hash",
    "CREATED_AT",  # field names are case-sensitive, only directions are not
    "created_at:up",
    "created_at:",
    "created_at:asc:desc",
    ":asc",
    ",",
    "created_at,",
    "created_at, last_name",
    "created_at;DROP TABLE applicants",
    "created_at desc",
)


async def test_order_by_out_of_rule_is_400(client: Client) -> None:
    for value in BAD_ORDER_BY:
        response = await client.get("/v1/applicants", params={"order-by": value})
        assert_invalid(response, "order-by", value)


# --- date bounds ------------------------------------------------------------------------


def _pivot(records: list[Record], field: str) -> Record:
    return sorted(records, key=lambda r: r[field])[len(records) // 2]


def _written(moment: datetime, offset: timedelta, sep: str = "") -> str:
    """The instant as local time at `offset`, with the offset written as ±HH:MM."""
    local = moment.astimezone(timezone(offset))
    sign = "-" if offset < timedelta(0) else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    text = local.strftime("%Y-%m-%dT%H:%M:%S.%f")
    return f"{text}{sep or sign}{minutes // 60:02d}:{minutes % 60:02d}"


async def test_same_instant_in_every_accepted_form_gives_the_same_page(
    client: Client, records: list[Record]
) -> None:
    pivot = _pivot(records, "updated_at")
    moment = instant(pivot["updated_at"])
    expected = sorted(r["id"] for r in records if instant(r["updated_at"]) >= moment)
    forms = [
        pivot["updated_at"],  # 2023-05-06T07:08:09.123Z
        pivot["updated_at"].replace("Z", "z"),
        pivot["updated_at"].replace("Z", "+00:00"),
        pivot["updated_at"].replace("Z", "-00:00"),
        pivot["updated_at"][:-1],  # no offset = UTC
        pivot["updated_at"][:-1] + "000",  # microseconds
        pivot["updated_at"][:-1] + "000999",  # nanoseconds, truncated
        _written(moment, timedelta(hours=5, minutes=30)),
        _written(moment, timedelta(hours=-8)),
        _written(moment, timedelta(hours=23, minutes=59)),
        _written(moment, timedelta(hours=5, minutes=30), sep=" "),  # '+' sent as a space
    ]
    for form in forms:
        response = await client.get(
            "/v1/applicants", params={"updated_at_gte": form, "order-by": "id", "limit": "250"}
        )
        assert response.status_code == 200, (form, response.text)
        body = response.json()
        assert body["meta"]["total"] == len(expected), form
        assert [r["id"] for r in body["results"]] == expected[:250], form


async def test_unencoded_plus_in_the_query_string_reads_as_plus(
    client: Client, records: list[Record]
) -> None:
    pivot = _pivot(records, "last_seen")
    moment = instant(pivot["last_seen"])
    expected = sum(1 for r in records if instant(r["last_seen"]) <= moment)
    written = _written(moment, timedelta(hours=2))
    assert "+02:00" in written
    response = await client.get(f"/v1/applicants?last_seen_lte={written}")  # raw '+'
    assert response.status_code == 200, response.text
    assert response.json()["meta"]["total"] == expected


async def test_bounds_are_inclusive_to_the_microsecond(
    client: Client, records: list[Record]
) -> None:
    pivot = _pivot(records, "updated_at")
    text = pivot["updated_at"]  # ...SS.mmmZ
    moment = instant(text)
    micro = timedelta(microseconds=1)

    async def ids(params: dict[str, str]) -> list[str]:
        response = await client.get("/v1/applicants", params={**params, "limit": "250"})
        assert response.status_code == 200, response.text
        assert response.json()["meta"]["total"] <= 250
        return [r["id"] for r in response.json()["results"]]

    assert await ids({"updated_at_gte": text, "updated_at_lte": text}) == [pivot["id"]]
    just_after = (moment + micro).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    just_before = (moment - micro).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    after = await ids({"updated_at_gte": just_after, "updated_at_lte": "2030-01-01"})
    assert pivot["id"] not in after
    assert len(after) == sum(1 for r in records if instant(r["updated_at"]) > moment)
    before = await ids({"updated_at_lte": just_before, "updated_at_gte": "2019-01-01"})
    assert pivot["id"] not in before
    assert len(before) == sum(1 for r in records if instant(r["updated_at"]) < moment)


@pytest.mark.parametrize("field", ["updated_at", "last_seen"])
async def test_date_only_bound_is_midnight_utc_inclusive(
    client: Client, records: list[Record], field: str
) -> None:
    midnight = next(r for r in records if r[field].endswith("T00:00:00.000Z"))
    day = midnight[field][:10]
    moment = instant(midnight[field])
    response = await client.get(f"/v1/applicants?{field}_lte={day}&limit=250&order-by=id")
    body = response.json()
    expected = sorted(r["id"] for r in records if instant(r[field]) <= moment)
    assert body["meta"]["total"] == len(expected)
    assert midnight["id"] in expected
    assert [r["id"] for r in body["results"]] == expected[:250]
    response = await client.get(f"/v1/applicants?{field}_gte={day}&limit=250&order-by=id")
    expected = sorted(r["id"] for r in records if instant(r[field]) >= moment)
    assert response.json()["meta"]["total"] == len(expected)
    assert [r["id"] for r in response.json()["results"]] == expected[:250]


async def test_all_four_bounds_together(client: Client, records: list[Record]) -> None:
    low, high = instant("2021-06-01T00:00:00Z"), instant("2024-06-01T12:30:00Z")
    seen_low, seen_high = instant("2021-01-01T00:00:00Z"), instant("2025-01-01T00:00:00Z")
    expected = sorted(
        r["id"]
        for r in records
        if low <= instant(r["updated_at"]) <= high
        and seen_low <= instant(r["last_seen"]) <= seen_high
    )
    assert 0 < len(expected) < SEEDED
    response = await client.get(
        "/v1/applicants",
        params={
            "updated_at_gte": "2021-06-01",
            "updated_at_lte": "2024-06-01T14:30+02:00",
            "last_seen_gte": "2020-12-31T19:00:00-05:00",
            "last_seen_lte": "2025-01-01T00:00:00.000000Z",
            "order-by": "id",
            "limit": "250",
        },
    )
    assert response.json()["meta"]["total"] == len(expected)
    assert [r["id"] for r in response.json()["results"]] == expected[:250]


async def test_gte_after_lte_is_valid_and_matches_nothing(client: Client) -> None:
    response = await client.get(
        "/v1/applicants?updated_at_gte=2024-01-02&updated_at_lte=2024-01-01"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["results"] == []
    assert body["meta"]["total"] == 0
    assert body["meta"]["hasMore"] is False


BAD_INSTANTS = (
    "yesterday",
    "2024-13-01",
    "2024-02-30",
    "2023-02-29",
    "2024-1-1",
    "20240101",
    "2024-01-01T24:00",
    "2024-01-01T12:60",
    "2024-01-01T12:00:60",
    "2024-01-01T12",
    "2024-01-01T12:00:00.",
    "2024-01-01T12:00+24:00",
    "2024-01-01T12:00+05",
    "2024-01-01T12:00+0530",
    "2024-01-01T12:00:00ZZ",
    "10000-01-01",
    "2024-01-01T\uff11\uff12:00",  # fullwidth digits are not ISO 8601
    "\uff12\uff10\uff12\uff14-01-01",
    "2024-01-01\x00",
)


@pytest.mark.parametrize(
    "name", ["updated_at_gte", "updated_at_lte", "last_seen_gte", "last_seen_lte"]
)
async def test_invalid_instant_is_400(client: Client, name: str) -> None:
    for value in BAD_INSTANTS:
        assert_invalid(await client.get("/v1/applicants", params={name: value}), name, value)


# --- equality filters -------------------------------------------------------------------


def _most_common(records: list[Record], field: str) -> str:
    value: str = Counter(r[field] for r in records).most_common(1)[0][0]
    return value


@pytest.mark.parametrize(
    ("name", "pick"),
    [
        ("integration_id", lambda records: "int_entrata_01"),
        ("integration_vendor", lambda records: "MRI"),
        ("property_id", lambda records: _most_common(records, "property_id")),
        ("x_property_id", lambda records: _most_common(records, "x_property_id")),
    ],
)
async def test_exact_match_filters(
    client: Client,
    records: list[Record],
    name: str,
    pick: Callable[[list[Record]], str],
) -> None:
    value = pick(records)
    expected = sorted(r["id"] for r in records if r[name] == value)
    assert 1 < len(expected) < SEEDED
    response = await client.get(
        "/v1/applicants", params={name: value, "order-by": "id", "limit": "250"}
    )
    assert response.json()["meta"]["total"] == len(expected)
    assert [r["id"] for r in response.json()["results"]] == expected[:250]
    # exact, not prefix and not case-folded
    for near in (value.lower() if value != value.lower() else value.upper(), value[:-1]):
        response = await client.get("/v1/applicants", params={name: near})
        assert response.json()["meta"]["total"] == sum(1 for r in records if r[name] == near)


async def test_filters_combine_with_and(client: Client, records: list[Record]) -> None:
    expected = sorted(
        r["id"]
        for r in records
        if r["integration_vendor"] == "MRI" and r["updated_at"] >= "2023-01-01"
    )
    response = await client.get(
        "/v1/applicants",
        params={"integration_vendor": "MRI", "updated_at_gte": "2023-01-01", "order-by": "id"},
    )
    assert response.json()["meta"]["total"] == len(expected)
    assert [r["id"] for r in response.json()["results"]] == expected[:100]


async def test_filter_matching_nothing(client: Client) -> None:
    response = await client.get("/v1/applicants?integration_id=int_nobody")
    assert response.status_code == 200
    assert response.json() == {
        "meta": {
            "offset": 0,
            "limit": 100,
            "orderBy": [{"field": "created_at", "direction": "desc"}],
            "hasMore": False,
            "total": 0,
        },
        "results": [],
    }


async def test_email_ignores_ascii_case_only(empty_client: Client, db: sqlite3.Connection) -> None:
    write_records(
        db,
        [
            applicant(1, email_1="Jose.Perez@Example.com"),
            applicant(2, email_1="josé.pérez@example.com"),
            applicant(3, email_1="JOSÉ.PÉREZ@EXAMPLE.COM"),
            applicant(4, email_1="jose.perez@example.com.evil"),
            applicant(5, email_1=None),
        ],
    )

    async def matched(email: str) -> list[str]:
        response = await empty_client.get(
            "/v1/applicants", params={"email_1": email, "order-by": "id"}
        )
        assert response.status_code == 200
        return [r["id"] for r in response.json()["results"]]

    assert await matched("jose.perez@example.com") == ["app_hand_001"]
    assert await matched("JOSE.PEREZ@EXAMPLE.COM") == ["app_hand_001"]
    # ASCII letters fold, the accented ones do not
    assert await matched("JOSé.PéREZ@EXAMPLE.COM") == ["app_hand_002"]
    assert await matched("josÉ.pÉrez@example.com") == ["app_hand_003"]
    assert await matched("jose.perez") == []


async def test_email_compares_past_a_nul_character(
    empty_client: Client, db: sqlite3.Connection
) -> None:
    # SQLite's NOCASE stops comparing at NUL: "\x00À" and "\x00à" would be equal to it.
    write_records(db, [applicant(1, email_1="\x00À"), applicant(2, email_1="\x00a@b")])

    async def matched(email: str) -> list[str]:
        response = await empty_client.get("/v1/applicants", params={"email_1": email})
        assert response.status_code == 200
        return [r["id"] for r in response.json()["results"]]

    assert await matched("\x00À") == ["app_hand_001"]
    assert await matched("\x00à") == []
    assert await matched("\x00A@B") == ["app_hand_002"]
    assert await matched("\x00x@b") == []


async def test_phone_matches_ten_digits_with_or_without_country_code(
    empty_client: Client, db: sqlite3.Connection
) -> None:
    write_records(
        db,
        [
            applicant(1, phone_1="(512) 555-0100"),
            applicant(2, phone_1="+1 512 555 0100"),
            applicant(3, phone_1="15125550100"),
            applicant(4, phone_1="512.555.0100 ext 7"),  # 11 digits, not a country code
            applicant(5, phone_1="+44 512 555 0100"),
            applicant(6, phone_1="2125550100"),
            applicant(7, phone_1="5125550100"),
            applicant(8, phone_1=None),
        ],
    )
    response = await empty_client.get("/v1/applicants?phone_1=5125550100&order-by=id")
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == [
        "app_hand_001",
        "app_hand_002",
        "app_hand_003",
        "app_hand_007",
    ]
    assert response.json()["meta"]["total"] == 4


async def test_phone_must_be_exactly_ten_digits(client: Client) -> None:
    for value in ("512555010", "51255501000", "15125550100", "(512) 555-0100", "512-555-0100",
                  "abcdefghij", " 5125550100", "\uff15125550100"):  # fmt: skip
        response = await client.get("/v1/applicants", params={"phone_1": value})
        assert_invalid(response, "phone_1", value)


async def test_phone_filter_on_seeded_data(client: Client, records: list[Record]) -> None:
    def digits(phone: str | None) -> str:
        return "".join(ch for ch in phone or "" if ch.isdigit())

    record = next(r for r in records if digits(r["phone_1"]).startswith("1"))
    ten = digits(record["phone_1"])[-10:]
    expected = sorted(r["id"] for r in records if digits(r["phone_1"]) in (ten, "1" + ten))
    response = await client.get("/v1/applicants", params={"phone_1": ten, "order-by": "id"})
    assert [r["id"] for r in response.json()["results"]] == expected
    assert record["id"] in expected


async def test_x_id_with_integration_and_property_finds_one_record(
    client: Client, records: list[Record]
) -> None:
    target = records[42]
    shared = [r for r in records if r["x_id"] == target["x_id"]]
    assert len(shared) == 2  # source systems reuse ids; the seed makes pairs
    response = await client.get(
        "/v1/applicants",
        params={
            "x_id": target["x_id"],
            "integration_id": target["integration_id"],
            "x_property_id": target["x_property_id"],
        },
    )
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == [target["id"]]
    assert response.json()["results"][0] == target


async def test_x_id_requires_integration_id_and_x_property_id(client: Client) -> None:
    for others in ({}, {"integration_id": "int_mri_01"}, {"x_property_id": "MR-P001"},
                   {"integration_id": "", "x_property_id": "MR-P001"}):  # fmt: skip
        response = await client.get("/v1/applicants", params={"x_id": "S7-0000001", **others})
        assert_invalid(response, "x_id", "S7-0000001")
        for name in ("integration_id", "x_property_id"):
            assert name in response.json()["error"]["message"]


# --- unknown and repeated parameters ----------------------------------------------------


async def test_unknown_parameter_is_400(client: Client) -> None:
    for name in ("foo", "Limit", "OFFSET", "order_by", "orderBy", "sort", "page", "id",
                 "phone_2", "limit ", "updated_at_gt"):  # fmt: skip
        assert_invalid(await client.get("/v1/applicants", params={name: "1"}), name, "1")


REPEATED = (
    "limit=1&limit=1",
    "limit=1&limit=2",
    "limit=&limit=5",
    "order-by=id&order-by=",
    "integration_id=a&integration_id=b",
    "updated_at_gte=2024-01-01&updated_at_gte=2024-01-01",
)


async def test_repeated_parameter_is_400(client: Client) -> None:
    for query in REPEATED:
        response = await client.get(f"/v1/applicants?{query}")
        name = query.split("=")[0]
        assert response.status_code == 400, query
        assert response.json()["error"]["code"] == "invalid_request"
        assert response.json()["error"]["details"]["parameter"] == name
        assert name in response.json()["error"]["message"]


# --- the single-record route ------------------------------------------------------------


async def test_single_record_envelope(client: Client, records: list[Record]) -> None:
    target = records[7]
    response = await client.get(f"/v1/applicants/{target['id']}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {
        "meta": {
            "offset": 0,
            "limit": 100,
            "orderBy": [{"field": "created_at", "direction": "desc"}],
            "hasMore": False,
            "total": 1,
        },
        "results": target,
    }


async def test_single_record_echoes_validated_parameters(
    client: Client, records: list[Record]
) -> None:
    target = records[8]
    response = await client.get(
        f"/v1/applicants/{target['id']}?offset=5&limit=7&order-by=last_name:DESC,first_name"
    )
    assert response.status_code == 200
    assert contract_meta(response.json()) == {
        "offset": 5,
        "limit": 7,
        "orderBy": [
            {"field": "last_name", "direction": "desc"},
            {"field": "first_name", "direction": "asc"},
        ],
        "hasMore": False,
        "total": 1,
    }
    assert response.json()["results"] == target
    empty = await client.get(f"/v1/applicants/{target['id']}?order-by=")
    assert empty.json()["meta"]["orderBy"] == []


async def test_single_record_inside_and_outside_date_bounds(
    client: Client, records: list[Record]
) -> None:
    target = records[9]
    updated, seen = target["updated_at"], target["last_seen"]
    inside = await client.get(
        f"/v1/applicants/{target['id']}",
        params={
            "updated_at_gte": updated,
            "updated_at_lte": updated,
            "last_seen_gte": seen,
            "last_seen_lte": seen,
        },
    )
    assert inside.status_code == 200
    assert inside.json()["results"] == target
    unknown = await client.get("/v1/applicants/app_does_not_exist")
    assert unknown.status_code == 404
    later = (instant(updated) + timedelta(milliseconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for params in (
        {"updated_at_gte": later},
        {"updated_at_lte": "2000-01-01"},
        {"last_seen_gte": "2099-01-01"},
        {"last_seen_lte": "2000-01-01T00:00Z"},
    ):
        outside = await client.get(f"/v1/applicants/{target['id']}", params=params)
        assert outside.status_code == 404, params
        assert outside.json() == unknown.json()


async def test_list_only_filters_are_unknown_on_the_single_route(
    client: Client, records: list[Record]
) -> None:
    for name in LIST_ONLY_FILTERS:
        response = await client.get(f"/v1/applicants/{records[0]['id']}", params={name: "x"})
        assert_invalid(response, name, "x")


async def test_single_route_validates_its_parameters(client: Client, records: list[Record]) -> None:
    for name, value in (("limit", "0"), ("limit", "251"), ("offset", "-1"),
                        ("offset", str(2**63)), ("order-by", "nope"),
                        ("updated_at_gte", "2024-02-30"), ("last_seen_lte", "soon"),
                        ("foo", "bar")):  # fmt: skip
        response = await client.get(f"/v1/applicants/{records[0]['id']}", params={name: value})
        assert_invalid(response, name, value)


async def test_single_route_rejects_repeated_parameters(
    client: Client, records: list[Record]
) -> None:
    response = await client.get(f"/v1/applicants/{records[0]['id']}?limit=5&limit=5")
    assert_invalid(response, "limit", "5")


async def test_single_route_empty_values_mean_absent(client: Client, records: list[Record]) -> None:
    response = await client.get(
        f"/v1/applicants/{records[0]['id']}?offset=&limit=&updated_at_gte=&last_seen_lte="
    )
    assert response.status_code == 200
    assert response.json()["meta"]["limit"] == 100


# --- the applicant JSON -----------------------------------------------------------------

APPLICANT_KEYS = {
    "id", "created_at", "updated_at", "last_seen", "x_id", "x_property_id", "x_lead_id",
    "x_unit_id", "x_unit_id_preferred", "x_lease_id", "property_id", "unit_id_preferred",
    "integration_id", "integration_vendor", "first_name", "middle_name", "last_name",
    "email_1", "email_2", "phone_1", "phone_1_type", "phone_2", "phone_2_type",
    "date_of_birth", "address_1", "address_1_alternate", "address_2", "address_2_alternate",
    "city", "city_alternate", "state", "state_alternate", "zip", "zip_alternate", "country",
    "country_alternate", "notes", "type_normalized", "type_raw", "custom_data",
    "applications", "pets", "screenings", "self_reported_income",
}  # fmt: skip
APPLICATION_KEYS = {
    "applicant_id", "application_id", "status_raw", "status_normalized", "status", "custom_data",
}  # fmt: skip
PET_KEYS = {
    "id", "created_at", "updated_at", "last_seen", "x_id", "age_in_years", "breed", "color",
    "gender_raw", "is_declawed", "is_fixed", "is_service_animal", "is_trained",
    "is_vaccinated", "name", "notes", "type", "weight_in_pounds", "custom_data",
}  # fmt: skip
SCREENING_KEYS = {"id", "created_at", "last_seen", "x_id", "status_raw", "screening_date"}
INCOME_KEYS = {"amount_in_cents", "amount_raw", "type_normalized", "type_raw"}
SERVED_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


async def test_every_served_record_has_every_field_in_the_served_forms(client: Client) -> None:
    results = await every_page(client, {"order-by": "id"}, limit=250)
    assert len(results) == SEEDED
    for record in results:
        assert set(record) == APPLICANT_KEYS
        for name in ("created_at", "updated_at", "last_seen"):
            assert SERVED_INSTANT.fullmatch(record[name]), record[name]
        assert record["date_of_birth"] is None or re.fullmatch(
            r"\d{4}-\d{2}-\d{2}", record["date_of_birth"]
        )
        assert isinstance(record["custom_data"], dict)
        for application in record["applications"]:
            assert set(application) == APPLICATION_KEYS
            assert application["applicant_id"] == record["x_id"]
        for pet in record["pets"]:
            assert set(pet) == PET_KEYS
            for name in ("created_at", "updated_at", "last_seen"):
                assert SERVED_INSTANT.fullmatch(pet[name])
        for screening in record["screenings"]:
            assert set(screening) == SCREENING_KEYS
            for name in ("created_at", "last_seen", "screening_date"):
                assert SERVED_INSTANT.fullmatch(screening[name])
        for income in record["self_reported_income"]:
            assert set(income) == INCOME_KEYS


async def test_minimal_record_is_served_with_nulls_and_empty_collections(
    empty_client: Client, db: sqlite3.Connection
) -> None:
    custom = {"b": [1, 2.5, None, {"z": "ü"}], "a": {"nested": True}}
    write_records(
        db,
        [
            applicant(
                1,
                created_at="2024-03-01T12:34:56.789999+02:00",  # sub-ms digits truncated
                updated_at="2024-03-01",
                last_seen="2024-03-01T23:59 05:30",
                custom_data=custom,
            )
        ],
    )
    response = await empty_client.get("/v1/applicants/app_hand_001")
    record = response.json()["results"]
    assert set(record) == APPLICANT_KEYS
    assert record["created_at"] == "2024-03-01T10:34:56.789Z"
    assert record["updated_at"] == "2024-03-01T00:00:00.000Z"
    assert record["last_seen"] == "2024-03-01T18:29:00.000Z"
    assert record["custom_data"] == custom
    for name in ("x_unit_id_preferred", "unit_id_preferred", "applications", "pets",
                 "screenings", "self_reported_income"):  # fmt: skip
        assert record[name] == [], name
    nulls = APPLICANT_KEYS - {
        "id", "created_at", "updated_at", "last_seen", "x_id", "x_property_id", "property_id",
        "integration_id", "integration_vendor", "custom_data", "x_unit_id_preferred",
        "unit_id_preferred", "applications", "pets", "screenings", "self_reported_income",
    }  # fmt: skip
    assert {name: record[name] for name in nulls} == dict.fromkeys(nulls)
