"""`GET /v1/applicants` (a JSON page) and `GET /v1/applicants/{id}` answered in front of
Litestar's router, with the same rules.

They are the routes clients call most, and what Litestar adds to them decides nothing.
Measured in-process (`benchmarks/direct_route_cost.py` at commit d986a0d), 42 % of a
get's instructions went to finding the route, building a `Request`, the signature and
kwargs models, turning the handler's answer into a response and two exception layers;
neither route takes a typed parameter (the id is a string taken from the path, and both
handlers read their query strings themselves). A list page with `limit=1` spent half as
much again in those layers as in its own work (its answer is the same kind of pre-encoded
bytes): 108 -> 71 us in-process on 100,000 applicants (benchmarks/RESULTS.md, "The
list's direct route").

So this ASGI layer, placed in front of Litestar's ASGI handler (inside the observability,
hygiene and compression wrappers, which see every request as before), answers the two
routes with the pieces the Litestar routes are made of:

- the token is checked by `auth.authenticate`, the body of `BearerTokenMiddleware`;
- the rate limit and the per-token concurrency cap are the API router's own
  `SharedRateLimitMiddleware` definition, its `admit` called before the answer (and the
  turn it gives, under the per-token cap, handed back after it);
- the answer is `controller.list_answer` or `controller.record_answer`, the bodies of
  the routes' handlers;
- an error is handled by Litestar's exception layer with the app's handlers
  (`errors.py`), at the level it is on the route: an error of the answer inside the
  rate limit (so it carries the limit's headers), of the token or the limit outside.

The routes stay declared in the controller (the OpenAPI document, and the path for
anything this layer leaves): a request that is not a plain `GET` (or `HEAD`, routed as
`GET` by `hygiene.py`) of `/v1/applicants` or of one path segment after
`/v1/applicants/` goes on to Litestar, as does a list that asks for NDJSON (a stream,
the route's other answer), a path Litestar would normalise first (a trailing or doubled
slash), a root path, and a `Host` header Litestar refuses.
`tests/applicants/test_direct_route.py` sends the same requests both ways and compares
every byte.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from litestar import Litestar
from litestar.datastructures import State
from litestar.exceptions import LitestarException
from litestar.middleware import DefineMiddleware
from litestar.types import ASGIApp, ExceptionHandlersMap, Receive, Scope, Send
from litestar.utils.scope.state import ScopeState

from leasestar.applicants.controller import list_answer, record_answer
from leasestar.applicants.stream import wants_ndjson
from leasestar.asgi import PreEncodedJSON, header_value
from leasestar.auth import authenticate
from leasestar.litestar_private import ExceptionHandlerMiddleware, is_valid_host
from leasestar.rate_limit import SharedRateLimitMiddleware, waited_for
from leasestar.tokens import TokenHolder

LIST_PATH: Final = "/v1/applicants"
PREFIX: Final = LIST_PATH + "/"

Answer = Callable[[State, Scope, Receive, TokenHolder], Awaitable[PreEncodedJSON]]


class _AnswerStarted(LitestarException):
    """An error once the answer has begun: nothing more can be sent (Litestar's exception
    layer raises the same in its place)."""


@dataclass(frozen=True, slots=True)
class _Route:
    """One route as Litestar's router finds it (asked once), and its answer."""

    handler: Any  # the route handler: its errors are handled with its exception handlers
    template: str  # what the metrics and the access log name the route by
    exception_handlers: ExceptionHandlersMap
    answer: Answer

    @classmethod
    def of(cls, litestar: Litestar, path: str, answer: Answer) -> _Route:
        _, handler, _, _, template = litestar.asgi_router.handle_routing(path=path, method="GET")
        return cls(handler, template, handler.resolve_exception_handlers(), answer)


def _record(
    state: State, scope: Scope, receive: Receive, holder: TokenHolder
) -> Awaitable[PreEncodedJSON]:
    # Not a coroutine of its own: the route's answer is awaited once (~0.5 us a frame).
    return record_answer(state["reader"], scope, holder, scope["path_params"]["id"])


class DirectRoutes:
    """Answers `GET /v1/applicants` (JSON) and `GET /v1/applicants/{id}` itself; passes
    every other request to `app`."""

    def __init__(self, app: ASGIApp, litestar: Litestar, rate_limit: DefineMiddleware | None):
        self.app = app
        self._state = litestar.state
        self._list = _Route.of(litestar, LIST_PATH, list_answer)
        self._record = _Route.of(litestar, f"{PREFIX}id", _record)
        # The API router's limiter, applied by a plain call (`admit`): as a layer
        # around the answer it was a coroutine more per request.
        self._limiter = (
            None if rate_limit is None else cast("SharedRateLimitMiddleware", rate_limit(app))
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._route_of(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        route, scope["path_params"] = found
        scope["route_handler"] = route.handler
        scope["path_template"] = route.template
        try:
            authenticated = authenticate(scope["headers"], self._state["tokens"])
            scope["user"] = authenticated.user
            scope["auth"] = authenticated.auth
            limiter = self._limiter
            if limiter is None:
                await self._answer(route, scope, receive, send)
                return
            turn = limiter.admit(scope)
            if turn is None:  # no per-token cap: nothing to hand back
                await self._answer(route, scope, receive, send)
                return
            turns, key, waits = turn
            if waits and not await waited_for(turn, receive):
                return
            try:
                await self._answer(route, scope, receive, send)
            finally:
                turns.finish(key)
        except _AnswerStarted:
            raise
        except Exception as error:  # before anything was sent
            await self._refuse(route, scope, receive, send, error)

    def _route_of(self, scope: Mapping[str, Any]) -> tuple[_Route, dict[str, str]] | None:
        """The route of a request answered here exactly as Litestar's route would answer
        it, and its path parameters; None for any other request."""
        if scope["type"] != "http" or scope["method"] != "GET" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if path == LIST_PATH:
            if wants_ndjson(header_value(scope["headers"], b"accept")):
                return None  # a stream: Litestar's route answers it
            route, parameters = self._list, {}
        elif path.startswith(PREFIX):
            applicant_id = path[len(PREFIX) :]
            if not applicant_id or "/" in applicant_id:
                return None
            route, parameters = self._record, {"id": applicant_id}
        else:
            return None
        # Litestar refuses a malformed Host header (400) before routing: left to it.
        for name, value in scope["headers"]:
            if name == b"host":
                if not is_valid_host(value):
                    return None
                break
        return route, parameters

    async def _answer(self, route: _Route, scope: Scope, receive: Receive, send: Send) -> None:
        """The handler's answer, or its error (with the rate limit's headers, which ride on
        the scope)."""
        try:
            response = await route.answer(self._state, scope, receive, scope["user"])
        except Exception as error:
            await self._refuse(route, scope, receive, send, error)
            return
        try:
            await response(scope, receive, send)
        except Exception as error:
            raise _AnswerStarted("Exception caught after response started") from error

    async def _refuse(
        self, route: _Route, scope: Scope, receive: Receive, send: Send, error: Exception
    ) -> None:
        """`error` handled by Litestar's own exception layer, as on the route: logged if the
        app logs exceptions, then answered by the handler `errors.py` maps it to."""

        async def raising(scope: Scope, receive: Receive, send: Send) -> None:
            raise error

        ScopeState.from_scope(scope).exception_handlers = route.exception_handlers
        await ExceptionHandlerMiddleware(raising, debug=None)(scope, receive, send)
