"""Delivery by a real `leasestar serve` to real loopback receivers (issue 28, points 3-4)."""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks.webhooks import Webhook

from leasestar.database import open_for_write
from leasestar.webhooks.subscriptions import create_subscription, rotate_secret
from tests.applicants.lines import T1, ndjson, run_import, source
from tests.test_hardening import serve
from tests.webhooks.receiver import WAIT_SECONDS, Received, Receiver, receiving

# The receivers are on loopback, off limits by default.
FAST_RETRIES = {
    "LEASESTAR_WEBHOOK_FIRST_RETRY": "0.05",
    "LEASESTAR_WEBHOOK_TIMEOUT": "30",
    "LEASESTAR_WEBHOOK_ALLOW_PRIVATE": "on",
}


def env(**extra: str) -> dict[str, str]:
    from tests.servers import clean_env

    return clean_env(**{**FAST_RETRIES, **extra})


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    path = tmp_path / "leasestar.db"
    open_for_write(path).close()
    return path


def subscribe(path: Path, url: str, **options: object) -> tuple[str, str]:
    connection = open_for_write(path)
    try:
        created = create_subscription(connection, url, **options)  # type: ignore[arg-type]
    finally:
        connection.close()
    return created.id, created.secret


def import_records(path: Path, *records: dict[str, object], seen_at: int = T1) -> None:
    connection = open_for_write(path)
    try:
        run_import(connection, ndjson(*records), seen_at=seen_at)
    finally:
        connection.close()


def attempts(path: Path, subscription_id: str) -> list[tuple[int, int, str, int | None]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT change_seq, attempt, outcome, status FROM webhook_attempts "
            "WHERE subscription_id = ? ORDER BY change_seq, attempt",
            (subscription_id,),
        ).fetchall()


