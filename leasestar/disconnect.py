"""The client leaving while its request waits: a long poll, or a request queued for its
token's turn (issue 29, point 4).

Neither sends anything while it waits, so the connection's end reaches the app only as
an `http.disconnect` from `receive`. Unwatched, ten long polls of `wait=5` closed after
one second held their token's two turns until each wait ran out: the token's next request
waited 24 s. Watched, the wait is cancelled the moment the client goes, and the turn is
handed on.

Only waits are watched, with a task each: a request that is served at once (nearly all
of them) never reads `receive` and pays nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected while its request waited: there is nobody to answer."""


async def _disconnected(receive: Any) -> None:
    """Return once the client has gone. A GET's one `http.request` message (no body: the
    connection layer refuses bodies) is dropped; nothing after a wait reads it."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(waiting: Awaitable[T], receive: Any) -> T:
    """`waiting`'s result; or, if the client disconnects first, `waiting` cancelled (its
    own clean-up run) and `ClientGone` raised."""
    work = asyncio.ensure_future(waiting)
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also when this request itself is cancelled: neither task outlives it, and the
        # wait's clean-up (leaving the queue, handing on a turn) has run on return.
        for task in (work, watch):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    if work.done() and not work.cancelled():
        return work.result()  # what was waited for came, even if the client went too
    if not watch.cancelled():
        watch.exception()  # (retrieved: a `receive` that failed means the client is gone)
    raise ClientGone
