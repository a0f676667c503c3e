"""The retry schedule: Retry-After held within the steps, the last attempt at the horizon."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from leasestar.webhooks.retries import RetryPolicy

POLICY = RetryPolicy(horizon=3 * 24 * 3600.0, first_delay=5.0, max_delay=3600.0)
SECONDS = st.floats(min_value=0, max_value=1e10, allow_nan=False)


@given(attempt=st.integers(1, 100), retry_after=st.one_of(st.none(), SECONDS))
def test_every_delay_lies_between_the_first_and_the_largest_step(
    attempt: int, retry_after: float | None
) -> None:
    assert 2.5 <= POLICY.delay(attempt, retry_after) <= 3600.0


def test_retry_after_zero_waits_the_first_step_not_nothing() -> None:
    assert POLICY.delay(1, 0.0) == 5.0


def test_a_retry_after_past_the_largest_step_waits_the_largest_step() -> None:
    assert POLICY.delay(1, 10 * 24 * 3600.0) == 3600.0


# Whole seconds, so that `created + elapsed` is exact and the horizon's edge is where
# the test says.
WHOLE = st.integers(0, 10**10)


@given(created=WHOLE, elapsed=WHOLE, wait=SECONDS)
def test_a_retry_falls_within_the_horizon_or_there_is_none(
    created: int, elapsed: int, wait: float
) -> None:
    now = float(created + elapsed)
    retry = POLICY.retry_at(created, now, wait)
    if elapsed >= 3 * 24 * 3600:
        assert retry is None
    else:
        assert retry is not None
        assert now <= retry <= created + 3 * 24 * 3600
        assert retry == now + wait or retry == created + 3 * 24 * 3600


def test_a_retry_due_past_the_horizon_is_made_at_the_horizon() -> None:
    created = 1_000_000.0
    now = created + 3 * 24 * 3600 - 60  # a minute before the horizon, an hour to wait
    assert POLICY.retry_at(created, now, 3600.0) == created + 3 * 24 * 3600
    # That attempt failing too is the last.
    assert POLICY.retry_at(created, created + 3 * 24 * 3600, 5.0) is None
