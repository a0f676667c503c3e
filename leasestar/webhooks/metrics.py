"""Webhook figures for /metrics, read from the database at scrape time.

Read by `refresh` on a thread before the registry is collected on the event loop: the
queries (a count per subscription, a week of attempts) would stall every request
meanwhile, and the registry cannot be collected on a thread itself (the request counts
it holds are plain numbers the event loop changes, observability.RequestCounts).

Whichever worker answers the scrape reads the same tables the deliverer writes, so the
figures do not depend on which worker delivers. They trail the deliveries by up to the
ledger's flush interval (ledger.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from leasestar.database import read_uri
from leasestar.instants import now_micros
from leasestar.webhooks.payloads import events_query
from leasestar.webhooks.subscriptions import list_subscriptions

OUTCOMES = ("delivered", "retry", "failed", "gone")  # ledger.Attempt.outcome


class WebhookCollector(Collector):
    def __init__(self, path: Path) -> None:
        self._path = path
        self._figures: list[Metric] = []

    def refresh(self) -> None:
        """Read the figures (blocking: call on a thread) for the next `collect`."""
        self._figures = list(self._read())

    def collect(self) -> Iterator[Metric]:
        yield from self._figures

    def _read(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            "leasestar_webhook_pending_events",
            "Events committed and not yet delivered (nor given up), per active subscription.",
            labels=["subscription"],
        )
        lag = GaugeMetricFamily(
            "leasestar_webhook_lag_seconds",
            "Age of the oldest pending event, per active subscription (0 when none).",
            labels=["subscription"],
        )
        attempts = GaugeMetricFamily(
            "leasestar_webhook_attempts",
            "Delivery attempts recorded (kept 7 days), by outcome: delivered, retry (failed, "
            "to be tried again), failed (given up at the retry horizon), gone (410).",
            labels=["outcome"],
        )
        try:
            connection = sqlite3.connect(read_uri(self._path), uri=True)
        except sqlite3.Error:
            return
        try:
            now = now_micros()
            for subscription in list_subscriptions(connection, include_revoked=False):
                if not subscription.active:
                    continue
                query, params = events_query(subscription)
                count, oldest = connection.execute(
                    f"SELECT count(*), min(created_at) FROM ({query})",
                    (subscription.delivered_through, *params, -1),
                ).fetchone()
                pending.add_metric([subscription.id], count)
                lag.add_metric([subscription.id], (now - oldest) / 1e6 if oldest else 0.0)
            counted = dict(
                connection.execute(
                    "SELECT outcome, count(*) FROM webhook_attempts GROUP BY outcome"
                ).fetchall()
            )
            for outcome in OUTCOMES:
                attempts.add_metric([outcome], counted.get(outcome, 0))
        except sqlite3.Error:
            return
        finally:
            connection.close()
        yield from (pending, lag, attempts)
