"""Unit tests of leasestar/applicants/query.py: the query string to a validated query.

Expected values are written out from the contract (CONTRACT.md, "Query parameters"),
instants are computed with `datetime`, never with the code under test.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leasestar.applicants.ordering import (
    SORTABLE_FIELDS,
)
from leasestar.applicants.query import (
    ApplicantQuery,
    parse_list_query,
    parse_order_by,
    parse_record_query,
)
from leasestar.applicants.records import SortKey
from leasestar.errors import InvalidParameter
from tests.contract import DATE_BOUNDS, LIST_ONLY_FILTERS, SORTABLE

HOSTILE = "x' OR 1=1 --"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


def refusal(pairs: list[tuple[str, str]], *, record: bool = False) -> InvalidParameter:
    parse = parse_record_query if record else parse_list_query
    with pytest.raises(InvalidParameter) as caught:
        parse(pairs)
    return caught.value


# --- parse_list_query / parse_record_query: what is accepted ------------------------


@pytest.mark.parametrize("parse", [parse_list_query, parse_record_query])
def test_no_parameters_give_the_contract_defaults(parse: object) -> None:
    assert parse([]) == ApplicantQuery()  # type: ignore[operator]
    query = parse_list_query([])
    assert (query.offset, query.limit) == (0, 100)
    assert query.order_by == (SortKey("created_at", "desc"),)


def test_empty_values_are_absent_except_order_by() -> None:
    query = parse_list_query(
        [(name, "") for name in ("offset", "limit", *DATE_BOUNDS, *LIST_ONLY_FILTERS, "order-by")]
    )
    assert query == ApplicantQuery(order_by=())


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("offset", "0", 0),
        ("offset", "17", 17),
        ("offset", str(2**63 - 1), 2**63 - 1),
        ("limit", "1", 1),
        ("limit", "250", 250),
    ],
)
def test_integers_in_range_are_taken(name: str, text: str, value: int) -> None:
    assert getattr(parse_list_query([(name, text)]), name) == value
    assert getattr(parse_record_query([(name, text)]), name) == value


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("", ()),
        ("created_at", (("created_at", "asc"),)),
        ("created_at:desc", (("created_at", "desc"),)),
        ("last_name:DESC,first_name:Asc", (("last_name", "desc"), ("first_name", "asc"))),
        ("id:dEsC", (("id", "desc"),)),
        (
            "city,state:desc,zip,date_of_birth:asc",
            (("city", "asc"), ("state", "desc"), ("zip", "asc"), ("date_of_birth", "asc")),
        ),
    ],
)
def test_order_by_is_read_as_keys_with_lower_case_directions(
    text: str, keys: tuple[tuple[str, str], ...]
) -> None:
    expected = tuple(SortKey(name, direction) for name, direction in keys)  # type: ignore[arg-type]
    assert parse_order_by(text) == expected
    assert parse_list_query([("order-by", text)]).order_by == expected
    assert parse_record_query([("order-by", text)]).order_by == expected


@pytest.mark.parametrize("name", SORTABLE)
@pytest.mark.parametrize("direction", ["asc", "desc"])
def test_every_contract_field_is_sortable_both_ways(name: str, direction: str) -> None:
    assert parse_order_by(f"{name}:{direction}") == (SortKey(name, direction),)  # type: ignore[arg-type]


def test_the_sortable_whitelist_is_the_contracts_list() -> None:
    assert tuple(SORTABLE_FIELDS) == SORTABLE


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2024-03-01", datetime(2024, 3, 1, tzinfo=UTC)),
        ("2024-03-01T12:34", datetime(2024, 3, 1, 12, 34, tzinfo=UTC)),
        ("2024-03-01T12:34:56", datetime(2024, 3, 1, 12, 34, 56, tzinfo=UTC)),
        ("2024-03-01T12:34:56Z", datetime(2024, 3, 1, 12, 34, 56, tzinfo=UTC)),
        ("2024-03-01T12:34:56.7Z", datetime(2024, 3, 1, 12, 34, 56, 700_000, tzinfo=UTC)),
        (
            "2024-03-01T12:34:56.789+02:00",
            datetime(2024, 3, 1, 12, 34, 56, 789_000, tzinfo=timezone(timedelta(hours=2))),
        ),
        # A space before the offset is an unencoded '+'.
        (
            "2024-03-01T12:34:56.789 02:00",
            datetime(2024, 3, 1, 12, 34, 56, 789_000, tzinfo=timezone(timedelta(hours=2))),
        ),
        (
            "2024-03-01T00:00-05:30",
            datetime(2024, 3, 1, tzinfo=timezone(-timedelta(hours=5, minutes=30))),
        ),
        # Digits past the microsecond are truncated, not rounded.
        ("2024-03-01T12:34:56.123456999Z", datetime(2024, 3, 1, 12, 34, 56, 123456, tzinfo=UTC)),
        # The contract sets no length on the fraction.
        (
            "2024-03-01T12:34:56.065123456789012345678901234567Z",
            datetime(2024, 3, 1, 12, 34, 56, 65123, tzinfo=UTC),
        ),
        ("1969-12-31T23:59:59.999999Z", datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        ("2000-02-29", datetime(2000, 2, 29, tzinfo=UTC)),
    ],
)
@pytest.mark.parametrize("name", DATE_BOUNDS)
def test_date_bounds_are_instants_to_the_microsecond(
    name: str, text: str, moment: datetime
) -> None:
    assert parse_list_query([(name, text)]).value(name) == micros(moment)
    assert parse_record_query([(name, text)]).value(name) == micros(moment)


def test_gte_after_lte_is_valid() -> None:
    query = parse_list_query([("updated_at_gte", "2025-01-02"), ("updated_at_lte", "2025-01-01")])
    lower, upper = query.value("updated_at_gte"), query.value("updated_at_lte")
    assert isinstance(lower, int)
    assert isinstance(upper, int)
    assert lower > upper


def test_list_filters_are_taken_exactly_as_given() -> None:
    pairs = [
        ("integration_id", HOSTILE),
        ("integration_vendor", "YARDI"),
        ("property_id", "prop é 😀"),
        ("x_property_id", " spaced "),
        ("x_id", "A"),
        ("email_1", "Ann@Example.COM"),
        ("phone_1", "5551234567"),
    ]
    query = parse_list_query(pairs)
    assert {name: query.value(name) for name, _ in pairs} == dict(pairs)


# --- what is refused, and how the refusal reads -------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("limit", "0"),
        ("limit", "251"),
        ("limit", "-1"),
        ("limit", "1.0"),
        ("limit", "1e2"),
        ("limit", " 1"),
        ("limit", "+1"),
        ("limit", "0x10"),
        ("limit", "ten"),
        ("limit", "\u0661\u0660"),  # Arabic-Indic digits: int() would take them
        ("limit", "\uff11\uff10"),  # fullwidth digits
        ("limit", "9" * 5000),  # int() of this many digits raises
        ("offset", "-1"),
        ("offset", str(2**63)),
        ("offset", "1 "),
        ("offset", "²"),
    ],
)
def test_integers_out_of_rule_name_parameter_value_and_range(name: str, text: str) -> None:
    low, high = (1, 250) if name == "limit" else (0, 2**63 - 1)
    for record in (False, True):
        error = refusal([(name, text)], record=record)
        assert (error.parameter, error.value) == (name, text)
        assert error.message == f"{name} must be an integer between {low} and {high}"


@pytest.mark.parametrize(
    "text",
    [
        "nope",
        "CREATED_AT",  # fields are case-sensitive; only the direction is not
        "created_at:up",
        "created_at:ascending",
        "created_at:",
        ":asc",
        "created_at:asc:desc",
        "created_at,",
        ",created_at",
        "created_at,,id",
        "created_at,created_at:desc",  # no field twice
        "city,state,zip,x_id,id",  # at most four keys
        "phone_1",  # filterable, not sortable
        "body",  # a column, not an API field
        "change_seq",
        "content_hash",
        "created_at desc",
        "created_at;DROP TABLE applicants",
        "created_at:asc --",
        "(SELECT 1)",
        "created_at:désc",
    ],
)
def test_order_by_out_of_rule_is_refused_naming_the_rule(text: str) -> None:
    for record in (False, True):
        error = refusal([("order-by", text)], record=record)
        assert (error.parameter, error.value) == ("order-by", text)
        assert error.message.startswith("order-by must be up to 4 comma-separated keys")
        assert "no field twice" in error.message
    with pytest.raises(InvalidParameter):
        parse_order_by(text)


@pytest.mark.parametrize(
    "text",
    [
        "2024-02-30",
        "2024-13-01",
        "24-01-01",
        "2024-1-01",
        "2024-01-01T24:00",
        "2024-01-01T12:60",
        "2024-01-01T12:00:60",
        "2024-01-01T12:00:00+24:00",
        "2024-01-01T12:00:00+02:60",
        "2024-01-01T12:00:00+0200",
        "2024-01-01T12:00:00.",
        "2024-01-01Z",  # a date alone takes no offset
        "2024-01-01T12",
        "yesterday",
        "1705312800",
        "\uff12\uff10\uff12\uff14-01-01",  # fullwidth digits
        "2024-01-01T12:00:00ZZ",
    ],
)
@pytest.mark.parametrize("name", DATE_BOUNDS)
def test_date_bounds_out_of_rule_are_refused_naming_the_rule(name: str, text: str) -> None:
    for record in (False, True):
        error = refusal([(name, text)], record=record)
        assert (error.parameter, error.value) == (name, text)
        assert error.message.startswith(f"{name} must be an ISO 8601 instant")


@pytest.mark.parametrize(
    "text",
    [
        "555123456",
        "55512345678",
        "(555) 123-4567",
        "555-123-4567",
        "+15551234567",
        "555123456a",
        "".join(chr(0xFF10 + int(d)) for d in "5551234567"),  # fullwidth
        "".join(chr(0x0660 + int(d)) for d in "5551234567"),  # Arabic-Indic
    ],
)
def test_phone_1_takes_exactly_ten_digits(text: str) -> None:
    error = refusal([("phone_1", text)])
    assert (error.parameter, error.value) == ("phone_1", text)
    assert error.message == "phone_1 must be exactly 10 digits"


@pytest.mark.parametrize(
    "others",
    [
        [],
        [("integration_id", "int_a")],
        [("x_property_id", "P1")],
        [("integration_id", ""), ("x_property_id", "P1")],  # empty means absent
    ],
)
def test_x_id_requires_integration_id_and_x_property_id(others: list[tuple[str, str]]) -> None:
    error = refusal([("x_id", "A"), *others])
    assert (error.parameter, error.value) == ("x_id", "A")
    assert "integration_id" in error.message
    assert "x_property_id" in error.message


def test_x_id_with_both_is_taken() -> None:
    query = parse_list_query([("x_id", "A"), ("integration_id", "int_a"), ("x_property_id", "P")])
    assert (query.value("x_id"), query.value("integration_id"), query.value("x_property_id")) == (
        "A",
        "int_a",
        "P",
    )


@pytest.mark.parametrize("name", ["foo", "Limit", "order_by", "orderBy", "page", "sort", ""])
def test_unknown_parameters_are_refused_by_name(name: str) -> None:
    for record in (False, True):
        error = refusal([(name, "1")], record=record)
        assert (error.parameter, error.value) == (name, "1")
        assert error.message == f"unknown query parameter '{name}'"


@pytest.mark.parametrize("name", LIST_ONLY_FILTERS)
def test_list_only_filters_are_unknown_on_the_record_route(name: str) -> None:
    error = refusal([(name, "5551234567")], record=True)
    assert (error.parameter, error.value) == (name, "5551234567")
    assert error.message == f"unknown query parameter '{name}'"


@pytest.mark.parametrize(
    "pairs",
    [
        [("limit", "1"), ("limit", "2")],
        [("limit", "5"), ("limit", "5")],
        [("limit", ""), ("limit", "2")],
        [("order-by", ""), ("order-by", "id")],
        [("updated_at_gte", "2024-01-01"), ("updated_at_gte", "2024-01-02")],
    ],
)
def test_repeated_parameters_are_refused(pairs: list[tuple[str, str]]) -> None:
    name, value = pairs[-1]
    error = refusal(pairs)
    assert (error.parameter, error.value) == (name, value)
    assert error.message == f"query parameter '{name}' is given more than once"


KNOWN_NAMES = ("offset", "limit", "order-by", *DATE_BOUNDS, *LIST_ONLY_FILTERS)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(KNOWN_NAMES) | st.text(max_size=8),
            st.sampled_from(("", "0", "1", "250", "id:desc", "2024-01-01", "5551234567"))
            | st.text(max_size=12),
        ),
        max_size=6,
    )
)
def test_any_query_string_parses_or_is_refused_as_a_400(pairs: list[tuple[str, str]]) -> None:
    """Whatever the pairs, a query or an InvalidParameter naming one of them; nothing else."""
    for parse in (parse_list_query, parse_record_query):
        try:
            parse(pairs)
        except InvalidParameter as error:
            refused = error
        else:
            continue
        assert (refused.parameter, refused.value) in pairs
        assert refused.message
