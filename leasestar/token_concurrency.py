"""Each token's requests in progress in one worker process: at most a few at once.

A rate limit counts requests, not the work they make: one token sending its budget of
the most expensive list the contract allows (seconds of sorting each) would hold every
read connection of a worker, and the cores that run them, while every other token
waited (issue 17, point 5). So a worker serves at most `cap` requests of one token at
once; the next ones wait their turn in order, and past `queue` waiting the worker
refuses. A waiting request holds its connection and a future, nothing of the database,
so it costs other tokens nothing; a client with many connections to one token is
slowed to `cap` at a time in each worker, not refused.

Counted per worker process, like the read connections it protects: each worker has its
own event loop and pool. Cheap requests (a page the indexes answer on the event loop)
start and finish without giving way to another, so they never meet the cap; requests
that wait (a read on the pool, a long poll, a stream being sent) do. The common case,
a token under its cap, is one dictionary look-up and one store.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

# Requests of one token that may wait their turn in one worker before it refuses more:
# room for a client with many connections (wrk's 16, a pool of 32) behind a cap of 2.
QUEUE: Final = 32


class TokenConcurrency:
    """Requests in progress per key (a token), at most `cap`; more wait, up to `QUEUE`.

    Used from the event loop only. A turn is handed from a finishing request straight to
    the first waiting one, so a request that comes in meanwhile cannot jump the queue.
    """

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self._limit = cap if cap is not None else 2**62
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def full(self, key: str) -> bool:
        """Whether a request of `key` could neither start nor wait now."""
        return self._running.get(key, 0) >= self._limit and len(self._waiting.get(key, ())) >= QUEUE

    def try_start(self, key: str) -> bool:
        """Start a request of `key` if it is under its cap (then `finish` it)."""
        running = self._running.get(key, 0)
        if running >= self._limit:
            return False
        self._running[key] = running + 1
        return True

    async def wait_turn(self, key: str) -> None:
        """Wait until a request of `key` finishes and hands over its turn (then `finish`).
        The caller has checked that the queue is not `full`."""
        turn = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(key, deque())
        waiting.append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.finish(key)  # handed a turn it will not use: pass it on
            elif turn in waiting:  # (`finish` may have dropped it, cancelled, already)
                waiting.remove(turn)
                if not waiting and self._waiting.get(key) is waiting:
                    del self._waiting[key]
            raise

    def finish(self, key: str) -> None:
        """A request of `key` is done: its turn goes to the first waiting one, if any."""
        waiting = self._waiting.get(key)
        while waiting:
            turn = waiting.popleft()
            if not waiting:
                del self._waiting[key]
            if not turn.done():
                turn.set_result(None)
                return
        running = self._running[key] - 1
        if running:
            self._running[key] = running
        else:
            del self._running[key]
