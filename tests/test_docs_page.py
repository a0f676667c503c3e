"""The documentation page at /schema: Swagger UI, every asset from this server.

A real browser renders it in `make docs-check` (scripts/docs_check.py); here the page
is checked as HTML: it loads nothing from another host, and each file it names answers.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from litestar.testing import AsyncTestClient

from leasestar.docs import ASSETS_PATH, PAGE_ASSETS

Client = AsyncTestClient  # type: ignore[type-arg]


class _References(HTMLParser):
    """Collects every URL the page asks the browser to load."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.urls.append(value)


async def _page(client: Client) -> str:
    response = await client.get("/schema", headers={"Authorization": ""})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    return response.text


async def test_page_is_swagger_ui_with_only_local_urls(client: Client) -> None:
    page = await _page(client)
    assert "SwaggerUIBundle(" in page
    assert '"operationId":"listApplicants"' in page  # the document is inlined
    parser = _References()
    parser.feed(page)
    assert sorted(parser.urls) == sorted(f"{ASSETS_PATH}/{name}" for name in PAGE_ASSETS)
    # No absolute URL anywhere: no CDN, no font service, nothing outside this server.
    assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", page, re.IGNORECASE)


async def test_every_asset_is_served_without_a_token(client: Client) -> None:
    page = await _page(client)
    parser = _References()
    parser.feed(page)
    types = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
    for url in parser.urls:
        response = await client.get(url, headers={"Authorization": ""})
        assert response.status_code == 200, url
        assert response.content, url
        expected = next(kind for suffix, kind in types.items() if url.endswith(suffix))
        assert response.headers["content-type"].startswith(expected), url
        assert "public" in response.headers["cache-control"], url
    bundle = await client.get(f"{ASSETS_PATH}/swagger-ui-bundle.js")
    assert b"SwaggerUIBundle" in bundle.content


async def test_assets_and_document_need_no_token(client: Client) -> None:
    client.headers.pop("Authorization")
    assert (await client.get("/schema/openapi.json")).status_code == 200
    assert (await client.head(f"{ASSETS_PATH}/swagger-ui.css")).status_code == 200
    missing = await client.get(f"{ASSETS_PATH}/no-such-file.js")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
