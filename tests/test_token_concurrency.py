"""Each token's turns at being served (`leasestar/token_concurrency.py`), on their own.

At most `cap` requests of a key start; the next wait in order and each is handed the
turn of a request that finishes; past QUEUE waiting, `full`; a waiting request that is
cancelled leaves its place, and one cancelled just as it was handed a turn passes the
turn on. On the event loop alone, each step run to its end, so the order is the test's.
"""

from __future__ import annotations

import asyncio

from leasestar.token_concurrency import QUEUE, TokenConcurrency


async def settle() -> None:
    """Let every task that can run, run until it waits."""
    for _ in range(10):
        await asyncio.sleep(0)


class Request:
    """A request of `key` as the middleware runs it: start or wait its turn, then hold."""

    def __init__(self, turns: TokenConcurrency, key: str) -> None:
        self.turns, self.key = turns, key
        self.started = False
        self.done = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        if not self.turns.try_start(self.key):
            await self.turns.wait_turn(self.key)
        self.started = True
        try:
            await self.done.wait()
        finally:
            self.turns.finish(self.key)

    async def finish(self) -> None:
        self.done.set()
        await self.task


async def test_past_the_cap_requests_wait_and_start_in_order() -> None:
    turns = TokenConcurrency(2)
    requests = [Request(turns, "a") for _ in range(5)]
    await settle()
    assert [r.started for r in requests] == [True, True, False, False, False]
    await requests[1].finish()
    await settle()
    assert [r.started for r in requests] == [True, True, True, False, False]
    await requests[0].finish()
    await settle()
    assert [r.started for r in requests] == [True, True, True, True, False]
    for request in requests[2:]:
        await request.finish()
    assert [turns.try_start("a") for _ in range(3)] == [True, True, False]


async def test_keys_have_their_own_turns() -> None:
    turns = TokenConcurrency(1)
    first, second, other = Request(turns, "a"), Request(turns, "a"), Request(turns, "b")
    await settle()
    assert (first.started, second.started, other.started) == (True, False, True)
    for request in (first, second, other):
        await request.finish()


async def test_full_once_the_cap_is_running_and_the_queue_waiting() -> None:
    turns = TokenConcurrency(1)
    requests = [Request(turns, "a")]
    for _ in range(QUEUE):
        assert not turns.full("a")
        requests.append(Request(turns, "a"))
        await settle()
    assert turns.full("a")
    assert not turns.full("b")
    await requests[0].finish()
    await settle()
    assert not turns.full("a")  # one waiting request started: room for one more
    for request in requests[1:]:
        await request.finish()
    assert not turns.full("a")


async def test_a_cancelled_waiting_request_leaves_its_place() -> None:
    turns = TokenConcurrency(1)
    running, leaving, next_one = (Request(turns, "a") for _ in range(3))
    await settle()
    leaving.task.cancel()
    await settle()
    assert leaving.task.cancelled()
    await running.finish()
    await settle()
    assert next_one.started
    await next_one.finish()
    assert turns.try_start("a")


async def test_a_turn_handed_to_a_cancelled_request_is_passed_on() -> None:
    turns = TokenConcurrency(1)
    running, handed, after = (Request(turns, "a") for _ in range(3))
    await settle()
    # The turn is handed over and, before the waiting request resumes, it is cancelled.
    running.done.set()
    await asyncio.sleep(0)  # `running` finishes and hands its turn to `handed`
    assert running.task.done()
    assert not handed.started  # handed its turn, not resumed yet
    handed.task.cancel()
    await settle()
    assert handed.task.cancelled()
    assert not handed.started
    assert after.started
    await after.finish()
    assert [turns.try_start("a") for _ in range(2)] == [True, False]


async def test_no_cap_never_waits() -> None:
    turns = TokenConcurrency(None)
    assert all(turns.try_start("a") for _ in range(10_000))
    assert not turns.full("a")
