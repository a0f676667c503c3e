"""Hypothesis strategies for applicant data sets and list queries; the model they are checked by.

The strategies draw awkward data on purpose: unicode text including non-BMP characters
and strings that differ only in case, a null in every nullable field, ties in every sort
key (values drawn from small pools), instants across years written in every form the
contract accepts (`Z`, `±HH:MM`, a space for `+`, none; 1-9 fraction digits; a date
alone) and phones in many formats.

Each drawn record comes with its `ModelRow`: the values the contract says the API must
sort and filter on, computed here with the standard library alone (never with the code
under test). `expected_matches` then answers any list query by filtering and sorting the
model rows in Python, following the contract's rules, and `check_page` compares a
response with it. `serve` runs the real app over a fresh database per example.
"""

from __future__ import annotations

import functools
import os
import string
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, urlencode

from hypothesis import note
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import AsyncTestClient

from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant, Application, Income, Pet, Screening
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.tokens import create_token
from tests.contract import (
    DATE_BOUNDS,
    DEFAULT_LIMIT,
    EQUALITY_FILTERS,
    INSTANT_FIELDS,
    MAX_LIMIT,
    MAX_OFFSET,
    META_KEYS,
    SORTABLE,
)

# An import line with only the required fields (README, "Data in and out").
MINIMAL = {
    "x_id": "X1",
    "x_property_id": "P-1",
    "property_id": "prop_1",
    "integration_id": "int_1",
    "integration_vendor": "YARDI",
}

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)

# --- pools: small, so sort keys tie; awkward, so code-point order is tested ----------

# Integrations (id, vendor): ids differing only in case, a non-ASCII one, shared vendors.
INTEGRATIONS: tuple[tuple[str, str], ...] = (
    ("int_a", "YARDI"),
    ("int_A", "YARDI"),
    ("INT_b", "ENTRATA"),
    ("int_é", "RÉALPAGE"),
    ("int_😀", "APPFOLIO"),
)
# Text that sorts differently by code point than by locale or UTF-16: case pairs,
# accents, ß/SS, a ligature, fullwidth and non-BMP letters, U+FFFF against U+1F600.
AWKWARD_TEXT: tuple[str, ...] = (
    "",
    "a",
    "A",
    "ann",
    "Ann",
    "ANN",
    "Ánn",
    "ánn",
    "Zoë",
    "zoë",
    "ß",
    "SS",
    "\ufb01",
    "\uff21",
    "\uffff",
    "\ue000",
    "😀",
    "\U0001d504lice",
    "a\x00b",
    " a",
    "a b",
    "Müller",
    "O'Brien",
)
SOURCE_IDS: tuple[str, ...] = ("1", "10", "2", "a", "A", "x-1", "Ω", "😀", "ß")
EMAILS: tuple[str, ...] = (
    "ann@example.com",
    "Ann@Example.COM",
    "ánn@example.com",
    "Ánn@example.com",
    "ÉMILE@example.fr",
    "émile@example.fr",
    "straße@example.de",
    "STRASSE@example.de",
    "ΣΑΣ@example.gr",
    "σας@example.gr",
    "ǅ@example.hr",
    "😀@example.net",
    "user+tag@example.org",
    "",
)
# Ten-digit numbers the phone filter is asked about, and the formats they are written in.
PHONE_NUMBERS: tuple[str, ...] = ("5551234567", "1234567890", "5550000000", "2125550100")
PHONE_FORMATS: tuple[Callable[[str], str], ...] = (
    lambda d: d,
    lambda d: f"({d[:3]}) {d[3:6]}-{d[6:]}",
    lambda d: f"{d[:3]}-{d[3:6]}-{d[6:]}",
    lambda d: f"{d[:3]}.{d[3:6]}.{d[6:]}",
    lambda d: f"+1 {d[:3]} {d[3:6]} {d[6:]}",
    lambda d: f"1-{d[:3]}-{d[3:6]}-{d[6:]}",
    lambda d: f"1{d}",
    lambda d: f"+1 ({d[:3]}) {d[3:6]}-{d[6:]}",
    lambda d: f"{d} x12",  # an extension: its digits make the number another
    lambda d: f"44{d}",  # another country code: not the number
    lambda d: f"11{d}",
    lambda d: d[:7],  # too short
    lambda d: "".join(chr(0xFF10 + int(c)) for c in d),  # fullwidth digits are not digits
    lambda d: f"tel:{d}",
)
TIMEZONES: tuple[timedelta, ...] = (
    timedelta(0),
    timedelta(hours=5, minutes=30),
    timedelta(hours=-8),
    timedelta(hours=14),
    timedelta(hours=-12),
    timedelta(hours=23, minutes=59),
    timedelta(hours=-23, minutes=-59),
)
# Shared instants, so datetime orderings tie; spread over years, before 1970 too.
SHARED_INSTANTS: tuple[int, ...] = (
    0,
    -1_000,
    951_782_400_000_000,  # 2000-02-29
    1_700_000_000_123_000,
    1_700_000_000_123_999,  # the same millisecond as the one before
    4_102_444_800_000_000,  # 2100-01-01
)
MIN_DRAWN = (datetime(1950, 1, 1, tzinfo=UTC) - EPOCH) // MICROSECOND
MAX_DRAWN = (datetime(2090, 1, 1, tzinfo=UTC) - EPOCH) // MICROSECOND


