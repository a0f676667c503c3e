"""Unit tests of leasestar/applicants/ordering.py: ORDER BY and the keyset after a position.

Expected SQL is written out from the contract's ordering rules (CONTRACT.md, "Ordering").
"""

from __future__ import annotations

import re
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leasestar.applicants.ordering import (
    SqlFragment,
    build_order_by,
    keyset_ranges,
    total_order,
)
from leasestar.applicants.query import (
    parse_list_query,
    parse_order_by,
)
from leasestar.applicants.records import SortKey
from leasestar.errors import InvalidParameter
from tests.contract import SORTABLE

# --- build_order_by -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "sql"),
    [
        ((), "ORDER BY id ASC"),
        ((("created_at", "desc"),), "ORDER BY created_at DESC, id DESC"),
        ((("created_at", "asc"),), "ORDER BY created_at ASC, id ASC"),
        (
            (("last_name", "asc"), ("first_name", "desc")),
            "ORDER BY last_name ASC, first_name DESC, id DESC",
        ),
        (
            (("city", "desc"), ("state", "asc"), ("zip", "desc"), ("email_1", "asc")),
            "ORDER BY city DESC, state ASC, zip DESC, email_1 ASC, id ASC",
        ),
        # id already makes the order total: no second id key.
        ((("id", "desc"),), "ORDER BY id DESC"),
        ((("city", "asc"), ("id", "desc")), "ORDER BY city ASC, id DESC"),
    ],
)
def test_order_by_ends_with_id_in_the_direction_of_the_last_key(
    keys: tuple[tuple[str, str], ...], sql: str
) -> None:
    assert build_order_by(tuple(SortKey(f, d) for f, d in keys)) == sql  # type: ignore[arg-type]


def test_the_default_ordering_is_newest_first() -> None:
    assert build_order_by(parse_list_query([]).order_by) == "ORDER BY created_at DESC, id DESC"


def test_a_field_outside_the_whitelist_never_reaches_the_sql() -> None:
    with pytest.raises(KeyError):
        build_order_by((SortKey("created_at; DROP TABLE applicants", "asc"),))


_ORDER_SQL = re.compile(
    r"ORDER BY (?P<keys>(?:[a-z_0-9]+ (?:ASC|DESC))(?:, [a-z_0-9]+ (?:ASC|DESC))*)"
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(SORTABLE) | st.text(st.sampled_from("abcdeiz_:,;' -()ACDESI"), max_size=12),
        max_size=5,
    ).map(",".join)
)
def test_any_accepted_order_by_builds_sql_of_whitelisted_identifiers(text: str) -> None:
    try:
        keys = parse_order_by(text)
    except InvalidParameter:
        return
    match = _ORDER_SQL.fullmatch(build_order_by(keys))
    assert match is not None
    built = [part.split(" ") for part in match["keys"].split(", ")]
    assert all(name in SORTABLE for name, _ in built)
    assert built[: len(keys)] == [[key.field, key.direction.upper()] for key in keys]


@pytest.mark.parametrize(("inclusive", "ids"), [(True, ["app_1", "app_2"]), (False, ["app_2"])])
def test_a_keyset_ignores_the_keys_after_id(
    emails_db: sqlite3.Connection, inclusive: bool, ids: list[str]
) -> None:
    # A page served from a checkpoint starts "at" its row; a null key after `id` (every
    # first_name here is null) once dropped that row. Found by test_pagination_properties.
    keys = total_order(
        (SortKey("city", "desc"), SortKey("id", "asc"), SortKey("first_name", "desc"))
    )
    ranges = keyset_ranges(keys, (None, "app_1", None), inclusive=inclusive)
    # The ranges as one predicate (the page statement makes each an arm of a UNION ALL).
    keyset = SqlFragment(
        "(" + " OR ".join(f"({part.sql})" for part in ranges) + ")",
        tuple(param for part in ranges for param in part.params),
    )
    rows = emails_db.execute(
        f"SELECT id FROM applicants WHERE {keyset.sql} {build_order_by(keys)}", keyset.params
    )
    assert [row[0] for row in rows] == ids
