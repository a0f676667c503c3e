"""`leasestar webhook ...`: create, list, revoke, rotate-secret and deliveries.

A secret is printed once, by the command that makes it (create, rotate-secret); no
command shows it again.
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path
from typing import Final

from leasestar.commands import open_to_read
from leasestar.database import open_for_write
from leasestar.instants import format_instant, now_micros
from leasestar.replica.layout import refuse_writes
from leasestar.webhooks.outbox import EVENT_TYPES
from leasestar.webhooks.payloads import events_query
from leasestar.webhooks.subscriptions import (
    DEFAULT_GRACE_SECONDS,
    SIGNING_FORMS,
    Subscription,
    SubscriptionError,
    create_subscription,
    find_subscription,
    list_subscriptions,
    revoke_subscription,
    rotate_secret,
)

DEFAULT_SHOWN: Final = 20
_ANSWER_SHOWN: Final = 60


def _path(args: argparse.Namespace) -> Path:
    return Path(args.db)


def _writable(args: argparse.Namespace) -> sqlite3.Connection:
    refuse_writes(_path(args))  # a replica's subscriptions are its primary's
    return open_for_write(_path(args))


def _readable(args: argparse.Namespace) -> sqlite3.Connection:
    return open_to_read(_path(args))


def add_parser(subcommands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    webhook = subcommands.add_parser("webhook", help="manage webhook subscriptions")
    actions = webhook.add_subparsers(dest="webhook_command", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", parents=[common], help="subscribe a URL to changes; prints its secret once"
    )
    create.add_argument("--url", required=True, help="http(s) URL the events are POSTed to")
    create.add_argument(
        "--integration",
        action="append",
        metavar="ID",
        help="only this integration_id's records (repeatable; none = all)",
    )
    create.add_argument(
        "--event",
        action="append",
        choices=EVENT_TYPES,
        help="only these events (repeatable; none = both)",
    )
    create.add_argument(
        "--signing",
        choices=SIGNING_FORMS,
        default="standard",
        help="signature headers: standard (Standard Webhooks) or propexo (default standard)",
    )
    create.set_defaults(handler=create_command)
    listing = actions.add_parser("list", parents=[common], help="list subscriptions")
    listing.set_defaults(handler=list_command)
    revoke = actions.add_parser("revoke", parents=[common], help="stop sending to a subscription")
    revoke.add_argument("id", metavar="ID")
    revoke.set_defaults(handler=revoke_command)
    rotate = actions.add_parser(
        "rotate-secret",
        parents=[common],
        help="a new secret (printed once); the old one signs too for the grace period",
    )
    rotate.add_argument("id", metavar="ID")
    rotate.add_argument(
        "--grace",
        type=int,
        default=DEFAULT_GRACE_SECONDS,
        metavar="SECONDS",
        help=f"how long the old secret keeps signing (default {DEFAULT_GRACE_SECONDS})",
    )
    rotate.set_defaults(handler=rotate_command)
    deliveries = actions.add_parser(
        "deliveries", parents=[common], help="what was sent, when, the answer, what is pending"
    )
    deliveries.add_argument("id", metavar="ID", nargs="?", help="one subscription (default all)")
    deliveries.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_SHOWN,
        metavar="N",
        help=f"latest attempts shown per subscription (default {DEFAULT_SHOWN})",
    )
    deliveries.set_defaults(handler=deliveries_command)


def create_command(args: argparse.Namespace) -> int:
    connection = _writable(args)
    try:
        created = create_subscription(
            connection,
            args.url,
            integrations=tuple(args.integration or ()),
            events=tuple(args.event or ()),
            signing=args.signing,
        )
    finally:
        connection.close()
    print(f"webhook {created.id} -> {created.url} ({_scope(created)}; {created.signing} signing)")
    print("its signing secret is shown once, store it now:")
    print(created.secret)
    return 0


def _scope(subscription: Subscription) -> str:
    integrations = ",".join(sorted(subscription.integrations)) if subscription.integrations else "*"
    return f"events {','.join(sorted(subscription.events))}; integrations {integrations}"


def _state(subscription: Subscription) -> str:
    if subscription.revoked_at is not None:
        return f"revoked {format_instant(subscription.revoked_at)}"
    if subscription.disabled_at is not None:
        return f"disabled ({subscription.disabled_reason})"
    return "active"


def list_command(args: argparse.Namespace) -> int:
    connection = _readable(args)
    try:
        found = list_subscriptions(connection)
    finally:
        connection.close()
    print(f"{'ID':<28} {'SIGNING':<9} {'CREATED':<25} {'STATE':<12} URL / SCOPE")
    for subscription in found:
        created = format_instant(subscription.created_at)
        print(
            f"{subscription.id:<28} {subscription.signing:<9} {created:<25} "
            f"{_state(subscription):<12} {subscription.url} ({_scope(subscription)})"
        )
    return 0


def revoke_command(args: argparse.Namespace) -> int:
    connection = _writable(args)
    try:
        revoke_subscription(connection, args.id)
    finally:
        connection.close()
    print(f"revoked webhook {args.id}")
    return 0


def rotate_command(args: argparse.Namespace) -> int:
    if args.grace < 0:
        raise SubscriptionError("--grace must be a non-negative number of seconds")
    connection = _writable(args)
    try:
        secret = rotate_secret(connection, args.id, grace_seconds=args.grace)
    finally:
        connection.close()
    print(f"webhook {args.id}: new secret (the previous one signs too for {args.grace} s);")
    print("it is shown once, store it now:")
    print(secret)
    return 0


def _pending(connection: sqlite3.Connection, subscription: Subscription) -> tuple[int, int | None]:
    """Events not yet done: how many, and when the oldest was written."""
    query, params = events_query(subscription)
    rows = connection.execute(
        f"SELECT count(*), min(created_at) FROM ({query})",
        (subscription.delivered_through, *params, -1),
    ).fetchone()
    return int(rows[0]), rows[1]


def deliveries_command(args: argparse.Namespace) -> int:
    connection = _readable(args)
    try:
        if args.id is not None:
            one = find_subscription(connection, args.id)
            if one is None:
                raise SubscriptionError(f"no webhook subscription {args.id!r}")
            chosen = [one]
        else:
            chosen = list_subscriptions(connection)
        now = now_micros()
        for subscription in chosen:
            pending, oldest = (
                _pending(connection, subscription) if subscription.active else (0, None)
            )
            age = f", oldest written {(now - oldest) / 1e6:.1f} s ago" if oldest else ""
            print(f"{subscription.id} {subscription.url} [{_state(subscription)}]")
            print(f"  pending: {pending} event(s){age}")
            rows = connection.execute(
                "SELECT a.attempted_at, a.change_seq, e.event_id, a.attempt, a.outcome, "
                "a.status, a.answer, a.next_attempt_at FROM webhook_attempts AS a "
                "LEFT JOIN webhook_events AS e ON e.change_seq = a.change_seq "
                "WHERE a.subscription_id = ? ORDER BY a.attempted_at DESC, a.change_seq DESC "
                "LIMIT ?",
                (subscription.id, max(args.limit, 0)),
            ).fetchall()
            for at, seq, event_id, attempt, outcome, status, answer, next_at in rows:
                retry = f" next attempt {format_instant(next_at)}" if next_at else ""
                short = " ".join(str(answer).split())[:_ANSWER_SHOWN]
                print(
                    f"  {format_instant(at)} change {seq} {event_id or '(pruned)'} "
                    f"attempt {attempt}: {outcome} {status if status is not None else '-'} "
                    f"{short!r}{retry}"
                )
    finally:
        connection.close()
    return 0