def committed_changes(path: Path) -> list[int]:
    """The change sequence of every applicant row written (each was new, in these tests)."""
    with sqlite3.connect(path) as connection:
        return [
            row[0] for row in connection.execute("SELECT change_seq FROM applicants ORDER BY 1")
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as running:
        yield running


def test_standard_signatures_verify_with_the_standardwebhooks_package(
    db_file: Path, receiver: Receiver
) -> None:
    _, secret = subscribe(db_file, receiver.url, signing="standard")
    with serve(db_file, "--log-format", "off", env=env()):
        import_records(db_file, source(1), source(2), source(3, first_name="Cy"))
        receiver.wait_for_count(3)
    verifier = Webhook(secret)
    for request in receiver.received:
        verified = verifier.verify(request.body, request.headers)
        assert verified == request.event
        assert request.headers["webhook-id"] == request.event["event_id"]
    sent = receiver.events()
    assert [event["change_seq"] for event in sent] == sorted(e["change_seq"] for e in sent)
    assert [event["change_seq"] for event in sent] == committed_changes(db_file)
    assert len({event["event_id"] for event in sent}) == 3
    assert [event["data"]["x_id"] for event in sent] == ["X0001", "X0002", "X0003"]


def test_propexo_signatures_verify_as_propexo_documents(db_file: Path, receiver: Receiver) -> None:
    _, secret = subscribe(db_file, receiver.url, signing="propexo")
    with serve(db_file, "--log-format", "off", env=env()):
        import_records(db_file, source(1), source(2))
        receiver.wait_for_count(2)
    for request in receiver.received:
        # Propexo's documented check: hex HMAC-SHA256 of the raw body under the secret.
        expected = hmac.new(secret.encode(), request.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(request.headers["propexo-signature"], expected)


def test_a_rotated_secret_signs_beside_the_previous_one(db_file: Path, receiver: Receiver) -> None:
    subscription_id, old = subscribe(db_file, receiver.url, signing="standard")
    connection = open_for_write(db_file)
    try:
        new = rotate_secret(connection, subscription_id)
    finally:
        connection.close()
    with serve(db_file, "--log-format", "off", env=env()):
        import_records(db_file, source(1))
        receiver.wait_for_count(1)
    request = receiver.received[0]
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(request.body, request.headers)


def test_failures_are_retried_honouring_retry_after_then_delivered_once(db_file: Path) -> None:
    def flaky(number: int, request: Received) -> tuple[int, dict[str, str]]:
        return (503, {"retry-after": "0"}) if number < 2 else (200, {})

    with receiving(flaky) as receiver:
        subscription_id, _ = subscribe(db_file, receiver.url)
        with serve(db_file, "--log-format", "off", env=env()):
            import_records(db_file, source(1), source(2))
            receiver.wait_for_count(4)
            receiver.wait_for(lambda _: len(attempts(db_file, subscription_id)) == 4, "recorded")
    ids = [event["event_id"] for event in receiver.events()]
    # The first event three times (two 503s, then 200), then the second: in order.
    assert ids == [ids[0]] * 3 + [ids[3]]
    assert [row[1:] for row in attempts(db_file, subscription_id)] == [
        (1, "retry", 503),
        (2, "retry", 503),
        (3, "delivered", 200),
        (1, "delivered", 200),
    ]


def test_change_order_holds_through_failures_and_connections_the_receiver_closes(
    db_file: Path,
) -> None:
    """Every third request fails, every other one closes its connection: each event is
    retried before any later one is sent, on a new connection where the old was closed."""

    def answer(number: int) -> tuple[int, dict[str, str]]:
        if number % 3 == 1:
            return 500, {"connection": "close"}
        return 204, ({"connection": "close"} if number % 2 else {})

    with receiving(lambda number, _: answer(number)) as receiver:
        subscribe(db_file, receiver.url)
        with serve(db_file, "--log-format", "off", env=env()):
            import_records(db_file, *(source(n) for n in range(1, 31)))
            receiver.wait_for(
                lambda events: (
                    len({e["change_seq"] for e in events}) == 30
                    and answer(len(events) - 1)[0] == 204
                ),
                "30 events delivered",
            )
    sent = [event["change_seq"] for event in receiver.events()]
    delivered = [seq for number, seq in enumerate(sent) if answer(number)[0] == 204]
    assert delivered == committed_changes(db_file)  # each once, in change order
    for number, seq in enumerate(sent):
        if answer(number)[0] == 500:  # the same event next, before any later one
            assert sent[number + 1] == seq


def test_410_disables_the_subscription(db_file: Path) -> None:
    with receiving(lambda number, request: (410, {})) as receiver:
        subscription_id, _ = subscribe(db_file, receiver.url)
        with serve(db_file, "--log-format", "off", env=env()):
            import_records(db_file, source(1), source(2))
            receiver.wait_for_count(1)
            receiver.wait_for(
                lambda _: bool(attempts(db_file, subscription_id)), "the attempt recorded"
            )
            import_records(db_file, source(3))
        with sqlite3.connect(db_file) as connection:
            disabled = connection.execute(
                "SELECT disabled_reason FROM webhook_subscriptions WHERE id = ?",
                (subscription_id,),
            ).fetchone()
        assert disabled == ("410 Gone",)
        assert len(receiver.received) == 1


def test_redirects_are_not_followed(db_file: Path, receiver: Receiver) -> None:
    def moved(number: int, request: Received) -> tuple[int, dict[str, str]]:
        return 307, {"location": receiver.url}

    with receiving(moved) as redirecting:
        subscription_id, _ = subscribe(db_file, redirecting.url)
        with serve(db_file, "--log-format", "off", env=env()):
            import_records(db_file, source(1))
            redirecting.wait_for_count(2)
    assert receiver.received == []
    assert attempts(db_file, subscription_id)[0][2:] == ("retry", 307)


def test_a_stalled_receiver_never_delays_another(db_file: Path, receiver: Receiver) -> None:
    release = threading.Event()

    def stalled(number: int, request: Received) -> tuple[int, dict[str, str]]:
        release.wait(WAIT_SECONDS * 2)  # past any wait below: it answers when released
        return 204, {}

    with receiving(stalled) as slow:
        subscribe(db_file, slow.url)
        subscribe(db_file, receiver.url)
        # A request timeout past the receivers' longest wait: on a loaded machine the
        # stalled request would otherwise time out and be retried, counted twice.
        timeout = str(WAIT_SECONDS * 4)
        with serve(db_file, "--log-format", "off", env=env(LEASESTAR_WEBHOOK_TIMEOUT=timeout)):
            import_records(db_file, *(source(n) for n in range(1, 21)))
            receiver.wait_for_count(20)  # all of them, while the other holds its first
            assert len(slow.received) <= 1
            release.set()
            slow.wait_for_count(20)


def test_a_subscription_scoped_to_integrations_gets_only_theirs(
    db_file: Path, receiver: Receiver
) -> None:
    subscribe(db_file, receiver.url, integrations=["int_2"], events=["DATA_UPDATE"])
    with serve(db_file, "--log-format", "off", env=env()):
        import_records(db_file, source(1), source(2, integration_id="int_2"))
        import_records(
            db_file,
            source(1, first_name="B"),
            source(2, integration_id="int_2", first_name="B"),
            seen_at=T1 + 1000,
        )
        # In change order: the int_1 update, had it been sent, would have come first.
        receiver.wait_for_count(1)
    (only,) = receiver.events()
    assert only["event"] == "DATA_UPDATE"
    assert only["meta"]["integration_id"] == "int_2"
    assert only["diff"]["new"]["first_name"] == "B"


def test_two_workers_deliver_each_event_once(db_file: Path, receiver: Receiver) -> None:
    subscription_id, _ = subscribe(db_file, receiver.url)
    with serve(db_file, "--workers", "2", "--log-format", "off", env=env()):
        for batch in range(5):
            import_records(
                db_file, *(source(n + 10 * batch) for n in range(10)), seen_at=T1 + batch
            )
        receiver.wait_for_count(50)
        receiver.wait_for(
            lambda _: len(attempts(db_file, subscription_id)) >= 50, "attempts recorded"
        )
    ids = [event["event_id"] for event in receiver.events()]
    assert len(ids) == len(set(ids)) == 50
    assert [event["change_seq"] for event in receiver.events()] == committed_changes(db_file)


def test_metrics_count_pending_attempts_and_lag(db_file: Path) -> None:
    def refuse(number: int, request: Received) -> tuple[int, dict[str, str]]:
        return (202, {}) if number == 0 else (500, {"retry-after": "3600"})

    with receiving(refuse) as receiver:
        subscription_id, _ = subscribe(db_file, receiver.url)
        with serve(db_file, "--log-format", "off", env=env(), metrics=True) as server:
            import_records(db_file, source(1), source(2), source(3))
            receiver.wait_for_count(2)
            assert server.metrics_url is not None

            def scraped() -> dict[tuple[str, str], float]:
                text = httpx.get(server.metrics_url, timeout=10).text
                return {
                    (sample.name, next(iter(sample.labels.values()), "")): sample.value
                    for family in text_string_to_metric_families(text)
                    for sample in family.samples
                    if sample.name.startswith("leasestar_webhook")
                }

            receiver.wait_for(
                lambda _: scraped().get(("leasestar_webhook_attempts", "retry")) == 1,
                "the retry counted",
            )
            figures = scraped()
    assert figures[("leasestar_webhook_attempts", "delivered")] == 1
    assert figures[("leasestar_webhook_pending_events", subscription_id)] == 2
    assert figures[("leasestar_webhook_lag_seconds", subscription_id)] > 0


def test_a_filtered_subscription_moves_past_events_it_does_not_receive(
    db_file: Path, receiver: Receiver
) -> None:
    subscription_id, _ = subscribe(db_file, receiver.url, integrations=["int_2"])

    def delivered_through() -> int:
        with sqlite3.connect(db_file) as connection:
            (seq,) = connection.execute(
                "SELECT delivered_through FROM webhook_subscriptions WHERE id = ?",
                (subscription_id,),
            ).fetchone()
        return int(seq)

    with serve(db_file, "--log-format", "off", env=env()):
        # Only other integrations' records: nothing for it, yet its cursor must reach them,
        # or the outbox is never pruned below it.
        import_records(db_file, source(1), source(2))
        last = max(committed_changes(db_file))
        receiver.wait_for(lambda _: delivered_through() == last, "the cursor past them")
    assert receiver.received == []


def test_loopback_and_private_receivers_are_refused_by_default(
    db_file: Path, receiver: Receiver
) -> None:
    subscription_id, _ = subscribe(db_file, receiver.url)
    refusing = env()
    del refusing["LEASESTAR_WEBHOOK_ALLOW_PRIVATE"]
    with serve(db_file, "--log-format", "off", env=refusing):
        import_records(db_file, source(1))
        receiver.wait_for(
            lambda _: len(attempts(db_file, subscription_id)) >= 2, "two refused attempts"
        )
    assert receiver.received == []
    assert {row[2:] for row in attempts(db_file, subscription_id)} == {("retry", None)}
