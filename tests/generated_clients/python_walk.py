"""A client generated from leasestar's served OpenAPI document by openapi-python-client,
used exactly as its README shows: walk a list by cursor, read the sync feed, get a record
by id, read a typed 400. Prints what it saw as JSON for tests/test_generated_clients.py.

Run with the generated package (`leasestar_api`) on the path: it is not part of leasestar.
"""

from __future__ import annotations

import datetime
import json
import sys

from leasestar_api import AuthenticatedClient
from leasestar_api.api.applicants import get_applicant, list_applicants
from leasestar_api.models import ApplicantList, ApplicantSingle, ErrorBody
from leasestar_api.types import Unset


def walk(
    client: AuthenticatedClient, page: ApplicantList | ErrorBody | None
) -> tuple[list[str], ApplicantList]:
    """Follow `meta.next` from `page` to the end: every id, and the last page."""
    ids: list[str] = []
    while True:
        assert isinstance(page, ApplicantList), page
        ids += [applicant.id for applicant in page.results]
        if not page.meta.has_more or isinstance(page.meta.next_, Unset):
            return ids, page
        page = list_applicants.sync(client=client, cursor=page.meta.next_)


base_url, token = sys.argv[1:3]
with AuthenticatedClient(base_url=base_url, token=token) as client:
    listed, _ = walk(
        client, list_applicants.sync(client=client, limit=40, order_by="last_name,first_name")
    )
    synced, last = walk(client, list_applicants.sync(client=client, changed_since=0, limit=100))

    one = get_applicant.sync(id=listed[0], client=client)
    assert isinstance(one, ApplicantSingle), one
    assert isinstance(one.results.created_at, datetime.datetime)

    # An instant parameter takes a date as well as a datetime.
    since_2023 = list_applicants.sync(client=client, updated_at_gte=datetime.date(2023, 1, 1))
    assert isinstance(since_2023, ApplicantList), since_2023

    refused = list_applicants.sync_detailed(client=client, limit=0)
    assert isinstance(refused.parsed, ErrorBody), refused
    details = refused.parsed.error.details

print(
    json.dumps(
        {
            "walk": listed,
            "sync": synced,
            "change_seq": last.meta.change_seq,
            "get": one.results.id,
            "created_at": one.results.created_at.isoformat(),
            "updated_since_2023": since_2023.meta.total,
            "error": [
                refused.status_code.value,
                refused.parsed.error.code.value,
                details.parameter,
                details.value,
            ],
        }
    )
)
