"""Bearer tokens: how they are made and stored (the `tokens` table), and how a token is
kept out of text that shows it.

A token reads `lst_<token_id>_<secret>`: a public id (12 hex digits) and 256 bits from
`secrets`. It is shown once, when it is created; the database keeps only its SHA-256.
With that much entropy a plain hash (no salt, no stretching) is the right tool. How a
request's token is checked is auth.py's.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sqlite3
from dataclasses import dataclass
from typing import Final

import msgspec

from leasestar.instants import format_instant, now_micros

TOKEN_PREFIX: Final = "lst_"  # noqa: S105 - a prefix that makes leaked tokens greppable, not a secret
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# What a token may do besides reading applicants (table token_permissions).
PERMISSIONS: Final = ("webhooks",)  # webhooks: manage subscriptions at /v1/webhooks/


@dataclass(frozen=True, slots=True)
class TokenHolder:
    """Who is calling: the token's name, the integrations it may see (None = all) and what
    else it may do."""

    name: str
    integrations: frozenset[str] | None
    permissions: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class TokenInfo:
    name: str
    created_at: str
    revoked_at: str | None
    integrations: tuple[str, ...] | None


class TokenError(Exception):
    """A token command cannot be done; the message is one line."""


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def create_token(
    connection: sqlite3.Connection,
    name: str,
    integrations: tuple[str, ...] = (),
    permissions: tuple[str, ...] = (),
) -> str:
    """Store a new token's hash under a unique name and return the token (shown once)."""
    if _NAME.fullmatch(name) is None:
        raise TokenError(
            "token name must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if any(not integration for integration in integrations):
        raise TokenError("an --integration id cannot be empty")
    unknown = sorted(set(permissions) - set(PERMISSIONS))
    if unknown:
        raise TokenError(f"unknown permission {unknown[0]!r}: one of {', '.join(PERMISSIONS)}")
    token_id = secrets.token_hex(6)
    token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    scope = json.dumps(sorted(set(integrations))) if integrations else None
    try:
        with connection:
            connection.execute(
                "INSERT INTO tokens (name, token_id, token_hash, created_at, integrations) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, token_id, hash_token(token), now_micros(), scope),
            )
            connection.executemany(
                "INSERT OR IGNORE INTO token_permissions (name, permission) VALUES (?, ?)",
                [(name, permission) for permission in permissions],
            )
    except sqlite3.IntegrityError:
        raise TokenError(f"a token named {name!r} already exists") from None
    return token


def list_tokens(connection: sqlite3.Connection) -> list[TokenInfo]:
    rows = connection.execute(
        "SELECT name, created_at, revoked_at, integrations FROM tokens ORDER BY created_at, name"
    ).fetchall()
    return [
        TokenInfo(
            name=name,
            created_at=format_instant(created_at),
            revoked_at=format_instant(revoked_at) if revoked_at is not None else None,
            integrations=tuple(json.loads(scope)) if scope is not None else None,
        )
        for name, created_at, revoked_at, scope in rows
    ]


def revoke_token(connection: sqlite3.Connection, name: str) -> None:
    with connection:
        cursor = connection.execute(
            "UPDATE tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
            (now_micros(), name),
        )
    if cursor.rowcount == 0:
        known = connection.execute("SELECT 1 FROM tokens WHERE name = ?", (name,)).fetchone()
        raise TokenError(
            f"token {name!r} is already revoked" if known else f"no token named {name!r}"
        )


# Anything shaped like one of our tokens, found inside other text (a URL a client put a
# token in by mistake): the public id and the secret, which `redact_token_secrets` hides.
_TOKEN_IN_TEXT: Final = re.compile(r"(lst_[0-9a-f]{12}_)[A-Za-z0-9_-]+")


def redact_token_secrets(text: str) -> str:
    """`text` with the secret part of every token in it replaced by `REDACTED`; the public
    id stays, so a log line still says which token it was."""
    if "lst_" not in text:
        return text
    return _TOKEN_IN_TEXT.sub(r"\1REDACTED", text)


def scope_label(scope: frozenset[str] | None) -> bytes:
    """A token scope as bytes, distinct for distinct scopes (a JSON array is escaped, so
    no choice of integration ids makes two scopes look alike): keys ETags and cursors."""
    return b"all" if scope is None else msgspec.json.encode(sorted(scope))
