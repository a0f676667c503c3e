"""Sending the outbox: one deliverer per database, a sender per subscription.

Every worker of `leasestar serve` starts a `Deliverer`; the one that takes an exclusive
`flock` on the file beside the database (`<db>-webhooks.lock`) delivers, the others
try again every LOCK_RETRY_SECONDS. The kernel drops the lock with its process however
that ends (kill -9 included), so a worker that uvicorn restarts, or another one, takes
over within a second, from the cursors the database holds. A lock in the database
(a row with an expiry) would need renewing writes and a guess at how long a dead holder
takes to notice; the file lock needs neither. Replicas never start one (main.py).

Each subscription has its own task and connection, so a slow or dead receiver only
ever delays itself. Within a subscription events go one at a time in change order: an
event is retried until it is delivered or given up (retries.py) before the next is
sent, as a receiver applying changes needs them. One request in flight is enough:
against loopback receivers that answer at once, three subscriptions delivered ~1,200
events a second each from an otherwise idle server, sharing its core (the webhooks
section of benchmarks/RESULTS.md): there the core is the limit, which a window of
requests in flight would not move. A receiver far away gets one event per round trip
(20 a second at 50 ms); a window would raise that, but weaken the order a receiver is
promised (a later event arriving while an earlier one waits for its retry), so it waits
for a receiver that needs it.

What an event costs the sender is kept to its POST: events are read in batches of
BATCH, their bodies built on the same thread call as the read, the attempts and cursors
recorded by the ledger in batches (ledger.py), and the POST itself goes through
aiohttp's client (connection.py: 0.22 ms of CPU where httpx's took 0.93). Redirects are not
followed (a 3xx is a failed attempt: a receiver that moved must be subscribed again,
or a redirect could carry signed data elsewhere); of the answer only its first KiB is
kept.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from leasestar import __version__
from leasestar.applicants.bodies import DICTIONARIES, BodyDecoder, UnknownDictionary
from leasestar.database import BUSY_TIMEOUT_MS, read_uri
from leasestar.webhooks.ledger import FLUSH_SECONDS, Attempt, Ledger
from leasestar.webhooks.payloads import Event, events_query, payload
from leasestar.webhooks.retries import RetryPolicy, parse_retry_after
from leasestar.webhooks.signing import signed_headers
from leasestar.webhooks.subscriptions import Subscription, list_subscriptions

if TYPE_CHECKING:
    from leasestar.webhooks.connection import ReceiverConnection

LOCK_RETRY_SECONDS: Final = 1.0
# How often a sender with nothing to send looks for new events (a commit is sent within
# about this long), and how often the subscriptions are read again (new, revoked,
# rotated).
POLL_SECONDS: Final = 0.05
SUBSCRIPTIONS_POLL_SECONDS: Final = 0.5
BATCH: Final = 200
USER_AGENT: Final = f"leasestar-webhooks/{__version__}"
logger = logging.getLogger("leasestar.webhooks")
T = TypeVar("T")


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + "-webhooks.lock")


def _try_lock(path: Path) -> int | None:
    """The descriptor holding the exclusive lock, or None if another process holds it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


def _release_if_locked(trying: asyncio.Future[int | None]) -> None:
    if not trying.cancelled() and trying.exception() is None:
        descriptor = trying.result()
        if descriptor is not None:
            os.close(descriptor)


