"""A Python client for the leasestar API: sync and asyncio, over httpx.

    from leasestar.client import Client

    with Client("http://127.0.0.1:8000", token) as client:
        for applicant in client.applicants.list(property_id="prop_mri_02_018"):
            print(applicant.id, applicant.last_name)

It needs only httpx and msgspec (`pip install ./client`, README "Clients"): nothing here
imports the server. Records decode into the Structs the server documents
(`leasestar.client.records`); errors are `leasestar.client.errors` exceptions.
"""

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
