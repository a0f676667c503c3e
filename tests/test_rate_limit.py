"""Rate limiting per token (issue 5, part 2).

Litestar's RateLimitMiddleware, keyed on the authenticated token's name: the budget's
state on every answer of a `/v1` route and its policy on the answer that opens a window,
429 with `Retry-After` and the error body past the budget,
one budget per token whatever the client address, `/health` and `/schema` never limited,
and the setting read from `LEASESTAR_RATE_LIMIT` and `serve --rate-limit` (off included),
checked in-process and on a real `leasestar serve`.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.middleware.rate_limit import RateLimitConfig
from litestar.testing import AsyncTestClient

from leasestar.cli import build_parser
from leasestar.config import DEFAULT_RATE_LIMIT, RateLimit, Settings, SettingsError
from leasestar.main import create_app
from leasestar.rate_limit import (
    CounterFull,
    SharedRateLimitMiddleware,
    TokenLimits,
    Window,
)
from leasestar.tokens import TokenHolder
from tests.conftest import TEST_CLIENT_ADDRESS
from tests.test_fuzz import assert_error_body
from tests.test_hardening import clean_env, copy_database, new_token, query_one, serve

Client = AsyncTestClient  # type: ignore[type-arg]

LIST = "/v1/applicants"
LIMIT = 5
POLICY_FIELD = "ratelimit-policy"
RATE_HEADERS = (POLICY_FIELD, "ratelimit")
# The IETF RateLimit fields draft's syntax, as the README documents it.
POLICY = re.compile(r'"token";q=(\d+);w=(\d+)')
STATE = re.compile(r'"token";r=(\d+);t=(\d+)')


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


@pytest.fixture
async def limited(seeded_db: Path) -> AsyncIterator[Client]:
    """The app with a budget of LIMIT requests a minute per token; no default token."""
    app = create_app(
        Settings(
            db_path=seeded_db,
            rate_limit=RateLimit(LIMIT, "minute"),
            log_format="off",
            metrics_address=TEST_CLIENT_ADDRESS,
        )
    )
    async with AsyncTestClient(app=app) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def budget(response: httpx.Response) -> int:
    """The budget a `RateLimit-Policy` field states (its window checked to be a minute or
    a day, the units these tests configure). The field comes with the answer that opens a
    window and with a 429, no other."""
    found = POLICY.fullmatch(response.headers["ratelimit-policy"])
    assert found is not None, response.headers["ratelimit-policy"]
    assert int(found[2]) in (60, 86_400)
    return int(found[1])


def remaining(response: httpx.Response) -> int:
    """What a `RateLimit` field says is left of the budget."""
    found = STATE.fullmatch(response.headers["ratelimit"])
    assert found is not None, response.headers["ratelimit"]
    return int(found[1])


def resets_in(response: httpx.Response) -> int:
    """The seconds until the window ends, as a `RateLimit` field says."""
    found = STATE.fullmatch(response.headers["ratelimit"])
    assert found is not None, response.headers["ratelimit"]
    return int(found[2])


def assert_rate_limited(response: httpx.Response, limit: int) -> None:
    assert response.status_code == 429, response.text
    assert budget(response) == limit
    assert remaining(response) == 0
    retry_after = response.headers["retry-after"]
    assert retry_after.isdigit(), retry_after
    assert 1 <= int(retry_after) <= 60
    assert int(retry_after) == resets_in(response)
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["cache-control"] == "no-store"
    assert_error_body(429, response.content)


async def test_every_answer_of_an_api_route_carries_the_limit_headers(
    limited: Client, seeded_db: Path
) -> None:
    token = new_token(seeded_db, "headers")
    some_id = query_one(seeded_db, "SELECT id FROM applicants LIMIT 1")
    first = await limited.get(LIST, headers=bearer(token))
    answers = [
        first,
        await limited.get(f"{LIST}/{some_id}", headers=bearer(token)),
        await limited.get(LIST, headers={**bearer(token), "If-None-Match": first.headers["etag"]}),
        await limited.get(LIST, params={"limit": "0"}, headers=bearer(token)),
        await limited.get(f"{LIST}/app_unknown", headers=bearer(token)),
    ]
    assert [a.status_code for a in answers] == [200, 200, 304, 400, 404]
    # Every answer counted, refusals included.
    assert [remaining(a) for a in answers] == [4, 3, 2, 1, 0]
    # The policy, which never changes, with the answer that opened the window alone.
    assert budget(first) == LIMIT
    assert [POLICY_FIELD in a.headers for a in answers] == [True] + [False] * 4
    assert_rate_limited(await limited.get(LIST, headers=bearer(token)), LIMIT)


async def test_the_answer_that_opens_each_window_carries_the_policy(
    limited: Client, seeded_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window that ends is followed by a new one at the token's next request: its answer
    states the policy again, and `r` starts over at the budget less one."""
    clock = [1_900_000_000.25]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    token = new_token(seeded_db, "windows")
    for _window in range(3):
        answers = [await limited.get(LIST, headers=bearer(token)) for _ in range(3)]
        assert [a.status_code for a in answers] == [200] * 3
        assert [remaining(a) for a in answers] == [LIMIT - 1, LIMIT - 2, LIMIT - 3]
        assert [resets_in(a) for a in answers] == [60] * 3
        assert budget(answers[0]) == LIMIT
        assert [POLICY_FIELD in a.headers for a in answers] == [True, False, False]
        clock[0] += 61  # past the window's end (it ends 60 s after its first second)


