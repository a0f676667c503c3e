"""ISO 8601 instants: the one grammar shared by query parameters and import.

Instants are held as integer microseconds since the Unix epoch, UTC: comparison is then
exact to the microsecond and independent of the offset the text was written in.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

# YYYY-MM-DD, optionally THH:MM[:SS[.fraction]] with Z, ±HH:MM or no offset (= UTC).
# A space before the offset stands for '+': an unencoded '+' in a query string
# arrives as a space.
_INSTANT = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})"
    r"(?:[Tt](?P<hour>\d{2}):(?P<minute>\d{2})"
    r"(?::(?P<second>\d{2})(?:\.(?P<fraction>\d+))?)?"
    r"(?P<offset>[Zz]|[+\- ]\d{2}:\d{2})?)?",
    re.ASCII,  # \d would also match other scripts' digits, which int() then accepts
)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
# The served form, `2025-03-01T12:34:56.789Z`.
_CANONICAL = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z", re.ASCII)
_MICROSECOND = timedelta(microseconds=1)
# The instants a datetime can represent in UTC; anything outside cannot be served.
MIN_INSTANT = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH) // _MICROSECOND
MAX_INSTANT = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - _EPOCH) // _MICROSECOND

INSTANT_RULE = (
    "an ISO 8601 instant: YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fraction]], "
    "with Z, ±HH:MM or no offset (UTC)"
)


def parse_instant(text: str) -> int:
    """Parse an instant of the contract's grammar into UTC microseconds since the epoch.

    Digits beyond the microsecond are truncated. Raises ValueError on anything else.
    """
    if _CANONICAL.fullmatch(text) is not None:  # the served form (cursors read it back)
        try:
            return (datetime.fromisoformat(text) - _EPOCH) // _MICROSECOND
        except ValueError:
            raise ValueError(INSTANT_RULE) from None
    match = _INSTANT.fullmatch(text)
    if match is None:
        raise ValueError(INSTANT_RULE)
    try:
        day = date.fromisoformat(match["date"])
        hour = int(match["hour"] or 0)
        minute = int(match["minute"] or 0)
        second = int(match["second"] or 0)
        micro = int((match["fraction"] or "0").ljust(6, "0")[:6])
        moment = datetime(day.year, day.month, day.day, hour, minute, second, micro, tzinfo=UTC)
    except ValueError:
        raise ValueError(INSTANT_RULE) from None
    offset = match["offset"]
    shift = 0
    if offset and offset not in "Zz":
        offset_hours, offset_minutes = int(offset[1:3]), int(offset[4:6])
        if offset_hours > 23 or offset_minutes > 59:
            raise ValueError(INSTANT_RULE)
        shift = (offset_hours * 60 + offset_minutes) * 60_000_000
        if offset[0] == "-":
            shift = -shift
    return (moment - _EPOCH) // _MICROSECOND - shift


def format_instant(micros: int) -> str:
    """Write an instant as the API serves it: UTC, milliseconds, `Z`."""
    # isoformat zero-pads the year to four digits and truncates to the millisecond.
    moment = _NAIVE_EPOCH + timedelta(microseconds=micros)
    return moment.isoformat(timespec="milliseconds") + "Z"


def canonical_instant(text: str) -> str:
    """Parse an instant and write it back as served (sub-millisecond digits truncated)."""
    # Fast path for text already in the served form (every exported line, every seeded
    # record): the C parser checks it is a real date and time, and it is its own
    # canonical form. This is what keeps import and seed fast; the answer is the same.
    if _CANONICAL.fullmatch(text) is not None:
        try:
            datetime.fromisoformat(text)
        except ValueError:
            pass  # not a real date or time: the full parser below says why
        else:
            return text
    micros = parse_instant(text)
    if not MIN_INSTANT <= micros <= MAX_INSTANT:
        raise ValueError("instant is outside the years 0001-9999 in UTC")
    return format_instant(micros - micros % 1000)


def is_calendar_date(text: str) -> bool:
    """True for a real calendar date written YYYY-MM-DD."""
    if _DATE.fullmatch(text) is None:
        return False
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def now_micros() -> int:
    """The current instant, truncated to the millisecond the API can represent."""
    micros = (datetime.now(UTC) - _EPOCH) // _MICROSECOND
    return micros - micros % 1000