class Deliverer:
    """Delivers the database's outbox while this process holds the webhook lock."""

    def __init__(self, path: Path, policy: RetryPolicy | None = None) -> None:
        self._path = path
        self.policy = policy or RetryPolicy.from_env()
        self.ledger = Ledger(path)
        self._subscriptions: dict[str, Subscription] = {}
        # Where each sender got to, ahead of what the ledger has written: a sender started
        # again (after an error) resumes here rather than send again what was done.
        self.cursors: dict[str, int] = {}
        self.gone: set[str] = set()  # answered 410: disabled, maybe not written yet
        self.holding = False

    def current(self, subscription_id: str) -> Subscription | None:
        """The subscription as last read, if still active."""
        return self._subscriptions.get(subscription_id)

    async def run(self) -> None:
        """Wait for the lock, then deliver until cancelled."""
        descriptor = None
        while descriptor is None:
            trying = asyncio.ensure_future(asyncio.to_thread(_try_lock, lock_path(self._path)))
            try:
                descriptor = await asyncio.shield(trying)
            except asyncio.CancelledError:
                # The thread runs on: a lock it takes after the cancellation is released
                # then, not held (with its descriptor) for the life of the process.
                trying.add_done_callback(_release_if_locked)
                raise
            if descriptor is None:
                await asyncio.sleep(LOCK_RETRY_SECONDS)
        self.holding = True
        try:
            await self._deliver()
        finally:
            self.holding = False
            os.close(descriptor)

    def _read_subscriptions(self) -> list[Subscription]:
        connection = sqlite3.connect(read_uri(self._path), uri=True)
        try:
            return [s for s in list_subscriptions(connection, include_revoked=False) if s.active]
        finally:
            connection.close()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            # A failed flush keeps its records buffered; the flusher itself must outlive
            # it, or nothing delivered would be recorded again until a restart.
            try:
                await asyncio.to_thread(self.ledger.flush)
            except Exception as error:
                logger.error("webhooks: recording deliveries failed (%r); trying again", error)

    async def _deliver(self) -> None:
        senders: dict[str, asyncio.Task[None]] = {}
        flusher = asyncio.create_task(self._flush_forever())
        try:
            while True:
                active = await asyncio.to_thread(self._read_subscriptions)
                self._subscriptions = {s.id: s for s in active}
                for subscription in active:
                    task = senders.get(subscription.id)
                    if task is not None and task.done() and not task.cancelled():
                        error = task.exception()
                        if error is not None:
                            logger.error(
                                "webhook %s: sender stopped (%r); starting again",
                                subscription.id,
                                error,
                            )
                    if subscription.id in self.gone:
                        continue
                    if task is None or task.done():
                        sender = SubscriptionSender(self, subscription)
                        senders[subscription.id] = asyncio.create_task(sender.run())
                for key in [key for key in senders if key not in self._subscriptions]:
                    senders.pop(key).cancel()
                await asyncio.sleep(SUBSCRIPTIONS_POLL_SECONDS)
        finally:
            for task in [*senders.values(), flusher]:
                task.cancel()
            await asyncio.gather(*senders.values(), flusher, return_exceptions=True)
            # Whatever was delivered is recorded before the process goes.
            await asyncio.to_thread(self.ledger.flush)
            self.ledger.close()


