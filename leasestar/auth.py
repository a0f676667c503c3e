"""Bearer tokens: how they are made and stored, and the middleware that checks them.

A token reads `lst_<token_id>_<secret>`: a public id (12 hex digits) and 256 bits from
`secrets`. It is shown once, when it is created; the database keeps only its SHA-256.
With that much entropy a plain hash (no salt, no stretching) is the right tool. A
request's token is found by its id, then its hash is compared with the stored one in
constant time (`hmac.compare_digest`): the time taken can reveal whether an id exists,
never anything about a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from leasestar.asgi import header_value
from leasestar.database import read_uri
from leasestar.instants import format_instant, now_micros

TOKEN_PREFIX: Final = "lst_"  # noqa: S105 - a prefix that makes leaked tokens greppable, not a secret
# An `Authorization` header holding one of our tokens: `Bearer` (any case), the token,
# and its public id. Any other header, a malformed bearer or someone else's token, is
# refused alike, so one pattern decides.
_BEARER_TOKEN = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(lst_([0-9a-f]{12})_[A-Za-z0-9_-]{43}) *")
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


# Compared with when a public id is unknown: the length of a real hash, matching none.
_NO_TOKEN_HASH: Final = bytes(32)


@dataclass(frozen=True, slots=True)
class _ActiveToken:
    holder: TokenHolder
    token_hash: bytes


class TokenRegistry:
    """The active tokens, held in memory and reloaded whenever the database changed.

    Every request needs its token checked, and the tokens table is tiny, so it lives in
    memory. `PRAGMA data_version` tells, in about a microsecond and without I/O beyond
    the WAL index, whether any other connection committed since the last look; then the
    table is read again. A revocation is therefore seen by the very next request, with
    no database round trip on the hot path. The connection is read-only and used only
    from the event loop.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._db = sqlite3.connect(read_uri(path), uri=True, check_same_thread=False)
        self._version: int | None = None
        self._active: dict[str, _ActiveToken] = {}

    def close(self) -> None:
        self._db.close()

    def reopen(self) -> None:
        """A new connection, after `close` (the database's WAL index was replaced:
        database.py, `ReadPool`); the tokens are read again on the next request."""
        self._db = sqlite3.connect(read_uri(self._path), uri=True, check_same_thread=False)
        self._version = None

    def find(self, public_id: str) -> _ActiveToken | None:
        (version,) = self._db.execute("PRAGMA data_version").fetchone()
        if version != self._version:
            rows = self._db.execute(
                "SELECT name, token_id, token_hash, integrations, (SELECT "
                "group_concat(permission) FROM token_permissions AS p WHERE p.name = t.name) "
                "FROM tokens AS t WHERE revoked_at IS NULL"
            ).fetchall()
            self._active = {
                token_key: _ActiveToken(
                    TokenHolder(
                        name,
                        frozenset(json.loads(scope)) if scope is not None else None,
                        frozenset(allowed.split(",")) if allowed else frozenset(),
                    ),
                    bytes(stored_hash),
                )
                for name, token_key, stored_hash, scope, allowed in rows
            }
            self._version = version
        return self._active.get(public_id)


def authenticate(
    headers: Iterable[tuple[bytes, bytes]], registry: TokenRegistry
) -> AuthenticationResult:
    """The holder of the request's bearer token, or `NotAuthorizedException`: the one check
    of a token, for `BearerTokenMiddleware` and the direct route of get by id alike."""
    # The raw header list, not Litestar's Headers: building that object for one lookup
    # cost more than the rest of this check.
    match = _BEARER_TOKEN.fullmatch(header_value(headers, b"authorization") or "")
    if match is None:
        raise NotAuthorizedException()
    token, public_id = match.groups()
    active = registry.find(public_id)
    # The whole token's hash is computed and compared in constant time whether or not
    # the public id is known (an unknown one against a hash no token has), so the
    # answer's timing does not tell which public ids exist.
    stored = active.token_hash if active is not None else _NO_TOKEN_HASH
    if not hmac.compare_digest(stored, hash_token(token)) or active is None:
        raise NotAuthorizedException()
    return AuthenticationResult(user=active.holder, auth=public_id)


class BearerTokenMiddleware(AbstractAuthenticationMiddleware):
    """Resolves the bearer token to a `TokenHolder`, or answers 401."""

    async def authenticate_request(
        self, connection: ASGIConnection[Any, Any, Any, Any]
    ) -> AuthenticationResult:
        return authenticate(connection.scope["headers"], connection.app.state.tokens)