# --- instants: drawn as microseconds, written in any accepted form -------------------


def floor_ms(micros: int) -> int:
    """What the service keeps of an instant: sub-millisecond digits are truncated."""
    return micros - micros % 1000


def served_instant(micros: int) -> str:
    """An instant as the contract says the API writes it: UTC, milliseconds, `Z`."""
    moment = EPOCH + micros * MICROSECOND
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _micros(moment: datetime) -> int:
    return (moment - EPOCH) // MICROSECOND


def _offset_suffix(offset: timedelta, style: str) -> str:
    """`Z` or nothing (both UTC) or `±HH:MM`, where a space stands for `+`."""
    if style in ("", "Z"):
        return style
    minutes = abs(offset) // timedelta(minutes=1)
    return f"{style}{minutes // 60:02d}:{minutes % 60:02d}"


@st.composite
def instant_text(draw: st.DrawFn, micros: int, *, exact: bool) -> tuple[str, int]:
    """Write `micros` in one of the contract's forms; return (text, instant it names).

    With `exact`, the text names `micros` itself (up to nine fraction digits, the
    digits past the microsecond being noise to truncate). Otherwise the form may drop
    precision (a date alone, minutes, seconds, a short fraction), and the instant
    returned is the one the text actually names, computed with `datetime`.
    """
    offset = draw(st.sampled_from(TIMEZONES))
    if offset == timedelta(0):
        style = draw(st.sampled_from(("", "Z", "+", "-", " ")))
    elif offset > timedelta(0):
        style = draw(st.sampled_from(("+", " ")))
    else:
        style = "-"
    zone = timezone(offset)
    local = (EPOCH + micros * MICROSECOND).astimezone(zone)
    forms = ["fraction"] if exact else ["date", "minute", "second", "fraction"]
    if exact and local.microsecond == 0:
        forms.append("second")
    form = draw(st.sampled_from(forms))
    if form == "date":
        # A date alone is midnight UTC of that date: no offset may follow it.
        day = local.astimezone(UTC).date()
        named = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return day.isoformat(), _micros(named)
    text = local.strftime("%Y-%m-%dT%H:%M")
    named = local.replace(second=0, microsecond=0)
    if form in ("second", "fraction"):
        text += local.strftime(":%S")
        named = local.replace(microsecond=0)
    if form == "fraction":
        six = f"{local.microsecond:06d}"
        if exact:
            digits = draw(st.integers(len(six.rstrip("0")) or 1, 9))
            kept = max(digits, len(six.rstrip("0")))
        else:
            kept = draw(st.integers(1, 9))
        noise = "".join(draw(st.lists(st.sampled_from(string.digits), min_size=3, max_size=3)))
        fraction = (six + noise)[:kept]
        text += "." + fraction
        named = local.replace(microsecond=int(fraction[:6].ljust(6, "0")))
    return text + _offset_suffix(offset, style), _micros(named)


def instants() -> st.SearchStrategy[int]:
    """Microseconds since the epoch: shared values (ties) or anywhere over 140 years."""
    return st.one_of(
        st.sampled_from(SHARED_INSTANTS),
        st.integers(MIN_DRAWN, MAX_DRAWN),
        st.integers(MIN_DRAWN // 86_400_000_000, MAX_DRAWN // 86_400_000_000).map(
            lambda day: day * 86_400_000_000
        ),
    )


