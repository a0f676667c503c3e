"""leasestar/applicants/planner.py: how a list page is read, chosen by one pure function.

Expected choices are worked out here from the cost model's figures and from SQLite's
own answers (the rowids a bound keeps), never read back from the planner.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from leasestar.applicants import plan, planner
from leasestar.applicants.bodies import BodyDecoder
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
        (ApplicantQuery(filters=(("updated_at_gte", 0),)), None, Needed.COPY_OR_SIZES),
        (ApplicantQuery(), frozenset({"int_a", "int_b"}), Needed.COPY_OR_SIZES),
        # the copy holds no email: SQLite's sizes, or its own plan
        (
            ApplicantQuery(filters=(("updated_at_gte", 0), ("email_1", "a@b.c"))),
            None,
            Needed.NOTHING,
        ),
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


# --- every read plan reads the page SQLite would ------------------------------------------

# Each filter's condition, written here from CONTRACT.md (not from `FILTERS`).
CONDITIONS = {
    "updated_at_gte": "updated_at >= ?",
    "updated_at_lte": "updated_at <= ?",
    "last_seen_gte": "last_seen >= ?",
    "last_seen_lte": "last_seen <= ?",
    "integration_id": "integration_id = ?",
    "integration_vendor": "integration_vendor = ?",
    "property_id": "property_id = ?",
    "x_property_id": "x_property_id = ?",
}
ORDERABLE = ("created_at", "updated_at", "last_seen", "property_id", "integration_vendor")
ORDERABLE += ("last_name", "first_name", "state", "city", "zip", "date_of_birth", "email_1")


def contract_order(keys: list[tuple[str, str]]) -> str:
    """The total order: the keys, then the id in the last key's direction (nulls first
    ascending, last descending: SQLite's own placement)."""
    direction = keys[-1][1] if keys else "asc"
    return ", ".join(f"{field} {way}" for field, way in [*keys, ("id", direction)])


@st.composite
def planned_queries(
    draw: st.DrawFn, connection: sqlite3.Connection
) -> tuple[ApplicantQuery, frozenset[str] | None, str, tuple[object, ...]]:
    """A first page or an offset, its filters drawn from the seed's values, and the
    WHERE that SQLite answers it by."""

    def values(column: str) -> list[object]:
        return [row[0] for row in connection.execute(f"SELECT DISTINCT {column} FROM applicants")]

    filters: list[tuple[str, object]] = []
    for name in CONDITIONS:
        if draw(st.integers(0, 3)) == 0:
            column = name.removesuffix("_gte").removesuffix("_lte")
            filters.append((name, draw(st.sampled_from(sorted(values(column))))))
    scope = None
    if draw(st.booleans()):
        scope = frozenset(
            draw(st.sets(st.sampled_from(sorted(values("integration_id"))), min_size=1))
        )
    fields = draw(st.lists(st.sampled_from(ORDERABLE), max_size=3, unique=True))
    keys = [(field, draw(st.sampled_from(["asc", "desc"]))) for field in fields]
    order_by = parse_order_by(",".join(f"{field}:{way}" for field, way in keys))
    query = ApplicantQuery(
        offset=draw(st.integers(0, 60)),
        limit=draw(st.integers(1, 40)),
        order_by=order_by if keys else (),
        filters=tuple(filters),  # drawn in FILTERS order, as the parser gives them
    )
    conditions = [CONDITIONS[name] for name, _ in filters]
    params: list[object] = [value for _, value in filters]
    if scope is not None:
        conditions.append(f"integration_id IN ({', '.join('?' * len(scope))})")
        params += sorted(scope)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    return query, scope, f"{where} ORDER BY {contract_order(keys)}", tuple(params)


@given(data=st.data(), rowids=st.booleans())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_read_plan_reads_the_page_sqlite_orders(
    seeded: tuple[Path, sqlite3.Connection],
    copy: MatchCounter,
    data: st.DataObject,
    rowids: bool,
) -> None:
    """Whatever `choose` picks (the index, a walk, a collection, a seek, a rowid read),
    the statement `plan.py` builds from it reads the records SQLite's own ORDER BY puts
    on that page, and the copy's count while choosing is SQLite's."""
    connection = seeded[1]
    query, scope, where_order, params = data.draw(planned_queries(connection), label="query")
    copy_read = data.draw(st.booleans(), label="the copy read")  # else SQLite's sizes
    with mock.patch.object(planner, "ROWID_READ_MOST", 8192 if rowids else -1):
        needed = stats_needed(query, scope)
        stats = copy if copy_read and needed is not Needed.NOTHING else None
        if not copy_read and needed is Needed.COPY_OR_SIZES:
            everything = connection.execute("SELECT count(*) FROM applicants").fetchone()[0]
            matching = connection.execute(
                f"SELECT count(*) FROM applicants {where_order.split(' ORDER BY ')[0]}", params
            ).fetchone()[0]
            read_plan = choose(query, scope, Sizes(matching, everything))
        else:
            read_plan = choose(query, scope, stats)
    event(read_plan.how.read.value)
    statement = plan.page(read_plan)
    _, returned, stored, lengths, _ = connection.execute(statement.sql, statement.params).fetchone()
    joined = BodyDecoder.of(connection).decode_joined(stored, lengths)
    served = [record["id"] for record in json.loads(b"[" + joined + b"]")]
    expected = [
        row[0]
        for row in connection.execute(
            f"SELECT id FROM applicants {where_order} LIMIT ? OFFSET ?",
            (*params, query.limit, query.offset),
        )
    ]
    assert served == expected, (read_plan.how, statement.sql)
    assert returned == len(expected)
    if read_plan.how.counted is not None:
        (total,) = connection.execute(
            f"SELECT count(*) FROM applicants {where_order.split(' ORDER BY ')[0]}", params
        ).fetchone()
        assert read_plan.how.counted == total
