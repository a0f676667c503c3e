"""`GET /v1/applicants/{id}` answered in front of Litestar's router, with the same rules.

Get by id is the route clients call most, and its own work is small (a token check, one
indexed row, an ETag). Measured in-process (`benchmarks/direct_route_cost.py` at commit
d986a0d), 42 % of a get's instructions went to finding the route, building a `Request`,
the signature and kwargs models, turning the handler's answer into a response and two
exception layers; none of them decides anything for this route, whose one parameter is a
string taken from the path and whose handler reads its query itself.

So this ASGI layer, placed in front of Litestar's ASGI handler (inside the observability,
hygiene and compression wrappers, which see every request as before), answers the route
with the pieces the Litestar route is made of:

- the token is checked by `auth.authenticate`, the body of `BearerTokenMiddleware`;
- the rate limit and the per-token concurrency cap are the API router's own
  `SharedRateLimitMiddleware` definition, its `admit` called before the answer (and the
  turn it gives, under the per-token cap, handed back after it);
- the answer is `controller.record_answer`, the body of the route's handler;
- an error is handled by Litestar's exception layer with the app's handlers
  (`errors.py`), at the level it is on the route: an error of the answer inside the
  rate limit (so it carries the limit's headers), of the token or the limit outside.

The route stays declared in the controller (the OpenAPI document, and the path for
anything this layer leaves): a request that is not a plain `GET` (or `HEAD`, routed as
`GET` by `hygiene.py`) of one path segment after `/v1/applicants/` goes on to Litestar,
as does a path Litestar would normalise first (a trailing or doubled slash), a root path,
and a `Host` header Litestar refuses. `tests/applicants/test_direct_route.py` sends the
same requests both ways and compares every byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, cast

from litestar import Litestar
from litestar.exceptions import LitestarException
from litestar.middleware import DefineMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send
from litestar.utils.scope.state import ScopeState

from leasestar.applicants.controller import record_answer
from leasestar.auth import authenticate
from leasestar.litestar_private import ExceptionHandlerMiddleware, is_valid_host
from leasestar.rate_limit import SharedRateLimitMiddleware

PREFIX: Final = "/v1/applicants/"


class _AnswerStarted(LitestarException):
    """An error once the answer has begun: nothing more can be sent (Litestar's exception
    layer raises the same in its place)."""


class DirectRecordRoute:
    """Answers `GET /v1/applicants/{id}` itself; passes every other request to `app`."""

    def __init__(self, app: ASGIApp, litestar: Litestar, rate_limit: DefineMiddleware | None):
        self.app = app
        self._state = litestar.state
        # What Litestar's router finds for the route, asked once: the handler (errors are
        # handled with its exception handlers) and the template the metrics and the
        # access log name the route by.
        _, handler, _, _, template = litestar.asgi_router.handle_routing(
            path=f"{PREFIX}id", method="GET"
        )
        self._route_handler = handler
        self._path_template = template
        self._exception_handlers = handler.resolve_exception_handlers()
        # The API router's limiter, applied by a plain call (`admit`): as a layer
        # around the answer it was a coroutine more per get.
        self._limiter = (
            None
            if rate_limit is None
            else cast("SharedRateLimitMiddleware", rate_limit(self._answer))
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        applicant_id = _applicant_id(scope)
        if applicant_id is None:
            await self.app(scope, receive, send)
            return
        scope["route_handler"] = self._route_handler
        scope["path_template"] = self._path_template
        scope["path_params"] = {"id": applicant_id}
        try:
            authenticated = authenticate(scope["headers"], self._state["tokens"])
            scope["user"] = authenticated.user
            scope["auth"] = authenticated.auth
            limiter = self._limiter
            if limiter is None:
                await self._answer(scope, receive, send)
                return
            turn = limiter.admit(scope)
            if turn is None:  # no per-token cap: nothing to hand back
                await self._answer(scope, receive, send)
                return
            turns, key, waits = turn
            if waits:
                await turns.wait_turn(key)
            try:
                await self._answer(scope, receive, send)
            finally:
                turns.finish(key)
        except _AnswerStarted:
            raise
        except Exception as error:  # before anything was sent
            await self._refuse(scope, receive, send, error)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The handler's answer, or its error (with the rate limit's headers, which ride on
        the scope)."""
        try:
            response = await record_answer(
                self._state["reader"], scope, scope["user"], scope["path_params"]["id"]
            )
        except Exception as error:
            await self._refuse(scope, receive, send, error)
            return
        try:
            await response(scope, receive, send)
        except Exception as error:
            raise _AnswerStarted("Exception caught after response started") from error

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, error: Exception) -> None:
        """`error` handled by Litestar's own exception layer, as on the route: logged if the
        app logs exceptions, then answered by the handler `errors.py` maps it to."""

        async def raising(scope: Scope, receive: Receive, send: Send) -> None:
            raise error

        ScopeState.from_scope(scope).exception_handlers = self._exception_handlers
        await ExceptionHandlerMiddleware(raising, debug=None)(scope, receive, send)


def _applicant_id(scope: Mapping[str, Any]) -> str | None:
    """The id of a request this route answers exactly as Litestar's route would; None for
    any other request."""
    if scope["type"] != "http" or scope["method"] != "GET" or scope.get("root_path"):
        return None
    path: str = scope["path"]
    if not path.startswith(PREFIX):
        return None
    applicant_id = path[len(PREFIX) :]
    if not applicant_id or "/" in applicant_id:
        return None
    # Litestar refuses a malformed Host header (400) before routing: left to it.
    for name, value in scope["headers"]:
        if name == b"host":
            return applicant_id if is_valid_host(value) else None
    return applicant_id
