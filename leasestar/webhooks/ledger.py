"""What the deliverer did, written to the database in batches.

Each attempt is recorded after it was made, and a subscription's cursor
(`delivered_through`) moves after its event is done: a kill in between means the event
is sent again on restart (at least once), never skipped. Writing one transaction per
event would cost a commit per delivery and compete with imports for the write lock,
so the records are buffered and written together every FLUSH_SECONDS; while an import
holds the lock they wait in memory (the deliveries themselves never do).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Final, NamedTuple

from leasestar.instants import now_micros

FLUSH_SECONDS: Final = 0.2
# A flush waits this long for the write lock, then tries again at the next flush.
LOCK_WAIT_MS: Final = 200
# Rows of the outbox every active subscription is done with are deleted this often, and
# attempts older than ATTEMPTS_KEPT_SECONDS with them.
PRUNE_SECONDS: Final = 30.0
ATTEMPTS_KEPT_SECONDS: Final = 7 * 24 * 3600

_ATTEMPT: Final = (
    "INSERT OR REPLACE INTO webhook_attempts (subscription_id, change_seq, attempt, "
    "attempted_at, outcome, status, answer, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_DONE: Final = (
    "UPDATE webhook_subscriptions SET delivered_through = max(delivered_through, ?) WHERE id = ?"
)
_DISABLE: Final = (
    "UPDATE webhook_subscriptions SET disabled_at = ?, disabled_reason = ?, updated_at = ? "
    "WHERE id = ? AND disabled_at IS NULL"
)
_PRUNE_EVENTS: Final = (
    "DELETE FROM webhook_events WHERE change_seq <= coalesce((SELECT min(delivered_through) "
    "FROM webhook_subscriptions WHERE revoked_at IS NULL AND disabled_at IS NULL), "
    "(SELECT change_seq FROM sync_state))"
)


class Attempt(NamedTuple):
    subscription_id: str
    change_seq: int
    attempt: int
    attempted_at: int
    outcome: str  # delivered, retry, failed, gone
    status: int | None
    answer: str
    next_attempt_at: int | None


class Ledger:
    """Buffers attempts, cursors and disablings; `flush` writes them in one transaction."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        # One flush at a time, and no close under one: a cancelled flusher's thread may
        # still be writing when the deliverer flushes a last time and closes.
        self._writing = threading.Lock()
        self._attempts: list[Attempt] = []
        self._done: dict[str, int] = {}
        self._disabled: dict[str, str] = {}
        self._pruned = time.monotonic()

    def attempt(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts.append(attempt)

    def done(self, subscription_id: str, change_seq: int) -> None:
        with self._lock:
            self._done[subscription_id] = max(change_seq, self._done.get(subscription_id, 0))

    def disable(self, subscription_id: str, reason: str) -> None:
        with self._lock:
            self._disabled[subscription_id] = reason

    def _take(self) -> tuple[list[Attempt], dict[str, int], dict[str, str]]:
        with self._lock:
            taken = (self._attempts, self._done, self._disabled)
            self._attempts, self._done, self._disabled = [], {}, {}
            return taken

    def _give_back(
        self, attempts: list[Attempt], done: dict[str, int], disabled: dict[str, str]
    ) -> None:
        with self._lock:
            self._attempts[:0] = attempts
            for key, value in done.items():
                self._done[key] = max(value, self._done.get(key, 0))
            self._disabled = {**disabled, **self._disabled}

    def flush(self) -> bool:
        """Write what is buffered (blocking: call on a thread); False if the database
        was busy, in which case it stays buffered."""
        with self._writing:
            return self._flush()

    def _flush(self) -> bool:
        attempts, done, disabled = self._take()
        prune = time.monotonic() - self._pruned > PRUNE_SECONDS
        if not (attempts or done or disabled or prune):
            return True
        # A connection per flush (at most a few a second), closed after it: one kept open
        # would hold this process to the database's WAL index as it was, so that after
        # the -shm is replaced the read pool's new connections (database.py, `ReadPool`)
        # would share the old one and miss every later write of other processes.
        # (A plain connection: the server opened the database with its schema already.)
        try:
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            self._give_back(attempts, done, disabled)
            return False
        try:
            db.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_MS}")
            return self._write(db, attempts, done, disabled, prune)
        finally:
            db.close()

    def _write(
        self,
        db: sqlite3.Connection,
        attempts: list[Attempt],
        done: dict[str, int],
        disabled: dict[str, str],
        prune: bool,
    ) -> bool:
        try:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(_ATTEMPT, attempts)
            db.executemany(_DONE, [(seq, key) for key, seq in done.items()])
            now = now_micros()
            db.executemany(_DISABLE, [(now, why, now, key) for key, why in disabled.items()])
            if prune:
                db.execute(_PRUNE_EVENTS)
                db.execute(
                    "DELETE FROM webhook_attempts WHERE attempted_at < ?",
                    (now - ATTEMPTS_KEPT_SECONDS * 1_000_000,),
                )
            db.execute("COMMIT")
        except sqlite3.OperationalError:
            if db.in_transaction:
                db.execute("ROLLBACK")
            self._give_back(attempts, done, disabled)
            return False
        if prune:
            self._pruned = time.monotonic()
        return True

    def close(self) -> None:
        with self._writing:
            pass  # (a flush in progress ends first: each closes its own connection)
