"""/v1/webhooks/: subscriptions over HTTP, in Propexo's shape (its OpenAPI's
`/v1/webhooks/` and `/v1/webhooks/{webhook_id}`), for tokens created with
`--permission webhooks`. To any other token these routes do not exist: the same 404 as
an unknown path, whatever the method, so their existence is not disclosed.

Differences from Propexo, each because leasestar has no use or no room for it: the
`secret` is in the answer to the POST that makes it and nowhere else (it is printed
once, as by the CLI); `triggers` are DATA_NEW and DATA_UPDATE, `model` is `applicants`;
`headers` and `active: false` are refused rather than ignored; two fields of our own,
`signing` (`propexo`, the default here, or `standard`) and `integrations`. A scoped
token's subscriptions are limited to its integrations, and it sees only those.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec
from litestar import Controller, Request, Response, delete, get, post, route
from litestar.datastructures import State
from litestar.enums import HttpMethod
from litestar.exceptions import NotFoundException
from litestar.params import PathParameter

from leasestar.database import BUSY_TIMEOUT_MS, read_uri
from leasestar.errors import error_response
from leasestar.instants import format_instant
from leasestar.openapi import error_responses
from leasestar.tokens import TokenHolder
from leasestar.webhooks.outbox import EVENT_TYPES
from leasestar.webhooks.subscriptions import (
    Subscription,
    SubscriptionError,
    create_subscription,
    find_subscription,
    list_subscriptions,
    revoke_subscription,
)

PERMISSION: Final = "webhooks"
logger = logging.getLogger("leasestar.webhooks")
MODEL: Final = "applicants"
_encode = msgspec.json.Encoder().encode
_NOT_PERMITTED: Final = {
    404: "The token lacks the webhooks permission: answered as for an unknown route."
}
_NOT_VISIBLE: Final = {
    404: "No such subscription visible to this token, or the token lacks the webhooks "
    "permission (answered as for an unknown route)."
}
# A write waits BUSY_TIMEOUT_MS for the write lock, which an import may hold longer:
# then the client is told to come back (it was a 500 and a trace), nothing was written.
BUSY_RETRY_SECONDS: Final = 5
# A replica's database is written only by its follower, and a replica never sends:
# subscriptions are managed on the primary (its subscriptions reach the replica with
# the data). The routes that write answer 405, as for a method the path does not take.
_ON_A_REPLICA: Final = "a replica is read-only: manage webhook subscriptions on the primary"
_READ_ONLY: Final = {405: "This server is a replica: subscriptions are managed on the primary."}
_BUSY: Final = {
    503: "The database is busy (an import holds its write lock) or cannot be written; "
    "nothing was changed. `Retry-After` says how many seconds to wait."
}


class WebhookInput(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    url: str
    triggers: list[str]
    model: str = MODEL
    secret: str | None = None
    active: bool = True
    headers: list[dict[str, str]] = msgspec.field(default_factory=list)
    signing: str = "propexo"
    integrations: list[str] | None = None


def _allowed(request: Request[TokenHolder, Any, State]) -> TokenHolder:
    holder = request.user
    if PERMISSION not in holder.permissions:
        raise NotFoundException()  # as for a path that does not exist
    return holder


def _visible(holder: TokenHolder, subscription: Subscription) -> bool:
    if holder.integrations is None:
        return True
    return (
        subscription.integrations is not None and subscription.integrations <= holder.integrations
    )


def _shape(subscription: Subscription, secret: str | None = None) -> dict[str, Any]:
    shaped: dict[str, Any] = {
        "id": subscription.id,
        "created_at": format_instant(subscription.created_at),
        "updated_at": format_instant(subscription.updated_at),
        "url": subscription.url,
        "headers": [],
        "active": subscription.active,
        "triggers": [
            {"id": f"{subscription.id}:{trigger}", "trigger": trigger, "model": MODEL}
            for trigger in sorted(subscription.events)
        ],
        "signing": subscription.signing,
        "integrations": sorted(subscription.integrations) if subscription.integrations else None,
    }
    if secret is not None:
        shaped["secret"] = secret
    return shaped


def _json(body: object, status: int = 200) -> Response[bytes]:
    return Response(content=_encode(body), status_code=status, media_type="application/json")


def _path(request: Request[Any, Any, State]) -> Path:
    path: Path = request.app.state.database_file.path
    return path


# The handlers' database work runs on a thread: a write waits for the write lock, which
# an import can hold for a while, and the event loop must not wait with it. The schema
# is the server's own (applied on start): plain connections, no re-application.
def _reading(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(read_uri(path), uri=True)


def _writing(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return connection


def _visible_subscriptions(path: Path, holder: TokenHolder) -> list[Subscription]:
    with contextlib.closing(_reading(path)) as connection:
        return [s for s in list_subscriptions(connection, include_revoked=False)
                if _visible(holder, s)]  # fmt: skip


def _one(path: Path, holder: TokenHolder, webhook_id: str) -> Subscription:
    with contextlib.closing(_reading(path)) as connection:
        return _found(connection, holder, webhook_id)


def _create(path: Path, given: WebhookInput, integrations: list[str]) -> Subscription:
    with contextlib.closing(_writing(path)) as connection:
        return create_subscription(
            connection,
            given.url,
            integrations=integrations,
            events=given.triggers,
            signing=given.signing,
            secret=given.secret,
        )


def _revoke(path: Path, holder: TokenHolder, webhook_id: str) -> None:
    with contextlib.closing(_writing(path)) as connection:
        _found(connection, holder, webhook_id)
        revoke_subscription(connection, webhook_id)


class WebhookController(Controller):
    path = "/v1/webhooks"
    tags = ["webhooks"]  # noqa: RUF012 - Litestar reads this class attribute as declared
    security = [{"BearerToken": []}]  # noqa: RUF012 - read by Litestar as declared

    @get(
        "/",
        summary="List webhook subscriptions",
        operation_id="listWebhooks",
        responses=error_responses(400, 401, 404, described=_NOT_PERMITTED),
    )
    async def list_webhooks(self, request: Request[TokenHolder, Any, State]) -> Response[bytes]:
        """Every subscription the token may see: `{"meta": {"total"}, "results"}`, without
        secrets. Tokens without the webhooks permission get 404."""
        holder = _allowed(request)
        found = await asyncio.to_thread(_visible_subscriptions, _path(request), holder)
        results = [_shape(s) for s in found]
        return _json({"meta": {"total": len(results)}, "results": results})

    @post(
        "/",
        summary="Create a webhook subscription",
        operation_id="createWebhook",
        status_code=200,
        responses=error_responses(
            400, 401, 404, 405, 503, described={**_NOT_PERMITTED, **_READ_ONLY, **_BUSY}
        ),
    )
    async def create_webhook(self, request: Request[TokenHolder, Any, State]) -> Response[bytes]:
        """A new subscription: `{"result"}`, with its secret (shown this once). Tokens
        without the webhooks permission get 404."""
        holder = _allowed(request)
        if request.app.state.replica is not None:
            return error_response(405, _ON_A_REPLICA, headers={"Allow": "GET, HEAD"})
        try:
            given = msgspec.json.decode(await request.body(), type=WebhookInput)
        except msgspec.DecodeError as error:
            return error_response(400, f"request body: {error}")
        refusal = _refusal(given)
        if refusal is not None:
            return error_response(400, refusal)
        integrations = set(given.integrations or ())
        if holder.integrations is not None:
            if not integrations <= holder.integrations:
                return error_response(400, "integrations: outside this token's integrations")
            integrations = integrations or set(holder.integrations)
        try:
            created = await asyncio.to_thread(_create, _path(request), given, sorted(integrations))
        except SubscriptionError as error:
            return error_response(400, str(error))
        except sqlite3.OperationalError as error:
            return _busy(error)
        return _json({"result": _shape(created, created.secret)})

    @get(
        "/{webhook_id:str}",
        summary="Get a webhook subscription",
        operation_id="getWebhook",
        responses=error_responses(400, 401, 404, described=_NOT_VISIBLE),
    )
    async def get_webhook(
        self,
        request: Request[TokenHolder, Any, State],
        webhook_id: Annotated[str, PathParameter(description="The subscription's id.")],
    ) -> Response[bytes]:
        """The subscription: `{"result"}`, without its secret; 404 for an id the token
        may not see, and for tokens without the webhooks permission."""
        holder = _allowed(request)
        found = await asyncio.to_thread(_one, _path(request), holder, webhook_id)
        return _json({"result": _shape(found)})

    @delete(
        "/{webhook_id:str}",
        summary="Delete (revoke) a webhook subscription",
        operation_id="deleteWebhook",
        status_code=200,
        responses=error_responses(
            400, 401, 404, 405, 503, described={**_NOT_VISIBLE, **_READ_ONLY, **_BUSY}
        ),
    )
    async def delete_webhook(
        self,
        request: Request[TokenHolder, Any, State],
        webhook_id: Annotated[str, PathParameter(description="The subscription's id.")],
    ) -> Response[bytes]:
        """Revoke it (`{"result": {"id"}}`): nothing more is sent to it."""
        holder = _allowed(request)
        if request.app.state.replica is not None:
            return error_response(405, _ON_A_REPLICA, headers={"Allow": "GET, HEAD"})
        try:
            await asyncio.to_thread(_revoke, _path(request), holder, webhook_id)
        except sqlite3.OperationalError as error:
            return _busy(error)
        return _json({"result": {"id": webhook_id}})

    # The other methods: 404 without the permission, as on an unknown route (Litestar
    # would answer 405 and so tell that the path exists); 405 with it. Not documented.
    @route("/", http_method=[HttpMethod.PUT, HttpMethod.PATCH, HttpMethod.DELETE],
           include_in_schema=False, status_code=405)  # fmt: skip
    async def other_on_list(self, request: Request[TokenHolder, Any, State]) -> Response[bytes]:
        _allowed(request)
        return error_response(405)

    @route("/{webhook_id:str}", http_method=[HttpMethod.POST, HttpMethod.PUT, HttpMethod.PATCH],
           include_in_schema=False, status_code=405)  # fmt: skip
    async def other_on_one(
        self,
        request: Request[TokenHolder, Any, State],
        webhook_id: Annotated[str, PathParameter(description="The subscription's id.")],
    ) -> Response[bytes]:
        _allowed(request)
        return error_response(405)


def _busy(error: sqlite3.OperationalError) -> Response[bytes]:
    logger.warning("webhook subscription not written: %s", error)
    return error_response(
        503,
        "the database is busy (an import holds it); try again",
        headers={"Retry-After": str(BUSY_RETRY_SECONDS)},
    )


def _found(connection: sqlite3.Connection, holder: TokenHolder, webhook_id: str) -> Subscription:
    found = find_subscription(connection, webhook_id)
    if found is None or found.revoked_at is not None or not _visible(holder, found):
        raise NotFoundException()
    return found


def _refusal(given: WebhookInput) -> str | None:
    if given.model != MODEL:
        return f"model: only {MODEL!r} is served here"
    if not given.triggers:
        return "triggers: at least one of " + ", ".join(EVENT_TYPES)
    unknown = sorted(set(given.triggers) - set(EVENT_TYPES))
    if unknown:
        return f"triggers: {unknown[0]!r} is not one of {', '.join(EVENT_TYPES)}"
    if given.headers:
        return "headers: custom headers are not supported"
    if not given.active:
        return "active: an inactive subscription is not supported; create it when ready"
    return None