async def test_without_the_per_token_cap_the_budget_is_counted_the_same(
    seeded_db: Path,
) -> None:
    """`--token-concurrency off` keeps no turns (rate_limit.py): the list route and the
    direct get by id still count every answer, and the budget's end is the same 429."""
    app = create_app(
        Settings(
            db_path=seeded_db,
            rate_limit=RateLimit(LIMIT, "minute"),
            token_concurrency=None,
            log_format="off",
            metrics_address=TEST_CLIENT_ADDRESS,
        )
    )
    token = new_token(seeded_db, "uncapped")
    some_id = query_one(seeded_db, "SELECT id FROM applicants LIMIT 1")
    async with AsyncTestClient(app=app) as client:
        answers = [
            await client.get(LIST, headers=bearer(token)),
            await client.get(f"{LIST}/{some_id}", headers=bearer(token)),
            await client.get(f"{LIST}/app_unknown", headers=bearer(token)),
            await client.get(LIST, params={"limit": "0"}, headers=bearer(token)),
            await client.get(f"{LIST}/{some_id}", headers=bearer(token)),
        ]
        assert [a.status_code for a in answers] == [200, 200, 404, 400, 200]
        assert [remaining(a) for a in answers] == [4, 3, 2, 1, 0]
        assert budget(answers[0]) == LIMIT
        assert not any(POLICY_FIELD in a.headers for a in answers[1:])
        assert_rate_limited(await client.get(f"{LIST}/{some_id}", headers=bearer(token)), LIMIT)
        assert_rate_limited(await client.get(LIST, headers=bearer(token)), LIMIT)


async def test_options_has_a_budget_of_its_own_that_no_token_shares(
    limited: Client, seeded_db: Path
) -> None:
    """`OPTIONS` passes authentication without a token (README, "Rate limit"): it is
    counted against one budget of its own, which a token named `anonymous` does not share."""
    token = new_token(seeded_db, "anonymous")
    # With a token or without, OPTIONS counts against its own budget.
    answers = [
        await limited.options(LIST, headers=bearer(token) if n % 2 else {}) for n in range(LIMIT)
    ]
    assert [a.status_code for a in answers] == [204] * LIMIT
    assert [remaining(a) for a in answers] == list(range(LIMIT - 1, -1, -1))
    assert budget(answers[0]) == LIMIT
    assert_rate_limited(await limited.options(f"{LIST}/app_any"), LIMIT)
    own = await limited.get(LIST, headers=bearer(token))
    assert (own.status_code, remaining(own)) == (200, LIMIT - 1)


