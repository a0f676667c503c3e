"""No token can starve the rest (issue 17, point 5), on a real `leasestar serve`.

A worker process serves at most `--token-concurrency` requests of one token at once; the
next ones wait their turn, and past `QUEUE` waiting the next is refused with 429, the
error body and `Retry-After: 1`, without spending the token's budget; meanwhile every
other token is served as before. The token's requests here are long polls
(`changed_since` at the newest change, `wait=60`, each on an `x_property_id` of its
own): each stays pending until the test writes a record there, so what the server holds
is decided by the test, not by timing. How much this keeps another token's latency is
measured, not tested: `benchmarks/fairness.py` and its section of
`benchmarks/RESULTS.md`. The turns themselves: `tests/test_token_concurrency.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import pytest

from leasestar.applicants.pipeline import write_records
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from leasestar.token_concurrency import QUEUE
from tests.test_fuzz import assert_error_body
from tests.test_hardening import Server, copy_database, new_token, query_one, serve
from tests.test_rate_limit import budget, resets_in
from tests.test_rate_limit import remaining as remaining_of

pytestmark = pytest.mark.e2e

AT_ONCE = 2  # --token-concurrency
BUDGET = 100  # --rate-limit, a minute
LIST = "/v1/applicants"
# Long enough that no poll ends on its own while a test runs; a write ends them.
WAIT = 60
# How long the polls may take to reach the server (a busy machine included).
ARRIVAL_SECONDS = 30.0


@pytest.fixture(scope="module")
def fair_db(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_database(seeded_template, tmp_path_factory.mktemp("fair") / "fair.db")


@pytest.fixture(scope="module")
def server(fair_db: Path) -> Iterator[Server]:
    flags = ("--token-concurrency", str(AT_ONCE), "--rate-limit", f"{BUDGET}/minute")
    with serve(fair_db, *flags, "--log-format", "off") as running:
        yield running


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def newest_change(db: Path) -> int:
    return int(query_one(db, "SELECT change_seq FROM sync_state"))


def property_of(poll: int) -> str:
    """A source property id no seeded record has, one per held poll (a sync feed filters
    on `x_property_id`): a write there wakes that poll."""
    return f"fairness-{poll}"


def write_one(db: Path, poll: int) -> str:
    """A write by another program, of one new record in `property_of(poll)`: its id."""
    (record,) = synthetic_applicants(1, seed=1700 + poll)
    record = msgspec.structs.replace(record, x_property_id=property_of(poll))
    connection = open_for_write(db)
    try:
        write_records(connection, [record])
    finally:
        connection.close()
    return record.id


def hold(
    server: Server, token: str, since: int, poll: int, pool: ThreadPoolExecutor
) -> Future[httpx.Response]:
    """A long poll of `token` on a connection of its own, in progress until a write to
    `property_of(poll)` (a write elsewhere does not end it)."""
    params = {
        "changed_since": str(since),
        "x_property_id": property_of(poll),
        "wait": str(WAIT),
        "limit": "1",
    }
    return pool.submit(
        httpx.get, server.base_url + LIST, params=params, headers=bearer(token), timeout=WAIT + 30
    )


def first_answered(held: list[Future[httpx.Response]]) -> int:
    """The index of the first held request answered (bounded: they reach the server)."""
    deadline = time.monotonic() + ARRIVAL_SECONDS
    while time.monotonic() < deadline:
        for index, poll in enumerate(held):
            if poll.done():
                return index
        time.sleep(0.02)
    raise AssertionError(f"none of {len(held)} requests was answered in {ARRIVAL_SECONDS} s")


def assert_refused_at_once(answer: httpx.Response, remaining: int) -> None:
    assert answer.status_code == 429, answer.text
    assert_error_body(429, answer.content)
    message = answer.json()["error"]["message"]
    assert f"already has {AT_ONCE} requests in progress and {QUEUE} waiting" in message, message
    assert answer.headers["retry-after"] == "1"
    # The budget's fields as they stand: this request was not counted.
    assert budget(answer) == BUDGET
    assert remaining_of(answer) == remaining
    assert 1 <= resets_in(answer) <= 60


def test_past_its_concurrency_a_token_waits_its_turn_and_the_others_are_served(
    server: Server, fair_db: Path
) -> None:
    busy, other = new_token(fair_db, "busy"), new_token(fair_db, "other")
    since = newest_change(fair_db)
    pending = AT_ONCE + QUEUE  # what the worker holds of one token: in progress, waiting
    with (
        ThreadPoolExecutor(max_workers=pending + 1) as pool,
        httpx.Client(base_url=server.base_url, timeout=30) as http,
    ):
        polls = list(range(pending + 1))
        held = [hold(server, busy, since, poll, pool) for poll in polls]
        # No record was written: a poll can only be answered by a refusal, and only the
        # one that came when AT_ONCE were in progress and QUEUE waiting.
        first = first_answered(held)
        refused = held.pop(first).result()
        polls.pop(first)
        assert_refused_at_once(refused, BUDGET - pending)
        assert not any(poll.done() for poll in held)

        # Another token is served meanwhile, from its own full budget.
        for n in range(1, 4):
            answer = http.get(LIST, params={"limit": 1}, headers=bearer(other))
            assert answer.status_code == 200, answer.text
            assert remaining_of(answer) == BUDGET - n
        # ... and the busy token is still refused, spending nothing.
        assert_refused_at_once(http.get(LIST, headers=bearer(busy)), BUDGET - pending)
        assert not any(poll.done() for poll in held)

        # A record for every held poll: those in progress answer, and hand their turns
        # on to the waiting ones, which answer in their turn.
        written = [write_one(fair_db, poll) for poll in polls]
        answers = [poll.result(timeout=WAIT + 30) for poll in held]
        assert [answer.status_code for answer in answers] == [200] * pending
        got = [[record["id"] for record in answer.json()["results"]] for answer in answers]
        assert got == [[record_id] for record_id in written]
        # Nothing in progress: the token is served again, and this request is counted.
        again = http.get(LIST, params={"limit": 1}, headers=bearer(busy))
        assert again.status_code == 200, again.text
        assert remaining_of(again) == BUDGET - pending - 1
