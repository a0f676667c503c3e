"""leasestar/applicants/planner.py: how a list page is read, chosen by one pure function.

Expected choices are worked out here from the cost model's figures and from SQLite's
own answers (the rowids a bound keeps), never read back from the planner.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasestar.applicants.match_counter import MatchCounter
from leasestar.applicants.planner import (
    COLLECT_ANY,
    INDEX,
    WALK,
    Costs,
    Needed,
    Read,
    Sizes,
    choose,
    shape,
    stats_needed,
    walk_row_cost,
)
from leasestar.applicants.query import ApplicantQuery, parse_order_by
from leasestar.database import read_uri


@pytest.fixture(scope="module")
def seeded(seeded_template: Path) -> Iterator[tuple[Path, sqlite3.Connection]]:
    """The 300 seeded applicants (tests/conftest.py), read-only."""
    connection = sqlite3.connect(read_uri(seeded_template), uri=True)
    yield seeded_template, connection
    connection.close()


@pytest.fixture(scope="module")
def copy(seeded: tuple[Path, sqlite3.Connection]) -> MatchCounter:
    counter = MatchCounter(seeded[0])
    asyncio.run(counter.catch_up())
    return counter


# --- what a choice reads ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "scope", "needed"),
    [
        (ApplicantQuery(), None, Needed.NOTHING),
        (ApplicantQuery(filters=(("email_1", "a@b.c"),)), None, Needed.NOTHING),
        # property_id's index continues with created_at, the default order
        (ApplicantQuery(filters=(("property_id", "p"),)), None, Needed.NOTHING),
        (ApplicantQuery(filters=(("updated_at_gte", 0),)), None, Needed.SIZES),
        (ApplicantQuery(), frozenset({"int_a", "int_b"}), Needed.SIZES),
        # no index serves state, city, zip together
        (ApplicantQuery(order_by=parse_order_by("state,city,zip")), None, Needed.COPY),
        (ApplicantQuery(order_by=parse_order_by("last_name,first_name")), None, Needed.NOTHING),
    ],
)
def test_a_choice_reads_the_statistics_it_depends_on(
    query: ApplicantQuery, scope: frozenset[str] | None, needed: Needed
) -> None:
    assert stats_needed(query, scope) is needed


def test_an_index_that_serves_the_query_is_read_as_it_is() -> None:
    assert choose(ApplicantQuery(), None, None).how == INDEX
    selective = ApplicantQuery(filters=(("email_1", "a@b.c"),))
    assert choose(selective, None, None).how == INDEX


def test_without_the_copy_the_sizes_weigh_a_walk_against_collecting() -> None:
    """The default order's index carries updated_at: a walk costs 0.04 a row stepped
    over, collecting 1 a match. A page of 100 among 1,000 rows half of which match
    steps over ~200 rows (8): walked. Five matches of 1,000,000 step over every row
    (40,000 > 5): collected, through SQLite's pick of index."""
    query = ApplicantQuery(filters=(("updated_at_gte", 0),))
    assert choose(query, None, Sizes(matches=500, everything=1000)).how == WALK
    assert choose(query, None, Sizes(matches=5, everything=1_000_000)).how == COLLECT_ANY


def test_few_matches_are_read_by_their_rowids(
    seeded: tuple[Path, sqlite3.Connection], copy: MatchCounter
) -> None:
    connection = seeded[1]
    instants = sorted(row[0] for row in connection.execute("SELECT updated_at FROM applicants"))
    bound = instants[4]  # five rows meet it (the seed's instants are distinct)
    query = ApplicantQuery(
        limit=10, order_by=parse_order_by("last_name"), filters=(("updated_at_lte", bound),)
    )
    how = choose(query, None, copy).how
    expected = sorted(
        row[0]
        for row in connection.execute(
            "SELECT rowid FROM applicants WHERE updated_at <= ?", (bound,)
        )
    )
    assert how.read is Read.ROWIDS
    assert sorted(msgspec.json.decode(how.rowids or "")) == expected
    assert (how.counted, how.counted_at) == (5, copy.version)
    assert how.version == copy.version
    assert how.unsought == COLLECT_ANY  # read at another version: collected


def test_the_choice_is_frozen_and_keyed_without_the_cursor() -> None:
    read_plan = choose(ApplicantQuery(), None, None)
    with pytest.raises(AttributeError):
        read_plan.how = WALK  # type: ignore[misc]
    first = ApplicantQuery(limit=20, offset=40, after=("x", 1))
    later = ApplicantQuery(limit=20, offset=60, after=("y", 2))
    assert shape(first) == shape(later)
    assert shape(ApplicantQuery(offset=40)) != shape(ApplicantQuery(offset=60))


# --- walking or collecting (issue 17.3) -------------------------------------------------

PLANNED = (
    ApplicantQuery(filters=(("updated_at_gte", 0),)),  # a default-order walk reads no row
    ApplicantQuery(order_by=parse_order_by("last_name"), filters=(("updated_at_lte", 0),)),
    ApplicantQuery(offset=500, filters=(("integration_vendor", "YARDI"),)),
)


@given(
    query=st.sampled_from(PLANNED),
    scoped=st.booleans(),
    everything=st.integers(1, 10**7),
    data=st.data(),
)
def test_a_choice_the_spread_cannot_change_is_the_choice_at_every_spread(
    query: ApplicantQuery, scoped: bool, everything: int, data: st.DataObject
) -> None:
    """Whatever rows a walk steps over (at least the wanted matches, at most every
    non-match besides), a choice made without counting them is the one `walks` makes."""
    costs = Costs(query, frozenset({"int_a"}) if scoped else None)
    matches = data.draw(st.integers(0, everything), label="matches")
    clear = costs.walks_whatever_the_spread(matches, everything)
    if clear is None:
        return
    wanted = costs.wanted
    low, high = min(wanted, everything), min(everything, everything - matches + wanted)
    for stepped in {low, high, data.draw(st.integers(low, max(low, high)), label="stepped")}:
        assert costs.walks(matches, everything, stepped) is clear


def test_a_default_order_walk_costs_less_a_row_than_one_reading_rows() -> None:
    """The default order's index carries both filterable instants (schema.sql)."""
    bounded = ApplicantQuery(filters=(("last_seen_lte", 0),))
    by_name = msgspec.structs.replace(bounded, order_by=parse_order_by("last_name"))
    assert walk_row_cost(bounded, None) < walk_row_cost(by_name, None)
    scoped = walk_row_cost(bounded, frozenset({"int_a"}))
    assert scoped == walk_row_cost(by_name, None)
