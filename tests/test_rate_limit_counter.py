"""The shared rate-limit counter (`leasestar/rate_limit.py`) on its own.

Processes counting at once in one file: every count is handed out exactly once, so no
request goes uncounted however the processes interleave. The window's rules: capped
at budget + 1, the end fixed by the first request, a new window once it has passed; a
slot whose window has ended serves another key; a file that is not a counter is refused.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

import leasestar.rate_limit
from leasestar.database import DatabaseError
from leasestar.rate_limit import CounterFull, WindowCounter

PROCESSES = 4
COUNTS_EACH = 400
NO_LIMIT = 10**9


def _count_many(path: str, key: str, times: int) -> list[int]:
    counter = WindowCounter(Path(path))
    try:
        return [counter.count(key, NO_LIMIT, 3600).requests for _ in range(times)]
    finally:
        counter.close()


def test_processes_counting_at_once_never_lose_a_count(tmp_path: Path) -> None:
    path = str(tmp_path / "db-ratelimit")
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        results = pool.starmap(_count_many, [(path, "token", COUNTS_EACH)] * PROCESSES)
    handed_out = sorted(count for result in results for count in result)
    assert handed_out == list(range(1, PROCESSES * COUNTS_EACH + 1))
    for result in results:  # each process saw its own counts rise
        assert result == sorted(result)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The counter's clock, in Unix seconds, moved by the test."""
    now = [1_800_000_000]
    monkeypatch.setattr(leasestar.rate_limit.time, "time", lambda: float(now[0]))
    return now


@pytest.fixture
def counter(tmp_path: Path) -> Iterator[WindowCounter]:
    opened = WindowCounter(tmp_path / "db-ratelimit")
    yield opened
    opened.close()


def test_a_window_caps_at_the_budget_and_renews_when_it_ends(
    counter: WindowCounter, clock: list[int]
) -> None:
    start = clock[0]
    windows = [counter.count("a", 3, 60) for _ in range(5)]
    assert [w.requests for w in windows] == [1, 2, 3, 4, 4]  # refusals are not counted
    assert {w.resets_at for w in windows} == {start + 60}  # nor move the window's end
    clock[0] = start + 59
    assert counter.count("a", 3, 60).requests == 4
    clock[0] = start + 60
    renewed = counter.count("a", 3, 60)
    assert (renewed.requests, renewed.resets_at) == (1, start + 120)
    assert counter.count("b", 3, 60).requests == 1  # each key its own window


def test_ended_windows_make_room_for_other_keys(counter: WindowCounter, clock: list[int]) -> None:
    slots = leasestar.rate_limit._SLOTS
    for n in range(slots):
        assert counter.count(f"key-{n}", 5, 60).requests == 1
    with pytest.raises(CounterFull):
        counter.count("one-too-many", 5, 60)
    assert counter.count("key-7", 5, 60).requests == 2  # the open windows are intact
    clock[0] += 60
    assert counter.count("one-too-many", 5, 60).requests == 1
    assert counter.count("key-7", 5, 60).requests == 1  # its window ended: a new one


def test_a_file_that_is_not_a_counter_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db-ratelimit"
    path.write_bytes(b"SQLite format 3\x00" + bytes(8176))
    with pytest.raises(DatabaseError, match="is not a leasestar rate-limit file"):
        WindowCounter(path)
    assert path.read_bytes()[:6] == b"SQLite"
