"""The filters of leasestar/applicants/filters.py, run on a real database: each row's SQL
matches what the contract says the filter matches.
"""

from __future__ import annotations

import sqlite3

import pytest

from leasestar.applicants.plan import build_where
from leasestar.applicants.query import (
    parse_list_query,
)

HOSTILE = "x' OR 1=1 --"


# --- the clauses on a real database -------------------------------------------------


def matching_ids(connection: sqlite3.Connection, pairs: list[tuple[str, str]]) -> list[str]:
    where = build_where(parse_list_query(pairs), None)
    rows = connection.execute(f"SELECT id FROM applicants {where.sql} ORDER BY id", where.params)
    return [row[0] for row in rows]


@pytest.mark.parametrize(
    ("email", "ids"),
    [
        ("ANN@EXAMPLE.COM", ["app_0"]),
        ("ÁNN@EXAMPLE.COM", ["app_1"]),  # ASCII case ignored, Á/á not folded
        ("ánn@EXAMPLE.com", ["app_2"]),
        ("ann@example.co", []),
    ],
)
def test_email_1_ignores_ascii_case_only(
    emails_db: sqlite3.Connection, email: str, ids: list[str]
) -> None:
    assert matching_ids(emails_db, [("email_1", email)]) == ids


def test_phone_1_matches_the_ten_digits_alone_or_behind_a_leading_1(
    emails_db: sqlite3.Connection,
) -> None:
    assert matching_ids(emails_db, [("phone_1", "5551234567")]) == ["app_0", "app_1"]


@pytest.mark.parametrize("name", ["integration_id", "x_property_id", "email_1"])
def test_a_hostile_value_matches_nothing_and_breaks_nothing(
    emails_db: sqlite3.Connection, name: str
) -> None:
    assert matching_ids(emails_db, [(name, HOSTILE)]) == []
    assert emails_db.execute("SELECT count(*) FROM applicants").fetchone() == (3,)
