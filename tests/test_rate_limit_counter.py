"""The shared rate-limit counter (`leasestar/rate_limit.py`) on its own.

Processes counting at once in one file: under a small budget every count is handed out
exactly once, so no request goes uncounted however the processes interleave; under a
large one, workers take leases of a few requests, and together never grant more than
the budget nor refuse before all but their unspent leases is granted. The window's
rules: capped at budget + 1, the end fixed by the first request, a new window once it
has passed; a slot whose window has ended serves another key; a file that is not a
counter is refused.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import leasestar.rate_limit
from leasestar.database import DatabaseError
from leasestar.rate_limit import CounterFull, WindowCounter

PROCESSES = 4
COUNTS_EACH = 120
EXACT_BUDGET = 511  # the largest budget counted one request at a time (no leases)
LARGE_BUDGET = 4096  # leases of 16, the most


def _count_many(path: str, key: str, times: int, budget: int) -> list[int]:
    counter = WindowCounter(Path(path))
    try:
        return [counter.count(key, budget, 3600)[0] for _ in range(times)]
    finally:
        counter.close()


def test_processes_counting_at_once_never_lose_a_count(tmp_path: Path) -> None:
    path = str(tmp_path / "db-ratelimit")
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        results = pool.starmap(
            _count_many, [(path, "token", COUNTS_EACH, EXACT_BUDGET)] * PROCESSES
        )
    handed_out = sorted(count for result in results for count in result)
    assert handed_out == list(range(1, PROCESSES * COUNTS_EACH + 1))
    for result in results:  # each process saw its own counts rise
        assert result == sorted(result)


def test_processes_taking_leases_grant_the_budget_and_no_more(tmp_path: Path) -> None:
    path = str(tmp_path / "db-ratelimit")
    each = LARGE_BUDGET // PROCESSES + 200  # together more than the budget
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        results = pool.starmap(_count_many, [(path, "token", each, LARGE_BUDGET)] * PROCESSES)
    granted = sum(count <= LARGE_BUDGET for result in results for count in result)
    # Refused while another process held at most 15 unspent requests of a lease.
    assert LARGE_BUDGET - (PROCESSES - 1) * 15 <= granted <= LARGE_BUDGET
    for result in results:
        assert result == sorted(result)


def _counts_rise(path: str, times: int) -> bool:
    """Whether every count this process is told, with a large budget (leases of 16: 15
    of 16 counts read the file without the lock), is above the one before."""
    counter = WindowCounter(Path(path))
    try:
        counts = [counter.count("token", 10**9, 3600)[0] for _ in range(times)]
    finally:
        counter.close()
    return all(later > earlier for earlier, later in itertools.pairwise(counts))


def test_a_count_read_without_the_lock_never_goes_back(tmp_path: Path) -> None:
    """Found by the test above, once: the file's count, read without the lock while
    another process wrote it, read 0 (`struct.pack_into` zeroes its bytes before it
    fills them). Two processes counting 100,000 times each, every write racing the other's
    reads: the count each is told only rises."""
    path = str(tmp_path / "db-ratelimit")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.starmap(_counts_rise, [(path, 100_000)] * 2) == [True, True]


@given(
    budget=st.integers(1, 5000),
    turns=st.lists(st.integers(0, 2), min_size=1, max_size=400),
)
def test_workers_sharing_a_file_grant_within_their_leases_of_the_budget(
    tmp_path_factory: pytest.TempPathFactory, budget: int, turns: list[int]
) -> None:
    """Three workers (counters on one file) take turns in any order: what they grant
    never passes the budget; once one is refused, the budget less the others' unspent
    leases (at most 15 each) has been granted."""
    path = tmp_path_factory.mktemp("leases") / "db-ratelimit"
    workers = [WindowCounter(path) for _ in range(3)]
    try:
        lease = min(16, max(1, budget // 256))  # as the module's docstring states it
        granted = refused = 0
        counts = []
        for turn in turns:
            requests, _ = workers[turn].count("token", budget, 3600)
            counts.append(requests)
            if requests <= budget:
                granted += 1
            else:
                refused += 1
                assert granted >= budget - 2 * (lease - 1)
        assert granted <= budget
        assert granted + refused == len(turns)
        # One window: exactly one request opened it, the one whose answer states the
        # policy (rate_limit.py, `requests == 1`), whichever worker counted it.
        assert counts.count(1) == 1
        assert counts[0] == 1
    finally:
        for worker in workers:
            worker.close()


def test_a_refusal_leaves_another_workers_lease_whole(tmp_path: Path) -> None:
    """A lease taken before the budget ran out is granted in full: one worker's refusal
    does not count past the budget in the file, where the other reads its share."""
    budget = 512  # leases of 2 (one request per 256 of the budget)
    first, second = (WindowCounter(tmp_path / "db-ratelimit") for _ in range(2))
    try:
        assert first.count("token", budget, 3600)[0] == 1  # holds the second of its lease
        granted = [second.count("token", budget, 3600)[0] for _ in range(budget - 2)]
        assert granted == list(range(3, budget + 1))
        assert second.count("token", budget, 3600)[0] == budget + 1  # refused
        assert first.count("token", budget, 3600)[0] == budget  # its leased one: granted
        assert first.count("token", budget, 3600)[0] == budget + 1
    finally:
        first.close()
        second.close()


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
    # (requests in the window, seconds until it ends): refusals are not counted, nor
    # move the window's end
    assert windows == [(1, 60), (2, 60), (3, 60), (4, 60), (4, 60)]
    clock[0] = start + 59
    assert counter.count("a", 3, 60) == (4, 1)
    clock[0] = start + 60
    assert counter.count("a", 3, 60) == (1, 60)  # a new window, ending at start + 120
    clock[0] = start + 61
    assert counter.count("a", 3, 60) == (2, 59)
    assert counter.count("b", 3, 60) == (1, 60)  # each key its own window


def test_ended_windows_make_room_for_other_keys(counter: WindowCounter, clock: list[int]) -> None:
    slots = leasestar.rate_limit._SLOTS
    for n in range(slots):
        assert counter.count(f"key-{n}", 5, 60)[0] == 1
    with pytest.raises(CounterFull):
        counter.count("one-too-many", 5, 60)
    assert counter.count("key-7", 5, 60)[0] == 2  # the open windows are intact
    clock[0] += 60
    assert counter.count("one-too-many", 5, 60)[0] == 1
    assert counter.count("key-7", 5, 60)[0] == 1  # its window ended: a new one


def test_a_file_that_is_not_a_counter_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db-ratelimit"
    path.write_bytes(b"SQLite format 3\x00" + bytes(8176))
    with pytest.raises(DatabaseError, match="is not a leasestar rate-limit file"):
        WindowCounter(path)
    assert path.read_bytes()[:6] == b"SQLite"


def test_a_worker_starting_on_a_file_cut_to_nothing_says_it_cleared_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file at the path is only ever one another worker finished making: an empty one
    was cut, and the worker that finds it so (here one starting late) says it cleared it."""
    path = tmp_path / "db-ratelimit"
    first = WindowCounter(path, fallback=True)
    try:
        assert first.count("token", 10, 60)[0] == 1
        path.write_bytes(b"")
        with caplog.at_level("WARNING", logger="leasestar.rate_limit"):
            late = WindowCounter(path, fallback=True)
        try:
            assert [r.getMessage() for r in caplog.records] == [
                f"rate-limit file {path} was cut to 0 of its {path.stat().st_size:,} bytes "
                "while serving: cleared it, every token's window starts again"
            ]
            assert late.count("token", 10, 60)[0] == 1  # a new window
        finally:
            late.close()
    finally:
        first.close()


def test_files_made_at_once_by_many_processes_are_one_file_made_once(tmp_path: Path) -> None:
    """Processes that each find no file publish theirs whole under the path; all but one
    find another's there first and count in it: one budget, counted exactly."""
    path = tmp_path / "db-ratelimit"
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        counts = pool.starmap(_count_many, [(str(path), "token", 20, EXACT_BUDGET)] * PROCESSES)
    assert sorted(itertools.chain.from_iterable(counts)) == list(range(1, 20 * PROCESSES + 1))
    assert [p.name for p in tmp_path.iterdir()] == ["db-ratelimit"]  # no file left making


def test_a_link_to_a_missing_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """Opening it finds nothing, and a new file cannot be linked where the link is: one
    line, never a loop (a start that hung at full CPU, review of stop 26)."""
    path = tmp_path / "db-ratelimit"
    path.symlink_to(tmp_path / "wiped" / "db-ratelimit")
    with pytest.raises(DatabaseError, match="is a link to a file that does not exist"):
        WindowCounter(path)
    serving = WindowCounter(path, fallback=True)  # a worker: counts in its own memory
    try:
        assert [serving.count("token", 10, 60)[0] for _ in range(2)] == [1, 2]
    finally:
        serving.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db-ratelimit"]
