"""The middleware that checks a request's bearer token (tokens.py makes and stores them).

A request's token is found by its id, then its hash is compared with the stored one in
constant time (`hmac.compare_digest`): the time taken can reveal whether an id exists,
never anything about a secret.
"""

from __future__ import annotations

import hmac
import json
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from leasestar.asgi import header_value
from leasestar.database import read_uri
from leasestar.tokens import TokenHolder, hash_token

# An `Authorization` header holding one of our tokens: `Bearer` (any case), the token,
# and its public id. Any other header, a malformed bearer or someone else's token, is
# refused alike, so one pattern decides.
_BEARER_TOKEN = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(lst_([0-9a-f]{12})_[A-Za-z0-9_-]{43}) *")

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
    of a token, for `BearerTokenMiddleware` and the direct routes (list, get by id) alike."""
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
