"""Webhook subscriptions: where events go, which ones, and the secrets that sign them.

Created, listed, revoked and given a new secret by the CLI (`leasestar webhook`) and by
/v1/webhooks/ alike; every change is one short transaction, so a writer that starts
after it sees it whole (outbox.py). A new subscription's cursor starts at the current
change sequence: it is sent the changes committed after it, never the history.
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from leasestar.instants import now_micros
from leasestar.webhooks.outbox import EVENT_TYPES

SIGNING_FORMS: Final = ("propexo", "standard")
STANDARD_SECRET_PREFIX: Final = "whsec_"  # noqa: S105 - the Standard Webhooks prefix, not a secret
# The previous secret still signs this long after a rotation, so receivers can move to
# the new one without losing a delivery.
DEFAULT_GRACE_SECONDS: Final = 24 * 3600
MAX_URL_LENGTH: Final = 2048
# Each active subscription is a task, a connection and a query every POLL_SECONDS in
# the delivering worker, on the threads /health shares: a token with the webhooks
# permission must not be able to add them without end.
MAX_ACTIVE_SUBSCRIPTIONS: Final = 50
_COLUMNS: Final = (
    "id, url, integrations, events, signing, secret, previous_secret, previous_until, "
    "created_at, updated_at, revoked_at, disabled_at, disabled_reason, delivered_through"
)


class SubscriptionError(Exception):
    """A subscription cannot be created or changed as asked; the message is one line."""


@dataclass(frozen=True, slots=True)
class Subscription:
    id: str
    url: str
    integrations: frozenset[str] | None  # None: every integration
    events: frozenset[str]
    signing: str
    secret: str
    previous_secret: str | None
    previous_until: int | None
    created_at: int
    updated_at: int
    revoked_at: int | None
    disabled_at: int | None
    disabled_reason: str | None
    delivered_through: int

    @property
    def active(self) -> bool:
        return self.revoked_at is None and self.disabled_at is None

    def secrets_at(self, now: int) -> tuple[str, ...]:
        """The secrets that sign at `now`: the current one, and the previous one during
        its grace period."""
        if self.previous_secret is not None and (self.previous_until or 0) > now:
            return (self.secret, self.previous_secret)
        return (self.secret,)


def new_secret(signing: str) -> str:
    if signing == "standard":
        return STANDARD_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
    return secrets.token_hex(32)


def check_url(url: str) -> str:
    if len(url) > MAX_URL_LENGTH:
        raise SubscriptionError(f"url: longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError as error:
        raise SubscriptionError(f"url: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SubscriptionError("url: must be an absolute http:// or https:// URL")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise SubscriptionError("url: must not contain spaces or control characters")
    return url


def check_secret(signing: str, secret: str) -> str:
    """A secret given by the caller (Propexo's API lets one be chosen)."""
    if signing == "standard":
        encoded = secret.removeprefix(STANDARD_SECRET_PREFIX)
        try:
            key = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise SubscriptionError("secret: a standard secret is whsec_ and base64") from None
        if not 24 <= len(key) <= 64:
            raise SubscriptionError("secret: a standard secret holds 24 to 64 bytes")
        return STANDARD_SECRET_PREFIX + encoded
    if not 10 <= len(secret) <= 256 or not secret.isprintable():
        raise SubscriptionError("secret: 10 to 256 printable characters")
    return secret


def create_subscription(
    connection: sqlite3.Connection,
    url: str,
    *,
    integrations: Sequence[str] = (),
    events: Sequence[str] = (),
    signing: str = "standard",
    secret: str | None = None,
) -> Subscription:
    """Store a new subscription (the returned one holds the secret, shown once)."""
    check_url(url)
    if signing not in SIGNING_FORMS:
        raise SubscriptionError(f"signing: one of {', '.join(SIGNING_FORMS)}")
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise SubscriptionError(f"event: {unknown[0]!r} is not one of {', '.join(EVENT_TYPES)}")
    if any(not integration for integration in integrations):
        raise SubscriptionError("an --integration id cannot be empty")
    secret = check_secret(signing, secret) if secret is not None else new_secret(signing)
    subscription_id = "whk_" + secrets.token_hex(12)
    now = now_micros()
    scope = json.dumps(sorted(set(integrations))) if integrations else None
    kinds = json.dumps(sorted(set(events) or set(EVENT_TYPES)))
    with connection:
        connection.execute("BEGIN IMMEDIATE")  # the sequence read is the one written next
        (active,) = connection.execute(
            "SELECT count(*) FROM webhook_subscriptions "
            "WHERE revoked_at IS NULL AND disabled_at IS NULL"
        ).fetchone()
        if active >= MAX_ACTIVE_SUBSCRIPTIONS:
            raise SubscriptionError(
                f"at most {MAX_ACTIVE_SUBSCRIPTIONS} active subscriptions: revoke one first"
            )
        connection.execute(
            f"INSERT INTO webhook_subscriptions ({_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?, NULL, NULL, NULL, "
            "(SELECT change_seq FROM sync_state))",
            (subscription_id, url, scope, kinds, signing, secret, now, now),
        )
    found = find_subscription(connection, subscription_id)
    assert found is not None
    return found


def _subscription(row: tuple[object, ...]) -> Subscription:
    (id_, url, scope, kinds, signing, secret, previous, until, created, updated, revoked,
     disabled, reason, through) = row  # fmt: skip
    return Subscription(
        id=str(id_),
        url=str(url),
        integrations=frozenset(json.loads(str(scope))) if scope is not None else None,
        events=frozenset(json.loads(str(kinds))),
        signing=str(signing),
        secret=str(secret),
        previous_secret=str(previous) if previous is not None else None,
        previous_until=int(str(until)) if until is not None else None,
        created_at=int(str(created)),
        updated_at=int(str(updated)),
        revoked_at=int(str(revoked)) if revoked is not None else None,
        disabled_at=int(str(disabled)) if disabled is not None else None,
        disabled_reason=str(reason) if reason is not None else None,
        delivered_through=int(str(through)),
    )


def list_subscriptions(
    connection: sqlite3.Connection, *, include_revoked: bool = True
) -> list[Subscription]:
    where = "" if include_revoked else " WHERE revoked_at IS NULL"
    rows = connection.execute(
        f"SELECT {_COLUMNS} FROM webhook_subscriptions{where} ORDER BY created_at, id"
    ).fetchall()
    return [_subscription(row) for row in rows]


def find_subscription(connection: sqlite3.Connection, subscription_id: str) -> Subscription | None:
    row = connection.execute(
        f"SELECT {_COLUMNS} FROM webhook_subscriptions WHERE id = ?",
        (subscription_id,),
    ).fetchone()
    return _subscription(row) if row is not None else None


def _known(connection: sqlite3.Connection, subscription_id: str) -> Subscription:
    found = find_subscription(connection, subscription_id)
    if found is None:
        raise SubscriptionError(f"no webhook subscription {subscription_id!r}")
    if found.revoked_at is not None:
        raise SubscriptionError(f"webhook subscription {subscription_id!r} is revoked")
    return found


def revoke_subscription(connection: sqlite3.Connection, subscription_id: str) -> None:
    """Send nothing more to it (events already sent stay in its history)."""
    _known(connection, subscription_id)
    now = now_micros()
    with connection:
        connection.execute(
            "UPDATE webhook_subscriptions SET revoked_at = ?, updated_at = ? "
            "WHERE id = ? AND revoked_at IS NULL",
            (now, now, subscription_id),
        )


def rotate_secret(
    connection: sqlite3.Connection,
    subscription_id: str,
    *,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    secret: str | None = None,
) -> str:
    """A new secret (returned, shown once); the current one keeps signing beside it for
    `grace_seconds`."""
    found = _known(connection, subscription_id)
    fresh = check_secret(found.signing, secret) if secret is not None else new_secret(found.signing)
    now = now_micros()
    with connection:
        connection.execute(
            "UPDATE webhook_subscriptions SET previous_secret = secret, previous_until = ?, "
            "secret = ?, updated_at = ? WHERE id = ?",
            (now + grace_seconds * 1_000_000, fresh, now, subscription_id),
        )
    return fresh
