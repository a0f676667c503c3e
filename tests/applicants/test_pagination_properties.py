"""Properties of `GET /v1/applicants`: every page is the model's slice, and pages tile.

Random data sets (see tests/strategies.py) are written with the real upsert into a
fresh SQLite file per example and served by the real app with a real token. Each
response is compared with an independent Python model that filters and sorts the
drawn records by the contract's rules: strings by code point, nulls first ascending
and last descending, datetimes by instant, a final hidden `id` key in the direction
of the last requested key, and `id` ascending for an empty `order-by`.
"""

from __future__ import annotations

from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasestar.applicants import plan, planner
from leasestar.applicants.pipeline import write_records
from leasestar.database import open_for_write
from tests.strategies import (
    ModelRow,
    check_query,
    datasets,
    list_queries,
    serve,
    source_key,
)

PROPERTY_SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY_SETTINGS
@given(rows=datasets(), data=st.data())
async def test_pages_are_the_model_slices_and_tile_the_matching_set(
    rows: list[ModelRow], data: st.DataObject
) -> None:
    async with serve(rows, {"all": ()}) as served:
        client = served.client
        client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        for _ in range(data.draw(st.integers(1, 3), label="queries")):
            query = data.draw(list_queries(rows), label="query")
            await check_query(client, rows, query, data.draw(st.integers(1, 5), label="step"))


@settings(PROPERTY_SETTINGS, max_examples=25)
@given(rows=datasets(max_size=12), data=st.data())
async def test_totals_and_pages_follow_writes(rows: list[ModelRow], data: st.DataObject) -> None:
    """A write between two identical queries shows in the second: no stale count or page."""
    async with serve(rows, {"all": ()}) as served:
        client = served.client
        client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
        query = data.draw(list_queries(rows), label="query")
        await check_query(client, rows, query, step=3)
        added = data.draw(datasets(min_size=1, max_size=4), label="added")
        # New records only: an id or upsert key already taken would merge or be refused.
        ids = {row.values["id"] for row in rows}
        keys = {source_key(row) for row in rows}
        added = [
            row for row in added if row.values["id"] not in ids and source_key(row) not in keys
        ]
        connection = open_for_write(served.db_path)
        try:
            write_records(connection, [row.record for row in added])
        finally:
            connection.close()
        await check_query(client, rows + added, query, step=3)


@settings(PROPERTY_SETTINGS, max_examples=40)
@given(
    rows=datasets(),
    data=st.data(),
    every=st.sampled_from((1, 2, 3)),
    deep=st.sampled_from((0, 1, 4)),
    write=st.booleans(),
)
async def test_checkpoint_seeks_serve_the_model_slices(
    rows: list[ModelRow], data: st.DataObject, every: int, deep: int, write: bool
) -> None:
    """Deep offsets (and broad filters) seek to a checkpoint, one every CHECKPOINT_EVERY
    matches, then skip the rest. Shrunk so that small data sets have many checkpoints,
    the seek must serve exactly the pages a plain offset would, before and after a write
    moves the checkpoints."""
    with (
        patch.object(plan, "CHECKPOINT_EVERY", every),
        patch.object(planner, "DEEP_OFFSET", deep),
    ):
        async with serve(rows, {"all": ()}) as served:
            client = served.client
            client.headers["Authorization"] = f"Bearer {served.tokens['all']}"
            query = data.draw(list_queries(rows), label="query")
            step = data.draw(st.integers(1, 4), label="step")
            await check_query(client, rows, query, step)
            if write:
                added = data.draw(datasets(min_size=1, max_size=3), label="added")
                ids = {row.values["id"] for row in rows}
                keys = {source_key(row) for row in rows}
                added = [
                    row
                    for row in added
                    if row.values["id"] not in ids and source_key(row) not in keys
                ]
                connection = open_for_write(served.db_path)
                try:
                    write_records(connection, [row.record for row in added])
                finally:
                    connection.close()
                rows = rows + added
            await check_query(client, rows, query, step)