async def test_a_count_that_fails_hands_its_turn_back(tmp_path: Path) -> None:
    """A request that took a turn under the per-token cap and then could not be counted
    (every window of the file open: `CounterFull`) is not served: its turn goes back, or
    the token's later requests on this worker would wait for it for ever."""
    limits = TokenLimits(tmp_path / "db-ratelimit", 1)
    limits.open()
    try:
        config = RateLimitConfig(
            rate_limit=("minute", LIMIT), middleware_class=SharedRateLimitMiddleware
        )
        limiter = SharedRateLimitMiddleware(_unreachable, config, limits)
        scope: Any = {"type": "http", "method": "GET", "user": TokenHolder("capped", None)}
        counted = limits.counter.count

        def full(*args: object) -> Window:
            raise CounterFull("every window open")

        limits.counter.count = full  # type: ignore[method-assign]
        for _ in range(3):
            with pytest.raises(CounterFull):
                limiter.admit(scope)
        limits.counter.count = counted  # type: ignore[method-assign]
        turn = limiter.admit(scope)
        assert turn is not None
        turns, key, waits = turn
        assert (key, waits) == ("capped", False)  # served at once: no turn was kept
        turns.finish(key)
    finally:
        limits.close()


async def _unreachable(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("admit alone is called")


async def test_head_counts_and_carries_the_headers(limited: Client, seeded_db: Path) -> None:
    token = new_token(seeded_db, "head")
    response = await limited.head(LIST, headers=bearer(token))
    assert response.status_code == 200
    assert response.content == b""
    assert (budget(response), remaining(response)) == (LIMIT, LIMIT - 1)


async def test_past_the_budget_429_with_retry_after_and_the_error_body(
    limited: Client, seeded_db: Path
) -> None:
    token = new_token(seeded_db, "burst")
    statuses = [(await limited.get(LIST, headers=bearer(token))).status_code for _ in range(LIMIT)]
    assert statuses == [200] * LIMIT
    for _ in range(3):  # stays refused, and a refusal does not reset the window
        assert_rate_limited(await limited.get(LIST, headers=bearer(token)), LIMIT)


async def test_each_token_has_its_own_budget_from_the_same_address(
    limited: Client, seeded_db: Path
) -> None:
    first, second = new_token(seeded_db, "first"), new_token(seeded_db, "second")
    for _ in range(LIMIT):
        assert (await limited.get(LIST, headers=bearer(first))).status_code == 200
    assert_rate_limited(await limited.get(LIST, headers=bearer(first)), LIMIT)
    # Same test client, same address: the second token starts with a full budget.
    fresh = await limited.get(LIST, headers=bearer(second))
    assert fresh.status_code == 200
    assert remaining(fresh) == LIMIT - 1
    scoped = new_token(seeded_db, "scoped", "some-integration")
    assert remaining(await limited.get(LIST, headers=bearer(scoped))) == LIMIT - 1


async def test_bad_tokens_do_not_spend_a_real_tokens_budget(
    limited: Client, seeded_db: Path
) -> None:
    token = new_token(seeded_db, "victim")
    public_id = token.split("_")[1]
    guess = f"lst_{public_id}_{'A' * 43}"
    for _ in range(LIMIT * 2):
        answer = await limited.get(LIST, headers=bearer(guess))
        assert answer.status_code == 401
    assert remaining(await limited.get(LIST, headers=bearer(token))) == LIMIT - 1


@pytest.mark.parametrize("path", ["/health", "/schema", "/schema/openapi.json", "/metrics"])
async def test_service_routes_are_not_limited(limited: Client, seeded_db: Path, path: str) -> None:
    token = new_token(seeded_db, "service")
    for _ in range(LIMIT * 3):
        response = await limited.get(path, headers=bearer(token))
        assert response.status_code == 200
        assert not any(name in response.headers for name in RATE_HEADERS)
    # ... and they spent nothing of the token's budget.
    assert remaining(await limited.get(LIST, headers=bearer(token))) == LIMIT - 1


async def test_no_limit_no_headers(seeded_db: Path) -> None:
    token = new_token(seeded_db, "unlimited")
    async with AsyncTestClient(app=create_app(Settings(db_path=seeded_db))) as client:
        for _ in range(LIMIT * 3):
            response = await client.get(LIST, params={"limit": 1}, headers=bearer(token))
            assert response.status_code == 200
            assert not any(name in response.headers for name in RATE_HEADERS)


# --- configuration -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, RateLimit(600, "minute")),
        ("", RateLimit(600, "minute")),
        ("5/second", RateLimit(5, "second")),
        ("100/Hour", RateLimit(100, "hour")),
        (" 7/day ", RateLimit(7, "day")),
        ("off", None),
        ("OFF", None),
        ("0", None),
    ],
)
def test_rate_limit_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str | None, expected: RateLimit | None
) -> None:
    assert DEFAULT_RATE_LIMIT == "600/minute"
    for name in ("LEASESTAR_DB", "LEASESTAR_RATE_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    if text is not None:
        monkeypatch.setenv("LEASESTAR_RATE_LIMIT", text)
    assert Settings.from_env().rate_limit == expected


@pytest.mark.parametrize("text", ["10", "10/fortnight", "-1/minute", "0/minute", "1e3/minute"])
def test_bad_rate_limit_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("LEASESTAR_RATE_LIMIT", text)
    with pytest.raises(SettingsError, match="LEASESTAR_RATE_LIMIT"):
        Settings.from_env()


def test_serve_flag_parses_and_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASESTAR_RATE_LIMIT", "3/second")
    parser = build_parser(Settings.from_env())
    assert parser.parse_args(["serve"]).rate_limit == "3/second"
    assert parser.parse_args(["serve", "--rate-limit", "off"]).rate_limit == "off"
    assert parser.parse_args(["serve", "--rate-limit", "20/Minute"]).rate_limit == "20/minute"
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["serve", "--rate-limit", "lots"])
    assert refused.value.code == 2


