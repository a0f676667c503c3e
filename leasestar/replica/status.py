"""What a replica knows of its freshness, written by its follower, read by `/health`.

The follower (in the `leasestar serve` process) writes `status.json` whenever it applies
a change or lists the store; every worker reads it when asked, so `/health` and
`/metrics` agree whatever the number of workers. Times are Unix seconds, compared with
the clock of the moment they are read.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import msgspec
from prometheus_client import CollectorRegistry, Gauge

from leasestar.replica.layout import write_atomically

StoreState = Literal["starting", "ok", "empty", "unreachable", "refused"]


class ReplicaStatus(msgspec.Struct):
    """The follower's own record (`status.json`)."""

    of: str
    store: StoreState = "starting"
    detail: str = ""
    served_txid: int = 0  # the last Litestream transaction applied to the served database
    change_seq: int = 0  # the served database's change sequence
    store_txid: int = 0  # the newest transaction the store held when last listed
    store_checked_at: float | None = None  # the last listing that answered
    behind_since: float | None = None  # since when the store holds more than is served
    data_shipped_at: float | None = None  # when the store received the served transaction
    apply_seconds: float | None = None  # how long the last change took to apply

    def write(self, path: Path) -> None:
        write_atomically(path, msgspec.json.encode(self))


class ReplicaHealth(msgspec.Struct):
    """The `replica` member of `/health` on a replica."""

    of: str
    store: StoreState
    detail: str
    lag_seconds: float
    transactions_behind: int
    served_txid: int
    store_txid: int
    change_seq: int
    data_age_seconds: float | None
    store_checked_seconds_ago: float | None
    apply_seconds: float | None


def read_status(path: Path) -> ReplicaStatus | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=ReplicaStatus)
    except (OSError, msgspec.DecodeError):
        return None


def health_of(status: ReplicaStatus, now: float | None = None) -> ReplicaHealth:
    """The status as ages and differences at `now`."""
    now = time.time() if now is None else now
    behind = max(status.store_txid - status.served_txid, 0)
    return ReplicaHealth(
        of=status.of,
        store=status.store,
        detail=status.detail,
        lag_seconds=round(max(now - status.behind_since, 0.0), 3)
        if behind and status.behind_since is not None
        else 0.0,
        transactions_behind=behind,
        served_txid=status.served_txid,
        store_txid=status.store_txid,
        change_seq=status.change_seq,
        data_age_seconds=_age(now, status.data_shipped_at),
        store_checked_seconds_ago=_age(now, status.store_checked_at),
        apply_seconds=status.apply_seconds,
    )


def _age(now: float, then: float | None) -> float | None:
    return None if then is None else round(max(now - then, 0.0), 3)


class ReplicaMetrics:
    """The replica's gauges, set from `status.json` at scrape time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lag = Gauge(
            "leasestar_replica_lag_seconds",
            "How long the store has held transactions this replica does not serve yet.",
            registry=registry,
        )
        self.behind = Gauge(
            "leasestar_replica_transactions_behind",
            "Litestream transactions the store holds beyond those served.",
            registry=registry,
        )
        self.data_age = Gauge(
            "leasestar_replica_data_age_seconds",
            "Age of the newest change served, by when the store received it.",
            registry=registry,
        )
        self.store_up = Gauge(
            "leasestar_replica_store_up",
            "1 when the store answered its last listing with this primary's data, else 0.",
            registry=registry,
        )
        self.change_seq = Gauge(
            "leasestar_replica_change_seq",
            "The change sequence of the database served.",
            registry=registry,
        )

    def update(self, health: ReplicaHealth | None) -> None:
        if health is None:
            self.store_up.set(0)
            return
        self.lag.set(health.lag_seconds)
        self.behind.set(health.transactions_behind)
        self.data_age.set(health.data_age_seconds if health.data_age_seconds is not None else -1)
        self.store_up.set(1 if health.store == "ok" else 0)
        self.change_seq.set(health.change_seq)