class SubscriptionSender:
    """Sends one subscription's events in change order, each until done."""

    def __init__(self, deliverer: Deliverer, subscription: Subscription) -> None:
        self._deliverer = deliverer
        self._id = subscription.id
        self._query, self._params = events_query(subscription)
        self._cursor = max(subscription.delivered_through, deliverer.cursors.get(self._id, 0))
        self._db = sqlite3.connect(
            read_uri(deliverer._path),
            uri=True,
            check_same_thread=False,
        )
        self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._decoder = BodyDecoder.of(self._db)
        # Attempts made before a restart: (attempts so far, next attempt's instant).
        self._earlier: dict[int, tuple[int, int | None]] = {}
        self._reading: asyncio.Future[Any] | None = None

    async def _read(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on a thread, with `_db`. Shielded: a cancelled sender's thread
        runs on, and `run` closes the connection only once that thread is done with it
        (closing it under a running query crashes the process)."""
        self._reading = asyncio.ensure_future(asyncio.to_thread(function, *args))
        result: T = await asyncio.shield(self._reading)
        return result

    def _close(self) -> None:
        if self._reading is None or self._reading.done():
            self._db.close()
        else:
            self._reading.add_done_callback(lambda _: self._db.close())

    def _load_earlier(self) -> None:
        rows = self._db.execute(
            "SELECT change_seq, max(attempt), max(next_attempt_at) FROM webhook_attempts "
            "WHERE subscription_id = ? AND change_seq > ? GROUP BY change_seq",
            (self._id, self._cursor),
        )
        self._earlier = {seq: (attempts, next_at) for seq, attempts, next_at in rows}

    def _next_events(self) -> tuple[list[tuple[Event, bytes]], int]:
        """The next batch with each event's body, and the outbox's last sequence as of the
        same snapshot.

        Past the batch's last event, up to that sequence, are only events this
        subscription does not receive (other integrations or event types): its cursor
        moves over them, or a filtered subscription would hold back the outbox's pruning
        and rescan them on every poll. The bodies are built here, on the read's thread:
        a thread call per event cost more than the event's POST.
        """
        self._db.execute("BEGIN")  # one read transaction: both answers from one snapshot
        try:
            rows = self._db.execute(self._query, (self._cursor, *self._params, BATCH)).fetchall()
            (last,) = self._db.execute("SELECT max(change_seq) FROM webhook_events").fetchone()
        finally:
            self._db.execute("COMMIT")
        events = [Event(*row) for row in rows]
        # A full batch may have more of this subscription's events after it.
        through = events[-1].change_seq if len(events) == BATCH else (last or 0)
        return [(event, self._body(event)) for event in events], through

    def _advance(self, change_seq: int) -> None:
        self._cursor = change_seq
        self._deliverer.cursors[self._id] = change_seq
        self._deliverer.ledger.done(self._id, change_seq)

    def _body(self, event: Event) -> bytes:
        try:
            return payload(event, self._decoder)
        except UnknownDictionary:  # trained after this sender started
            self._decoder.add(self._db.execute(DICTIONARIES))
            return payload(event, self._decoder)

    async def run(self) -> None:
        # aiohttp (0.15 s to import) only once a subscription is sent to: a worker of a
        # server that sends no webhooks starts without it.
        from leasestar.webhooks.connection import ALLOW_PRIVATE_ENV, ReceiverConnection

        connection = ReceiverConnection(
            user_agent=USER_AGENT,
            allow_private=os.environ.get(ALLOW_PRIVATE_ENV) == "on",
            timeout=self._deliverer.policy.timeout,
        )
        try:
            await self._read(self._load_earlier)
            while True:
                batch, through = await self._read(self._next_events)
                for event, body in batch:
                    outcome = await self._until_done(connection, event, body)
                    if outcome == "revoked":
                        return
                    self._advance(event.change_seq)
                    if outcome == "gone":
                        self._deliverer.gone.add(self._id)
                        self._deliverer.ledger.disable(self._id, "410 Gone")
                        return
                if through > self._cursor:
                    self._advance(through)
                if not batch:
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            self._close()
            await connection.close()

    async def _until_done(self, connection: ReceiverConnection, event: Event, body: bytes) -> str:
        policy = self._deliverer.policy
        attempt, next_at = self._earlier.pop(event.change_seq, (0, None))
        while True:
            if next_at is not None:
                await asyncio.sleep(max(0.0, next_at / 1e6 - time.time()))
            subscription = self._deliverer.current(self._id)
            if subscription is None:
                return "revoked"  # meanwhile: its cursor stays where it is
            attempt += 1
            now = time.time()
            headers = signed_headers(
                subscription.signing,
                subscription.secrets_at(int(now * 1e6)),
                event.event_id,
                int(now),
                body,
            )
            # The connection's one timeout bounds the whole exchange, not each read: a
            # receiver dripping its answer a byte at a time would hold the subscription
            # indefinitely otherwise.
            status, answer, retry_header = await connection.attempt(subscription.url, headers, body)
            retry_after = parse_retry_after(retry_header, now)
            next_at = None
            if status is not None and 200 <= status < 300:
                outcome = "delivered"
            elif status == 410:
                outcome = "gone"
            else:
                wait = policy.delay(attempt, retry_after)
                retry_at = policy.retry_at(event.created_at / 1e6, now, wait)
                if retry_at is None:
                    outcome = "failed"
                else:
                    outcome, next_at = "retry", int(retry_at * 1e6)
            self._deliverer.ledger.attempt(
                Attempt(
                    self._id,
                    event.change_seq,
                    attempt,
                    int(now * 1e6),
                    outcome,
                    status,
                    answer,
                    next_at,
                )
            )
            if outcome != "retry":
                return outcome


async def run_deliverer(deliverer: Deliverer) -> None:
    """`deliverer.run()`, for a lifespan's task: ends quietly when cancelled, and only then.

    Any other error (a busy or unreadable database, no file descriptors left) is logged
    and delivery starts again: letting it end the task would stop delivery for the life
    of the process, and the lifespan awaiting it at shutdown would raise it instead of
    closing what it opened.
    """
    task = asyncio.current_task()
    while True:
        try:
            await deliverer.run()
        except asyncio.CancelledError:
            return
        except Exception as error:
            # Raised while being cancelled (by a cleanup in `run`): the cancellation is
            # spent, so ask the task rather than wait for another.
            if task is not None and task.cancelling():
                return
            logger.error(
                "webhooks: delivery stopped (%r); starting again in %g s",
                error,
                LOCK_RETRY_SECONDS,
            )
        try:
            await asyncio.sleep(LOCK_RETRY_SECONDS)
        except asyncio.CancelledError:
            return