# --- on a real `leasestar serve` ------------------------------------------------------


@pytest.fixture(scope="module")
def served_db(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_database(seeded_template, tmp_path_factory.mktemp("rate") / "leasestar.db")


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("flags", "env", "limit"),
    [
        pytest.param([], {}, 600, id="default-600-a-minute"),
        pytest.param(["--rate-limit", "3/minute"], {}, 3, id="flag"),
        pytest.param([], {"LEASESTAR_RATE_LIMIT": "3/minute"}, 3, id="env"),
        pytest.param(["--rate-limit", "off"], {"LEASESTAR_RATE_LIMIT": "3/minute"}, None, id="off"),
    ],
)
def test_serve_applies_the_configured_limit(
    served_db: Path, flags: list[str], env: dict[str, str], limit: int | None
) -> None:
    token = new_token(served_db, f"serve-{len(flags)}-{len(env)}-{limit}")
    with (
        serve(served_db, "--log-format", "off", *flags, env=clean_env(**env)) as server,
        httpx.Client(base_url=server.base_url, headers=bearer(token), timeout=30) as http,
    ):
        answers = [http.get(LIST, params={"limit": 1}) for _ in range(5)]
        if limit is None:
            assert [a.status_code for a in answers] == [200] * 5
            assert not any(name in a.headers for a in answers for name in RATE_HEADERS)
        elif limit > 5:
            assert [a.status_code for a in answers] == [200] * 5
            assert budget(answers[0]) == limit
            assert not any(POLICY_FIELD in a.headers for a in answers[1:])
            assert [remaining(a) for a in answers] == [limit - n for n in range(1, 6)]
        else:
            assert [a.status_code for a in answers] == [200] * limit + [429] * (5 - limit)
            assert_rate_limited(answers[-1], limit)
        # The service routes stay open whatever the limit.
        assert all(http.get("/health").status_code == 200 for _ in range(5))
