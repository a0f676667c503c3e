"""`leasestar webhook ...` as a user runs it (issue 28, points 1 and 4)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from standardwebhooks.webhooks import Webhook

from tests.applicants.lines import T1, source
from tests.test_cli_tokens import leasestar, one_line_error
from tests.test_hardening import serve
from tests.webhooks.receiver import Received, receiving
from tests.webhooks.test_delivery import env, import_records

SUBSCRIPTION_ID = re.compile(r"whk_[0-9a-f]{24}")


def created(result_stdout: str) -> tuple[str, str]:
    """(id, secret) from `webhook create`'s output."""
    found = SUBSCRIPTION_ID.search(result_stdout)
    assert found is not None, result_stdout
    return found.group(), result_stdout.strip().splitlines()[-1]


def test_create_list_rotate_revoke(db_path: Path) -> None:
    made = leasestar(
        "webhook", "create", "--db", db_path, "--url", "http://127.0.0.1:9/hook",
        "--integration", "int_1", "--event", "DATA_NEW", "--signing", "standard",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    subscription_id, secret = created(made.stdout)
    assert secret.startswith("whsec_")
    listed = leasestar("webhook", "list", "--db", db_path)
    assert subscription_id in listed.stdout
    assert "int_1" in listed.stdout
    assert "DATA_NEW" in listed.stdout
    assert "active" in listed.stdout
    assert secret not in listed.stdout  # never shown again
    rotated = leasestar("webhook", "rotate-secret", "--db", db_path, subscription_id)
    assert rotated.returncode == 0, rotated.stderr
    new_secret = rotated.stdout.strip().splitlines()[-1]
    assert new_secret.startswith("whsec_")
    assert new_secret != secret
    with sqlite3.connect(db_path) as connection:
        stored = connection.execute(
            "SELECT secret, previous_secret FROM webhook_subscriptions WHERE id = ?",
            (subscription_id,),
        ).fetchone()
    assert stored == (new_secret, secret)
    revoked = leasestar("webhook", "revoke", "--db", db_path, subscription_id)
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in leasestar("webhook", "list", "--db", db_path).stdout
    for text in (listed.stdout, leasestar("webhook", "deliveries", "--db", db_path).stdout):
        assert secret not in text
        assert new_secret not in text


def test_refusals_are_one_line(db_path: Path) -> None:
    cases = [
        (("webhook", "create", "--db", db_path, "--url", "ftp://example.com/"), "url:"),
        (("webhook", "create", "--db", db_path, "--url", "http://h:99999/"), "url:"),
        (("webhook", "revoke", "--db", db_path, "whk_nope"), "no webhook subscription"),
        (("webhook", "rotate-secret", "--db", db_path, "whk_nope"), "no webhook subscription"),
        (("webhook", "deliveries", "--db", db_path, "whk_nope"), "no webhook subscription"),
    ]
    for args, expected in cases:
        line = one_line_error(leasestar(*args))
        assert expected in line, line


def test_deliveries_show_what_was_sent_the_answer_and_what_is_pending(db_path: Path) -> None:
    def refuse_second(number: int, request: Received) -> tuple[int, dict[str, str]]:
        if request.event["record_id"] and request.event["data"]["x_id"] == "X0002":
            return 500, {"retry-after": "3600"}  # retried in an hour: pending meanwhile
        return 202, {}

    with receiving(refuse_second) as receiver:
        made = leasestar("webhook", "create", "--db", db_path, "--url", receiver.url)
        subscription_id, secret = created(made.stdout)
        with serve(db_path, "--log-format", "off", env=env()):
            import_records(db_path, source(1), source(2), source(3), seen_at=T1)
            receiver.wait_for_count(2)
            receiver.wait_for(
                lambda _: (
                    "attempt 1: retry 500"
                    in leasestar("webhook", "deliveries", "--db", db_path).stdout
                ),
                "the failed attempt shown",
            )
        shown = leasestar("webhook", "deliveries", "--db", db_path, subscription_id).stdout
    Webhook(secret).verify(receiver.received[0].body, receiver.received[0].headers)
    first, second = (request.event for request in receiver.received[:2])
    assert f"{first['event_id']} attempt 1: delivered 202 'ok'" in shown
    assert f"{second['event_id']} attempt 1: retry 500 'ok' next attempt" in shown
    assert "pending: 2 event(s)" in shown  # the refused one and the one behind it


def test_a_bad_retry_setting_is_refused_in_one_line(db_path: Path) -> None:
    import subprocess
    import sys

    from tests.servers import free_port
    from tests.test_cli_tokens import _clean_env

    port = str(free_port())
    result = subprocess.run(
        [sys.executable, "-m", "leasestar", "serve", "--db", str(db_path), "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_clean_env(), "LEASESTAR_WEBHOOK_RETRY_HORIZON": "soon"},
        check=False,
    )
    assert one_line_error(result) == (
        "leasestar: LEASESTAR_WEBHOOK_RETRY_HORIZON must be a positive number of seconds"
    )
