"""A Python client for the leasestar API: sync and asyncio, over httpx.

    from leasestar.client import Client

    with Client("http://127.0.0.1:8000", token) as client:
        for applicant in client.applicants.list(property_id="prop_mri_02_018"):
            print(applicant.id, applicant.last_name)

It needs only httpx and msgspec (`pip install ./client`, README "Clients"): nothing here
imports the server. Records decode into the Structs the server documents
(`leasestar.client.records`); errors are `leasestar.client.errors` exceptions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leasestar.client.asynchronous import AsyncApplicants, AsyncChangeFeed, AsyncClient
    from leasestar.client.errors import (
        InvalidRequest,
        LeasestarError,
        NotFound,
        RateLimited,
        ServerError,
        Unauthorized,
    )
    from leasestar.client.records import Applicant, ApplicantList, ApplicantSingle, PageMeta
    from leasestar.client.sync import Applicants, ChangeFeed, Client

# Each name imported from its module when first asked for (PEP 562): the server imports
# `leasestar.client.records` for its Structs, and importing httpx with them would add
# 0.1 s to the start of every worker.
_MODULES = {
    "asynchronous": ("AsyncApplicants", "AsyncChangeFeed", "AsyncClient"),
    "errors": (
        "InvalidRequest",
        "LeasestarError",
        "NotFound",
        "RateLimited",
        "ServerError",
        "Unauthorized",
    ),
    "records": ("Applicant", "ApplicantList", "ApplicantSingle", "PageMeta"),
    "sync": ("Applicants", "ChangeFeed", "Client"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Applicant",
    "ApplicantList",
    "ApplicantSingle",
    "Applicants",
    "AsyncApplicants",
    "AsyncChangeFeed",
    "AsyncClient",
    "ChangeFeed",
    "Client",
    "InvalidRequest",
    "LeasestarError",
    "NotFound",
    "PageMeta",
    "RateLimited",
    "ServerError",
    "Unauthorized",
]
