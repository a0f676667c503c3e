"""The read pool: a read runs on the event loop within its time budget, else on a thread.

Whichever way a statement runs, its rows are the same; only where it ran differs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leasestar.database import ReadPool

# A statement of about two million SQLite steps: far beyond a 1 ms budget anywhere.
LONG = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400000) "
    "SELECT count(*), sum(i) FROM n"
)
LONG_ROWS = [(400_000, 400_000 * 400_001 // 2)]


async def _pool(path: Path, budget: float) -> AsyncIterator[ReadPool]:
    pool = ReadPool(path, 1, inline_budget=budget)
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def tight(seeded_db: Path) -> AsyncIterator[ReadPool]:
    async for pool in _pool(seeded_db, 0.001):
        yield pool


@pytest.fixture
async def generous(seeded_db: Path) -> AsyncIterator[ReadPool]:
    # A budget no scheduler hiccup can exhaust: what runs inline here always stays inline.
    async for pool in _pool(seeded_db, 60.0):
        yield pool


async def test_a_statement_beyond_the_budget_moves_to_the_pool_with_the_same_rows(
    tight: ReadPool,
) -> None:
    assert await tight.fetchall(LONG) == LONG_ROWS
    assert tight.moved_to_pool == 1


async def test_a_statement_within_the_budget_stays_on_the_loop(
    generous: ReadPool, seeded_db: Path
) -> None:
    expected = sqlite3.connect(seeded_db).execute("SELECT count(*) FROM applicants").fetchall()
    assert await generous.fetchall("SELECT count(*) FROM applicants") == expected
    assert await generous.fetchall(LONG) == LONG_ROWS
    assert generous.moved_to_pool == 0


async def test_the_inline_connection_is_usable_after_an_interrupted_statement(
    tight: ReadPool,
) -> None:
    for _ in range(3):
        assert await tight.fetchall(LONG) == LONG_ROWS
        assert await tight.fetchall("SELECT 41 + 1") == [(42,)]
    assert tight.moved_to_pool == 3


async def test_other_errors_are_raised_not_retried(generous: ReadPool) -> None:
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await generous.fetchall("SELECT * FROM no_such_table")
    assert generous.moved_to_pool == 0


async def test_reads_are_read_only_either_way(tight: ReadPool, generous: ReadPool) -> None:
    for pool in (tight, generous):
        with pytest.raises(sqlite3.OperationalError):
            await pool.fetchall("DELETE FROM applicants")


class _Faulting:
    """An inline connection whose every statement fails with the given SQLite error."""

    def __init__(self, code: int, name: str) -> None:
        self.code, self.name = code, name

    def execute(self, *args: object) -> None:
        error = sqlite3.OperationalError("database is locked")
        error.sqlite_errorcode = self.code
        error.sqlite_errorname = self.name
        raise error


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (sqlite3.SQLITE_BUSY, "SQLITE_BUSY"),
        # Python reports SQLite's extended codes: a reader meeting another connection's
        # WAL recovery gets SQLITE_BUSY_RECOVERY (261), not SQLITE_BUSY (5).
        (261, "SQLITE_BUSY_RECOVERY"),
        (262, "SQLITE_LOCKED_SHAREDCACHE"),
    ],
)
async def test_a_busy_or_locked_inline_read_moves_to_the_pool_whatever_its_extended_code(
    generous: ReadPool, code: int, name: str
) -> None:
    inline = generous._inline
    generous._inline = _Faulting(code, name)  # type: ignore[assignment]
    try:
        assert await generous.fetchall("SELECT 41 + 1") == [(42,)]
    finally:
        generous._inline = inline
    assert generous.moved_to_pool == 1


async def test_the_health_probe_is_never_interrupted_however_often_it_runs(
    tight: ReadPool,
) -> None:
    # SQLite calls the progress handler every 1000 steps a cached statement has run in
    # all, across its runs: a one-row probe run a few hundred times reaches it, and must
    # not meet the deadline an earlier read left behind (a spurious 503 on /health).
    await tight.fetchall("SELECT 1")
    for _ in range(1000):
        await tight.check()