# --- records ------------------------------------------------------------------------


def text(max_size: int = 8) -> st.SearchStrategy[str]:
    """Any unicode text (no surrogates): BMP, non-BMP, controls, NUL."""
    return st.text(st.characters(codec="utf-8"), max_size=max_size)


def pooled(pool: Sequence[str]) -> st.SearchStrategy[str]:
    """Mostly from a small pool (ties), sometimes any text."""
    return st.one_of(st.sampled_from(pool), st.sampled_from(pool), text())


def nullable(values: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    """The values, or null about one time in four."""
    return st.one_of(values, values, values, st.none())


# Ids within the rule import enforces (APPLICANT_ID_RULE, leasestar/applicants/records.py):
# an Applicant built with any other id raises.
ID_ALPHABET = string.ascii_letters + string.digits + "_-~.:"
ids = st.one_of(
    st.integers(0, 2**96 - 1).map(lambda n: f"app_{n:024x}"),
    # Dot segments ("." and "..") would be folded away in a URL path.
    st.text(ID_ALPHABET, min_size=1, max_size=6).filter(lambda i: set(i) != {"."}),
)


def phones() -> st.SearchStrategy[str | None]:
    return st.one_of(
        st.none(),
        st.just(""),
        text(6),
        st.builds(
            lambda number, form: form(number),
            st.sampled_from(PHONE_NUMBERS),
            st.sampled_from(PHONE_FORMATS),
        ),
    )


_LOOSE = st.none() | st.sampled_from(AWKWARD_TEXT)  # fields no query looks at
_SOURCE_IDS = pooled(SOURCE_IDS).filter(bool)
_PROPERTY_IDS = pooled(("prop_1", "prop_2", "Prop_1", "prop_é")).filter(bool)
_NAMES = nullable(pooled(AWKWARD_TEXT))
_EMAILS = nullable(pooled(EMAILS))
_PHONES = phones()
_DATES_OF_BIRTH = (
    st.none()
    | st.sampled_from(("1990-01-01", "2000-02-29", "1969-12-31"))
    | st.dates().map(lambda day: day.isoformat())  # years 1-9999: code-point order
)
_CITIES = nullable(pooled(("Austin", "austin", "AUSTIN", "Zürich", "東京", "\U0001d516eattle")))
_STATES = nullable(pooled(("TX", "tx", "CA", "Ñ")))
_ZIPS = nullable(pooled(("78701", "78701-1234", "00501", "SW1A 1AA")))
_CUSTOM_DATA = st.dictionaries(
    st.sampled_from(("a", "A", "😀", "")),
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | text(4),
    max_size=2,
)
_NESTED_INSTANTS = st.none() | instants().flatmap(
    lambda micros: instant_text(micros, exact=True)
).map(lambda pair: pair[0])
_PETS = st.builds(
    Pet,
    id=_LOOSE,
    created_at=_NESTED_INSTANTS,
    weight_in_pounds=st.none() | st.floats(0, 300),
)
_SCREENINGS = st.builds(Screening, screening_date=_NESTED_INSTANTS)
_INCOMES = st.builds(Income, amount_in_cents=st.none() | st.integers(0, 10**9))


@dataclass(frozen=True)
class ModelRow:
    """One stored applicant as the contract describes it, for sorting and filtering."""

    record: Applicant  # what is written
    values: Mapping[str, Any]  # sortable field -> str | int (µs) | None
    phone_1: str | None


@st.composite
def applicant_rows(
    draw: st.DrawFn, integrations: Sequence[tuple[str, str]] = INTEGRATIONS
) -> ModelRow:
    """One applicant with its model row; nested arrays are present but not modelled."""
    integration_id, vendor = draw(st.sampled_from(integrations))
    x_id = draw(_SOURCE_IDS)
    stamps: dict[str, int] = {}
    written: dict[str, str] = {}
    for name in INSTANT_FIELDS:
        micros = draw(instants())
        written[name], named = draw(instant_text(micros, exact=True))
        assert named == micros
        stamps[name] = floor_ms(micros)
    record = Applicant(
        id=draw(ids),
        created_at=written["created_at"],
        updated_at=written["updated_at"],
        last_seen=written["last_seen"],
        x_id=x_id,
        x_property_id=draw(_SOURCE_IDS),
        x_lead_id=draw(_LOOSE),
        x_unit_id=draw(_LOOSE),
        x_unit_id_preferred=draw(st.lists(st.sampled_from(AWKWARD_TEXT), max_size=2)),
        x_lease_id=draw(_LOOSE),
        property_id=draw(_PROPERTY_IDS),
        unit_id_preferred=draw(st.lists(st.sampled_from(AWKWARD_TEXT), max_size=2)),
        integration_id=integration_id,
        integration_vendor=vendor,
        first_name=draw(_NAMES),
        middle_name=draw(_NAMES),
        last_name=draw(_NAMES),
        email_1=draw(_EMAILS),
        email_2=draw(_LOOSE),
        phone_1=draw(_PHONES),
        phone_1_type=draw(_LOOSE),
        phone_2=draw(_PHONES),
        phone_2_type=draw(_LOOSE),
        date_of_birth=draw(_DATES_OF_BIRTH),
        address_1=draw(_LOOSE),
        address_1_alternate=draw(_LOOSE),
        address_2=draw(_LOOSE),
        address_2_alternate=draw(_LOOSE),
        city=draw(_CITIES),
        city_alternate=draw(_LOOSE),
        state=draw(_STATES),
        state_alternate=draw(_LOOSE),
        zip=draw(_ZIPS),
        zip_alternate=draw(_LOOSE),
        country=draw(_LOOSE),
        country_alternate=draw(_LOOSE),
        notes=draw(st.none() | text(12)),
        type_normalized=draw(_LOOSE),
        type_raw=draw(_LOOSE),
        custom_data=draw(_CUSTOM_DATA),
        applications=draw(
            st.lists(
                st.builds(Application, applicant_id=st.just(x_id), status_raw=_LOOSE),
                max_size=2,
            )
        ),
        pets=draw(st.lists(_PETS, max_size=1)),
        screenings=draw(st.lists(_SCREENINGS, max_size=1)),
        self_reported_income=draw(st.lists(_INCOMES, max_size=1)),
    )
    values: dict[str, Any] = {name: getattr(record, name) for name in SORTABLE}
    values.update(stamps)
    return ModelRow(record=record, values=values, phone_1=record.phone_1)


def source_key(row: ModelRow) -> tuple[str, str, str]:
    """The upsert key: (integration_id, x_property_id, x_id)."""
    return (row.record.integration_id, row.record.x_property_id, row.record.x_id)


def datasets(
    *,
    min_size: int = 0,
    max_size: int = 24,
    integrations: Sequence[tuple[str, str]] = INTEGRATIONS,
) -> st.SearchStrategy[list[ModelRow]]:
    """Rows with distinct ids and distinct upsert keys (an upsert would merge them)."""
    return st.lists(
        applicant_rows(integrations),
        min_size=min_size,
        max_size=max_size,
        unique_by=(lambda row: row.record.id, source_key),
    )


# --- list queries -------------------------------------------------------------------


@dataclass
class ListQuery:
    """A drawn query: what is sent, and what the model needs to answer it."""

    # What is sent, in order; values exactly as sent (before percent-encoding).
    params: list[tuple[str, str]] = field(default_factory=list)
    order_keys: tuple[tuple[str, str], ...] | None = None  # None: order-by absent
    offset: int = 0
    limit: int = DEFAULT_LIMIT
    bounds: dict[str, int] = field(default_factory=dict)  # bound parameter -> µs
    equal: dict[str, str] = field(default_factory=dict)
    email_1: str | None = None
    phone_1: str | None = None
    plus_for_space: bool = True

    @property
    def echo(self) -> list[dict[str, str]]:
        """`meta.orderBy` the contract promises for this query."""
        keys = (("created_at", "desc"),) if self.order_keys is None else self.order_keys
        return [{"field": name, "direction": direction} for name, direction in keys]

    def query_string(self, params: Iterable[tuple[str, str]] | None = None) -> str:
        pairs = list(self.params if params is None else params)
        return urlencode(pairs, quote_via=quote_plus if self.plus_for_space else quote)

    def with_page(self, offset: int, limit: int) -> list[tuple[str, str]]:
        """The same filters and ordering, for another page."""
        kept = [(name, value) for name, value in self.params if name not in ("offset", "limit")]
        return [*kept, ("offset", str(offset)), ("limit", str(limit))]


def ascii_fold(value: str) -> str:
    return value.translate({ord(c): ord(c.lower()) for c in string.ascii_uppercase})


def case_variants(value: str) -> st.SearchStrategy[str]:
    """The same text with the case of its letters changed: ASCII ones, others, or both."""
    ascii_letters = set(string.ascii_letters)
    only_ascii = "".join(c.swapcase() if c in ascii_letters else c for c in value)
    only_other = "".join(c if c in ascii_letters else c.swapcase() for c in value)
    flipped = st.lists(st.booleans(), min_size=len(value), max_size=len(value)).map(
        lambda flips: "".join(
            c.swapcase() if flip else c for c, flip in zip(value, flips, strict=True)
        )
    )
    return st.sampled_from((value.upper(), value.lower(), only_ascii, only_other)) | flipped


@st.composite
def order_by(draw: st.DrawFn) -> tuple[str | None, tuple[tuple[str, str], ...] | None]:
    """(order-by text or None when absent, the keys the contract reads from it)."""
    mode = draw(st.sampled_from(("absent", "empty", "keys", "keys", "keys")))
    if mode == "absent":
        return None, None
    if mode == "empty":
        return "", ()
    fields = draw(st.lists(st.sampled_from(SORTABLE), min_size=1, max_size=4, unique=True))
    parts: list[str] = []
    keys: list[tuple[str, str]] = []
    for name in fields:
        written = draw(st.sampled_from((None, "asc", "desc", "ASC", "Desc", "dEsC", "aSc")))
        keys.append((name, "asc" if written is None else written.lower()))
        parts.append(name if written is None else f"{name}:{written}")
    return ",".join(parts), tuple(keys)


@st.composite
def list_queries(
    draw: st.DrawFn,
    rows: Sequence[ModelRow],
    *,
    integrations: Sequence[tuple[str, str]] = INTEGRATIONS,
    record_route: bool = False,
) -> ListQuery:
    """A list query whose filter values mostly come from the data, so they match.

    With `record_route`, only the parameters the single-record route takes.
    """
    query = ListQuery(plus_for_space=draw(st.booleans()))
    pairs: list[tuple[str, str]] = []

    text_, keys = draw(order_by())
    if text_ is not None:
        pairs.append(("order-by", text_))
    query.order_keys = keys

    def some_value(name: str, pool: Sequence[str]) -> str:
        seen = [str(row.values[name]) for row in rows if row.values[name] is not None]
        return draw(st.sampled_from(seen) if seen else st.sampled_from(pool))

    for bound, (column, _) in DATE_BOUNDS.items():
        if draw(st.integers(0, 3)) == 0:
            existing = [row.values[column] for row in rows]
            base = draw(st.sampled_from(existing) if existing else instants())
            delta = draw(st.sampled_from((0, 0, 1, -1, 999, -999, 1000, -1000, 86_400_000_000)))
            written, named = draw(instant_text(base + delta, exact=draw(st.booleans())))
            pairs.append((bound, written))
            query.bounds[bound] = named

    for name in () if record_route else EQUALITY_FILTERS:
        if draw(st.integers(0, 5)) == 0:
            value = draw(
                st.one_of(
                    st.just(some_value(name, [i for i, _ in integrations])),
                    st.sampled_from([i for i, _ in integrations] + ["YARDI", "prop_1", "1"]),
                    text(4),
                )
            )
            pairs.append((name, value))
            if value:  # an empty value means the parameter is absent
                query.equal[name] = value
    if draw(st.integers(0, 7)) == 0 and not record_route and rows:
        # x_id needs integration_id and x_property_id: take all three from one record.
        row = draw(st.sampled_from(rows))
        for name in ("integration_id", "x_property_id", "x_id"):
            value = str(row.values[name])
            pairs = [pair for pair in pairs if pair[0] != name]
            pairs.append((name, value))
            query.equal[name] = value

    if draw(st.integers(0, 2)) == 0 and not record_route:
        emails = [row.values["email_1"] for row in rows if row.values["email_1"]]
        email = draw(st.sampled_from(emails or list(EMAILS[:-1])))
        # Mostly a case variant: ASCII case must be ignored, any other case must not.
        email = draw(
            st.one_of(
                case_variants(email),
                case_variants(email),
                st.just(email),
                st.sampled_from(EMAILS[:-1]),
            )
        )
        if email:
            pairs.append(("email_1", email))
            query.email_1 = email
    if draw(st.integers(0, 3)) == 0 and not record_route:
        query.phone_1 = draw(st.sampled_from(PHONE_NUMBERS))
        pairs.append(("phone_1", query.phone_1))

    offset = draw(
        st.one_of(st.none(), st.just(""), st.integers(0, len(rows) + 2), st.just(MAX_OFFSET))
    )
    if offset is not None:
        pairs.append(("offset", str(offset)))
        query.offset = offset if isinstance(offset, int) else 0
    limit = draw(st.one_of(st.none(), st.just(""), st.integers(1, 6), st.integers(1, MAX_LIMIT)))
    if limit is not None:
        pairs.append(("limit", str(limit)))
        query.limit = limit if isinstance(limit, int) else DEFAULT_LIMIT

    query.params = draw(st.permutations(pairs))
    return query


# --- the model ----------------------------------------------------------------------


def _compare(left: Any, right: Any) -> int:
    """Nulls before everything; strings by code point; instants (ints) by value."""
    if left is None or right is None:
        return (left is not None) - (right is not None)
    return int(left > right) - int(left < right)


def total_keys(order_keys: tuple[tuple[str, str], ...] | None) -> list[tuple[str, str]]:
    """The contract's ordering: requested keys (default created_at desc), then id."""
    keys = list((("created_at", "desc"),) if order_keys is None else order_keys)
    return [*keys, ("id", keys[-1][1] if keys else "asc")]


def sort_rows(
    rows: Iterable[ModelRow], order_keys: tuple[tuple[str, str], ...] | None
) -> list[ModelRow]:
    keys = total_keys(order_keys)

    def compare(a: ModelRow, b: ModelRow) -> int:
        for name, direction in keys:
            result = _compare(a.values[name], b.values[name])
            if result:
                return result if direction == "asc" else -result
        return 0

    return sorted(rows, key=functools.cmp_to_key(compare))


def ascii_digits(text_: str) -> str:
    return "".join(c for c in text_ if c in string.digits)


def matches(row: ModelRow, query: ListQuery, scope: frozenset[str] | None = None) -> bool:
    """Whether the contract says `row` is in the result set of `query` for `scope`."""
    if scope is not None and row.values["integration_id"] not in scope:
        return False
    for bound, instant in query.bounds.items():
        column, op = DATE_BOUNDS[bound]
        stored = row.values[column]
        if (op == ">=" and stored < instant) or (op == "<=" and stored > instant):
            return False
    for name, value in query.equal.items():
        if row.values[name] != value:
            return False
    if query.email_1 is not None:
        email = row.values["email_1"]
        if email is None or ascii_fold(email) != ascii_fold(query.email_1):
            return False
    if query.phone_1 is not None:
        if row.phone_1 is None:
            return False
        if ascii_digits(row.phone_1) not in (query.phone_1, "1" + query.phone_1):
            return False
    return True


def expected_matches(
    rows: Iterable[ModelRow], query: ListQuery, scope: frozenset[str] | None = None
) -> list[ModelRow]:
    """Every matching row, in the contract's order."""
    return sort_rows((row for row in rows if matches(row, query, scope)), query.order_keys)


def served_values(row: ModelRow) -> dict[str, Any]:
    """The sortable fields of `row` as the API must write them."""
    return {
        name: served_instant(value) if name in INSTANT_FIELDS else value
        for name, value in row.values.items()
    }


# --- serving a drawn data set ---------------------------------------------------------


# A memory-backed directory where there is one: a fresh database per example is then
# cheap (no fsync), which is what lets the properties run many examples.
_SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@dataclass(frozen=True)
class Served:
    """A running app over a drawn data set."""

    client: AsyncTestClient[Litestar]
    tokens: dict[str, str]  # token name -> token
    db_path: Path


@asynccontextmanager
async def serve(
    rows: Sequence[ModelRow], scopes: Mapping[str, tuple[str, ...]]
) -> AsyncIterator[Served]:
    """The real app over a fresh database file holding `rows`, with one token per scope.

    Hypothesis runs many examples inside one test function, so function-scoped fixtures
    would be shared between examples; each example gets its own directory here instead.
    An empty scope means an unscoped token.
    """
    with tempfile.TemporaryDirectory(dir=_SCRATCH) as directory:
        path = Path(directory) / "leasestar.db"
        connection = open_for_write(path)
        try:
            write_records(connection, [row.record for row in rows])
            tokens = {name: create_token(connection, name, scope) for name, scope in scopes.items()}
        finally:
            connection.close()
        async with AsyncTestClient(app=create_app(Settings(db_path=path))) as client:
            yield Served(client, tokens, path)


def check_page(
    body: Any,
    query: ListQuery,
    expected: Sequence[ModelRow],
    offset: int,
    limit: int,
) -> None:
    """A list response is exactly the model's slice, with the meta the contract promises."""
    results = body["results"]
    want = expected[offset : offset + limit]
    assert [result["id"] for result in results] == [row.values["id"] for row in want]
    for result, row in zip(results, want, strict=True):
        assert {name: result[name] for name in SORTABLE} == served_values(row)
        assert result["phone_1"] == row.phone_1
    # Exactly the contract's meta keys; keys added beside them (a cursor) are not judged here.
    meta = {name: body["meta"].get(name) for name in META_KEYS}
    assert meta == {
        "offset": offset,
        "limit": limit,
        "orderBy": query.echo,
        "hasMore": offset + len(results) < len(expected),
        "total": len(expected),
    }


async def get_list(client: AsyncTestClient[Litestar], query_string: str) -> Any:
    response = await client.get(f"/v1/applicants?{query_string}")
    assert response.status_code == 200, (query_string, response.text)
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


async def check_query(
    client: AsyncTestClient[Litestar],
    rows: Sequence[ModelRow],
    query: ListQuery,
    step: int,
    scope: frozenset[str] | None = None,
) -> list[Any]:
    """One drawn page, then a walk over every page with a fixed limit; the bodies seen.

    Every page must be the model's slice of the rows matching `query` within `scope`
    (the token's integrations, None for all); the walk's pages must never overlap and
    must together be exactly the matching rows, in order.
    """
    expected = expected_matches(rows, query, scope)
    query_string = query.query_string()
    note(f"GET /v1/applicants?{query_string}")
    note(f"expected ids: {[row.values['id'] for row in expected]}")
    body = await get_list(client, query_string)
    check_page(body, query, expected, query.offset, query.limit)
    bodies = [body]

    seen: list[str] = []
    offset = 0
    while True:
        body = await get_list(client, query.query_string(query.with_page(offset, step)))
        check_page(body, query, expected, offset, step)
        bodies.append(body)
        page_ids = [result["id"] for result in body["results"]]
        assert not set(page_ids) & set(seen), "pages overlap"
        seen += page_ids
        if not body["meta"]["hasMore"]:
            break
        offset += step
    assert seen == [row.values["id"] for row in expected]
    # One page past the end: nothing, and nothing more.
    beyond = len(expected) + step
    body = await get_list(client, query.query_string(query.with_page(beyond, step)))
    check_page(body, query, expected, beyond, step)
    bodies.append(body)
    bodies += await walk_cursors(client, query, expected, step)
    return bodies


async def walk_cursors(
    client: AsyncTestClient[Litestar],
    query: ListQuery,
    expected: Sequence[ModelRow],
    step: int,
) -> list[Any]:
    """Follow `meta.next` from the first page: the same pages as the offset walk."""
    body = await get_list(client, query.query_string(query.with_page(0, step)))
    bodies = [body]
    offset = 0
    while body["meta"]["hasMore"]:
        cursor = body["meta"].get("next")
        if cursor is None:  # no cursors offered: nothing more to walk
            break
        offset += len(body["results"])
        note(f"cursor at {offset}: {cursor}")
        body = await get_list(client, urlencode({"cursor": cursor}))
        check_page(body, query, expected, offset, step)
        bodies.append(body)
    assert offset + len(body["results"]) == len(expected)
    return bodies
