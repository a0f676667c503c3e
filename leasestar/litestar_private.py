"""The two pieces of Litestar's private API that leasestar uses, imported in one place.

The direct routes of the list and get by id (`applicants/direct_route.py`) answer in
front of Litestar's router and must refuse and fail exactly as Litestar's own routes:
they need the `Host` check Litestar's ASGI router applies before routing, and Litestar's
exception layer run with the app's handlers. Litestar 2 makes neither public. pyproject
pins `litestar<3`, and `tests/test_litestar_private.py` checks that both still behave as
the direct routes rely on, so an upgrade that moves or changes them fails there first.
"""

from __future__ import annotations

from litestar._asgi.utils import is_valid_host
from litestar.middleware._internal.exceptions.middleware import ExceptionHandlerMiddleware

__all__ = ("ExceptionHandlerMiddleware", "is_valid_host")
