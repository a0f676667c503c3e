"""A wait that ends when the client leaves (`leasestar/disconnect.py`), on its own: an
ASGI `receive` played by the test, and the waits the server really makes (a token's
turn, an event). Over a real server: `tests/test_abandoned_clients.py`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from leasestar.disconnect import ClientGone, unless_gone
from leasestar.rate_limit import waited_for
from leasestar.token_concurrency import TokenConcurrency


class Client:
    """`receive` of a GET: its one request message, then nothing until it disconnects."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.messages = 0

    async def receive(self) -> dict[str, Any]:
        self.messages += 1
        if self.messages == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_what_comes_first_is_returned() -> None:
    client = Client()
    came = asyncio.Event()
    waiting = asyncio.create_task(unless_gone(_after(came, "page"), client.receive))
    await settle()
    came.set()
    assert await waiting == "page"


async def _after(event: asyncio.Event, value: str) -> str:
    await event.wait()
    return value


async def test_a_client_that_leaves_cancels_the_wait() -> None:
    client = Client()
    came = asyncio.Event()
    inner = asyncio.create_task(_after(came, "page"))
    waiting = asyncio.create_task(unless_gone(inner, client.receive))
    await settle()
    client.gone.set()
    with pytest.raises(ClientGone):
        await waiting
    assert inner.cancelled()


async def test_a_request_whose_client_leaves_leaves_the_queue() -> None:
    turns = TokenConcurrency(1)
    assert turns.try_start("a")  # in progress
    gone, staying = Client(), Client()
    leaving = asyncio.create_task(unless_gone(turns.wait_turn("a"), gone.receive))
    waiting = asyncio.create_task(unless_gone(turns.wait_turn("a"), staying.receive))
    await settle()
    gone.gone.set()
    with pytest.raises(ClientGone):
        await leaving
    # The turn of the request in progress goes to the one still waiting, not the one gone.
    turns.finish("a")
    await asyncio.wait_for(waiting, 5)
    turns.finish("a")
    assert turns.try_start("a")  # nothing in progress, nothing waiting: a turn at once
    turns.finish("a")


async def test_cancelling_the_request_cancels_both_waits() -> None:
    client = Client()
    inner = asyncio.create_task(asyncio.Event().wait())
    waiting = asyncio.create_task(unless_gone(inner, client.receive))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert inner.cancelled()


@pytest.mark.parametrize("steps", range(6))
async def test_a_turn_handed_to_a_request_cancelled_at_once_is_handed_on(steps: int) -> None:
    """A queued request handed its turn, then cancelled within `steps` turns of the loop
    (before it took the turn, or after): the token has nothing in progress once it ends."""
    turns = TokenConcurrency(1)
    assert turns.try_start("a")  # in progress
    waiting = asyncio.create_task(waited_for((turns, "a", True), Client().receive))
    await settle()
    turns.finish("a")  # the request in progress is done: its turn goes to the waiting one
    for _ in range(steps):
        await asyncio.sleep(0)
    waiting.cancel()
    try:
        took = await waiting
    except asyncio.CancelledError:
        took = False
    if took:  # it took the turn before the cancellation reached it: its own to finish
        turns.finish("a")
    assert turns.try_start("a")  # nothing in progress, nothing waiting
    turns.finish("a")
