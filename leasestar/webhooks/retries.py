"""When to try an event again, and when to give up on it.

Exponential backoff with full jitter (a delay drawn between half and all of the
doubled step, so receivers that failed together are not retried together), capped per
step, until the retry horizon: Stripe and Standard Webhooks retry for about three
days, so a receiver down over a weekend loses nothing. The horizon is counted from the
event's creation: a receiver back after a longer outage gets one attempt at each old
event, not three more days of each, one after the other. A `Retry-After` the receiver
sends (seconds or an HTTP date) replaces the drawn delay, held between the first and
the largest step: `Retry-After: 0` would otherwise make a tight loop of requests for
the whole horizon. A retry due past the horizon is made at the horizon, so a long
`Retry-After` or step never turns the last attempt into none.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Final

DEFAULT_HORIZON_SECONDS: Final = 3 * 24 * 3600
DEFAULT_FIRST_DELAY_SECONDS: Final = 5.0
MAX_DELAY_SECONDS: Final = 3600.0
DEFAULT_TIMEOUT_SECONDS: Final = 10.0


class RetrySettingsError(ValueError):
    """A LEASESTAR_WEBHOOK_* variable is not a positive number."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    horizon: float = DEFAULT_HORIZON_SECONDS
    first_delay: float = DEFAULT_FIRST_DELAY_SECONDS
    max_delay: float = MAX_DELAY_SECONDS
    timeout: float = DEFAULT_TIMEOUT_SECONDS

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """LEASESTAR_WEBHOOK_RETRY_HORIZON, _FIRST_RETRY, _TIMEOUT (seconds)."""
        values = {}
        for field, name in (
            ("horizon", "LEASESTAR_WEBHOOK_RETRY_HORIZON"),
            ("first_delay", "LEASESTAR_WEBHOOK_FIRST_RETRY"),
            ("timeout", "LEASESTAR_WEBHOOK_TIMEOUT"),
        ):
            text = os.environ.get(name)
            if text is None:
                continue
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            if not 0 < value < 1e9:
                raise RetrySettingsError(f"{name} must be a positive number of seconds")
            values[field] = value
        return cls(**values)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds before attempt `attempt + 1`, after `attempt` (1-based) failed."""
        if retry_after is not None:
            return min(self.max_delay, max(self.first_delay, retry_after))
        step = min(self.max_delay, self.first_delay * 2.0 ** min(attempt - 1, 60))
        return float(step / 2 + random.random() * step / 2)

    def retry_at(self, created_at: float, now: float, wait: float) -> float | None:
        """When to try again after an attempt at `now` failed (seconds since the epoch),
        or None to give up: the horizon has passed."""
        horizon_ends = created_at + self.horizon
        if now >= horizon_ends:
            return None
        return min(now + wait, horizon_ends)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` header asks to wait, or None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(min(int(text), 10**9))
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return max(0.0, moment.timestamp() - now)
