"""A first end-to-end look: the default page of the seeded database."""

from __future__ import annotations

from litestar.testing import AsyncTestClient


async def test_default_page_has_100_newest_first(client: AsyncTestClient) -> None:  # type: ignore[type-arg]
    response = await client.get("/v1/applicants")
    assert response.status_code == 200
    body = response.json()
    assert body["meta"].pop("next")  # the cursor of the next page; its walk is tested elsewhere
    assert body["meta"] == {
        "offset": 0,
        "limit": 100,
        "orderBy": [{"field": "created_at", "direction": "desc"}],
        "hasMore": True,
        "total": 300,
    }
    created = [(r["created_at"], r["id"]) for r in body["results"]]
    assert len(created) == 100
    assert created == sorted(created, reverse=True)
