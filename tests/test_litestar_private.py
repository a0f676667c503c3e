"""What the direct route relies on in Litestar's private API (`leasestar/litestar_private.py`):
checked here so that a Litestar upgrade that changes it fails in one obvious place."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from litestar import Litestar, get
from litestar.exceptions import NotFoundException
from litestar.utils.scope.state import ScopeState

from leasestar.errors import EXCEPTION_HANDLERS
from leasestar.litestar_private import ExceptionHandlerMiddleware, is_valid_host


@pytest.mark.parametrize(
    ("host", "valid"),
    [
        (b"example.com", True),
        (b"127.0.0.1:8000", True),
        (b"[::1]:8000", True),
        (b"", True),  # Litestar lets an empty Host through to routing
        (b"bad host", False),
        (b"a/b", False),
        (b"x\x00y", False),
        (b"x\r\ny", False),
    ],
)
def test_the_host_check_is_litestars_rule(host: bytes, valid: bool) -> None:
    assert is_valid_host(host) is valid


async def test_the_exception_layer_answers_with_the_apps_handlers() -> None:
    """Run as the direct route runs it: the app's handlers set on the scope, an app that
    raises, and the answer is the handler's (the API's 404 error body)."""

    @get("/")
    async def root() -> None:
        return None

    app = Litestar([root])
    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/v1/applicants/x",
        "raw_path": b"/v1/applicants/x",
        "query_string": b"",
        "headers": [],
        "app": app,
        "litestar_app": app,
        "state": {},
    }
    ScopeState.from_scope(scope).exception_handlers = dict(EXCEPTION_HANDLERS)

    async def raising(*_: Any) -> None:
        raise NotFoundException()

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    await ExceptionHandlerMiddleware(raising, debug=None)(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 404
    body = msgspec.json.decode(b"".join(m.get("body", b"") for m in sent[1:]))
    assert body["error"]["code"] == "not_found"
