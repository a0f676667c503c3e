"""Properties of integration scopes: a token sees its integrations' records and no others.

Several tokens, each scoped to a random subset of the integrations (some holding no
records, some differing from another only in case) plus one unscoped token, query the
same random data set. For every token, every list page (any filters, orderings and
pages) must be exactly the model's answer restricted to the token's integrations, so
foreign records are absent from results and from `meta.total`; and the id of a foreign
record must answer exactly as an id that does not exist.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from tests.strategies import (
    INTEGRATIONS,
    META_KEYS,
    ModelRow,
    check_query,
    datasets,
    ids,
    list_queries,
    matches,
    serve,
)

INTEGRATION_IDS = tuple(integration for integration, _ in INTEGRATIONS)
# Headers that differ between any two requests, whatever they ask.
PER_REQUEST_HEADERS = frozenset({"date", "x-request-id"})

PROPERTY_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Token scopes: non-empty subsets, sometimes naming an integration that holds nothing.
scopes = st.lists(
    st.frozensets(st.sampled_from((*INTEGRATION_IDS, "int_empty")), min_size=1, max_size=3),
    min_size=1,
    max_size=3,
)


def token_scopes(drawn: list[frozenset[str]]) -> dict[str, tuple[str, ...]]:
    """Token name -> scope for `serve`; the empty scope is the unscoped token."""
    return {"all": (), **{f"scoped-{n}": tuple(sorted(scope)) for n, scope in enumerate(drawn)}}


def comparable(response: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    """What a client can observe of a response, less what changes on every request."""
    headers = {
        name: value
        for name, value in response.headers.items()
        if name.lower() not in PER_REQUEST_HEADERS and not name.lower().startswith("ratelimit")
    }
    return response.status_code, headers, response.content


@PROPERTY_SETTINGS
@given(rows=datasets(max_size=16), drawn_scopes=scopes, data=st.data())
async def test_every_list_holds_only_the_tokens_integrations(
    rows: list[ModelRow], drawn_scopes: list[frozenset[str]], data: st.DataObject
) -> None:
    names = token_scopes(drawn_scopes)
    async with serve(rows, names) as served:
        client = served.client
        for name, token in served.tokens.items():
            scope = frozenset(names[name]) or None
            note(f"token {name} scope {scope}")
            client.headers["Authorization"] = f"Bearer {token}"
            query = data.draw(list_queries(rows), label=f"query of {name}")
            step = data.draw(st.integers(1, 5), label="step")
            for body in await check_query(client, rows, query, step, scope):
                assert scope is None or all(r["integration_id"] in scope for r in body["results"])
            if scope is None:
                continue
            # Asking for a foreign integration by name finds nothing, and counts nothing.
            for foreign in sorted(set(INTEGRATION_IDS) - scope):
                response = await client.get("/v1/applicants", params={"integration_id": foreign})
                assert response.status_code == 200
                body = response.json()
                assert body["results"] == []
                assert (body["meta"]["total"], body["meta"]["hasMore"]) == (0, False)


@settings(PROPERTY_SETTINGS, max_examples=30)
@given(rows=datasets(min_size=1, max_size=10), drawn_scopes=scopes, data=st.data())
async def test_a_foreign_id_answers_exactly_as_an_unknown_id(
    rows: list[ModelRow], drawn_scopes: list[frozenset[str]], data: st.DataObject
) -> None:
    names = token_scopes(drawn_scopes)
    known = {row.values["id"] for row in rows}
    async with serve(rows, names) as served:
        client = served.client
        for name, token in served.tokens.items():
            scope = frozenset(names[name]) or None
            client.headers["Authorization"] = f"Bearer {token}"
            query = data.draw(list_queries(rows, record_route=True), label=f"query of {name}")
            params = list(query.params)
            broken = data.draw(
                st.sampled_from(
                    (None, None, ("limit", "0"), ("integration_id", "int_a"), ("bogus", "1"))
                ),
                label="broken parameter",
            )
            if broken is not None:
                params.append(broken)
            query_string = query.query_string(params)
            unknown = data.draw(ids.filter(lambda i: i not in known), label="unknown id")
            note(f"token {name} scope {scope}; ?{query_string}; unknown id {unknown!r}")
            absent = await client.get(f"/v1/applicants/{quote(unknown, safe='')}?{query_string}")
            assert absent.status_code == (400 if broken else 404)
            for row in rows:
                response = await client.get(
                    f"/v1/applicants/{quote(row.values['id'], safe='')}?{query_string}"
                )
                if broken is None and matches(row, query, scope):
                    assert response.status_code == 200, response.text
                    body = response.json()
                    assert body["results"]["id"] == row.values["id"]
                    assert {key: body["meta"].get(key) for key in META_KEYS} == {
                        "offset": query.offset,
                        "limit": query.limit,
                        "orderBy": query.echo,
                        "hasMore": False,
                        "total": 1,
                    }
                else:
                    # Foreign, outside the date bounds, or a refused query: no trace of
                    # the record's existence in status, headers or body.
                    assert comparable(response) == comparable(absent), row.values["id"]
