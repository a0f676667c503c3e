"""Random bytes to picks: the 256-slot tables and struct formats the generator draws with.

A record's random draws come from one `randbytes` call unpacked by one struct format;
each field is a byte (a pick from a 256-slot table, or a yes/no against a threshold) or
a wider integer reduced to its range. Also the served text of instants and dates.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from datetime import date, timedelta
from itertools import permutations
from typing import Final, NamedTuple, TypeVar

from leasestar.seed.vocabulary import (
    APPLICANT_AGES,
    APPLICANT_TYPES,
    APPLICATION_COUNTS,
    APPLICATION_SOURCES,
    AREA_CODES,
    CITIES,
    DAY,
    EMAIL_DOMAINS,
    FIRST_NAMES,
    INCOME_COUNTS,
    INCOME_TYPES,
    INTEGRATIONS,
    LAST_NAMES,
    LEAD_SOURCES,
    MIDDLE_NAMES,
    NOTES,
    PET_COUNTS,
    PET_FLAGS,
    PET_NAMES,
    PET_TYPES,
    PHONE_2_TYPES,
    PHONE_FORMATS,
    PHONE_TYPES,
    PRIMARY_INCOME_BANDS,
    PROPERTIES_PER_INTEGRATION,
    SCREENING_COUNTS,
    SCREENING_STATUSES,
    SECONDARY_INCOME_BANDS,
    STATUSES,
    STREETS,
    TAGS,
)

T = TypeVar("T")


# --- drawing from random bytes ---------------------------------------------------------
#
# A byte `b` (0..255) is a yes/no with `b < PERCENT[p]` (p% likely) or a pick from a
# 256-slot table (`spread`), each item in 256 // n or 256 // n + 1 slots: uniform to
# within a slot, which synthetic data does not notice. A range beyond a byte takes a
# draw of 16 bits (ranges up to ~1,000: a bias under 2%), 32 or 64 bits modulo its size.


# `draw < PERCENT[p]`: a byte draw that is true p% of the time (to within 1/256).
PERCENT: Final = tuple(round(p * 256 / 100) for p in range(101))
NULL: Final = PERCENT[10]  # the share of nulls in every nullable field: 10%
ONE_IN_EIGHT: Final = 32


def spread(items: Sequence[T]) -> tuple[T, ...]:
    """A 256-slot table of `items`, as evenly as 256 slots allow: `table[byte]` picks one."""
    return tuple(items[slot * len(items) // 256] for slot in range(256))


def weighted(shares: Iterable[tuple[T, int]]) -> tuple[T, ...]:
    """A 256-slot table of items, each in (about) its share of the slots."""
    return spread([item for item, share in shares for _ in range(share)])


def yes_below(percent: int | None) -> int | None:
    """For `yes_no`: the byte below which a draw not null is yes, `percent`% of them."""
    return None if percent is None else NULL + round(percent * (256 - NULL) / 100)


def yes_no(draw: int, yes_below: int | None) -> bool | None:
    """A nullable yes/no from one byte: null 10% (always, if `yes_below` is None)."""
    return None if yes_below is None or draw < NULL else draw < yes_below


INTEGRATION = spread(range(len(INTEGRATIONS)))
PROPERTY = spread(range(PROPERTIES_PER_INTEGRATION))
FIRST = spread(FIRST_NAMES)
MIDDLE = spread(MIDDLE_NAMES)
LAST = spread(LAST_NAMES)
CITY = spread(CITIES)
STREET = spread(STREETS)
DOMAIN = spread(EMAIL_DOMAINS)
AREA_CODE = spread(AREA_CODES)
PHONE_TYPE = weighted(PHONE_TYPES)
PHONE_2_TYPE = weighted(PHONE_2_TYPES)
PHONE_FORMAT = spread(PHONE_FORMATS)
APPLICANT_TYPE = spread(APPLICANT_TYPES)
NOTE_PICKS = spread(NOTES)
LEAD_SOURCE = spread(LEAD_SOURCES)
STATUS = spread(STATUSES)
APPLICATION_SOURCE = spread(APPLICATION_SOURCES)
PET_NAME = spread(PET_NAMES)
GENDER = spread(("Male", "Female"))
SCREENING_STATUS = spread(SCREENING_STATUSES)


class Breed(NamedTuple):
    """A breed as `_pet` draws it: weight = (lightest + draw % weights * step) / 100 lb."""

    name: str
    lightest: int  # hundredths of a lb
    weights: int  # how many weights, `step` apart
    step: int  # hundredths of a lb: tenths from a pound up, as owners weigh them
    oldest: int  # years
    colors: tuple[str, ...]  # a 256-slot table


class PetType(NamedTuple):
    name: str
    breeds: tuple[Breed, ...]  # 256-slot tables, like the rest
    notes: tuple[str, ...]
    declawed: int | None  # `yes_no` thresholds
    fixed: int | None
    service_animal: int | None
    trained: int | None
    vaccinated: int | None


def breed(name: str, lightest: float, heaviest: float, oldest: int, colors: Sequence[str]) -> Breed:
    step = 10 if lightest >= 1 else 1
    low, high = round(lightest * 100), round(heaviest * 100)
    return Breed(name, low, (high - low) // step + 1, step, oldest, spread(colors))


PET_TYPE = weighted(
    (
        PetType(
            kind,
            weighted(
                (breed(name, low, high, oldest, colors), share)
                for name, share, low, high, oldest, colors in breeds
            ),
            spread(notes),
            *(yes_below(percent) for percent in PET_FLAGS[kind]),
        ),
        share,
    )
    for kind, share, breeds, notes in PET_TYPES
)
INCOME_TYPE = spread(range(len(INCOME_TYPES)))
IncomeBand = tuple[int, int, int]  # lowest cents, how many amounts, cents apart


def income_bands(bands: Sequence[tuple[int, bool, int, int]]) -> tuple[IncomeBand, ...]:
    """A 256-slot table of bands: a month's amounts to the cent, a year's to $100."""
    table = []
    for share, monthly, low, high in bands:
        step = 1 if monthly else 10_000
        table.append(((low * 100, (high - low) * 100 // step, step), share))
    return weighted(table)


PRIMARY_INCOME = tuple(income_bands(bands) for bands in PRIMARY_INCOME_BANDS)
SECONDARY_INCOME = tuple(income_bands(bands) for bands in SECONDARY_INCOME_BANDS)
APPLICATION_COUNT = spread(APPLICATION_COUNTS)
PET_COUNT = spread(PET_COUNTS)
SCREENING_COUNT = spread(SCREENING_COUNTS)
INCOME_COUNT = spread(INCOME_COUNTS)
UPTO_TWO = spread((0, 1, 2))
# custom_data.tags: 0, 1 or 2 distinct tags, in drawn order.
TAG_PICKS: Final[tuple[tuple[list[str], ...], ...]] = (
    spread([[]]),
    spread([list(pair) for pair in permutations(TAGS, 1)]),
    spread([list(pair) for pair in permutations(TAGS, 2)]),
)
# Numbers written with leading zeros, written once.
UNITS = tuple(f"U{number:04d}" for number in range(1, 401))  # U0001 .. U0400
THREE_DIGITS = tuple(f"{number:03d}" for number in range(1000))
FOUR_DIGITS = tuple(f"{number:04d}" for number in range(10000))
# Days from a date of birth to created_at's day, at least, by drawn age: `age` years span
# at most age * 365 + ceil(age / 4) days (18 years: 6,575), never more than this for
# these ages, so an applicant is at least the age drawn, 18 or more, at created_at.
AGE_DAYS = weighted((int(age * 365.2425) + 2, share) for age, share in APPLICANT_AGES)


# The draws of one object are one `randbytes` call unpacked by one struct format, each
# line of it commented with the names it unpacks into, in order. B: a byte (a yes/no or
# a table pick), H: 16 bits, I: 32 bits, Q: 64 bits (a number reduced to its range),
# 12s: the id's 96 random bits.
APPLICANT_DRAWS = struct.Struct(
    "<12s Q B H H"  # id_bits, created_draw, on_midnight, updated_steps, seen_days
    "B B B B B"  # integration_draw, property_draw, first_draw, last_draw, city_draw
    "B B B B"  # application_count, pet_count, screening_count, income_count
    "BI BH"  # lead_null, lead_number, unit_null, unit_number
    "BHH BII"  # preferred_count, _1, _2, unit_preferred_count, _1, _2
    "BBI"  # lease_at_all, lease_null, lease_number
    "B BBB B"  # first_null, middle_at_all, middle_null, middle_draw, last_null
    "BBBH B"  # email_null, upper_draw, domain_draw, handle_number, email_2_at_all
    "BBH"  # email_2_null, email_2_domain, email_2_number
    "BBHHI BB"  # (unused), phone_format, phone_a, phone_b, phone_c, (unused), phone_type_draw
    "BBHI BB"  # phone_2_at_all, phone_2_null, phone_2_area, phone_2_line, _type_draw, (unused)
    "BHH"  # birth_null, age_draw, birth_day
    "BIB BBIB"  # address_null, _number, street_draw, address_alt_at_all, _null, _number, _street
    "BBH BB"  # apartment_at_all, apartment_null, apartment_number, unit_b_at_all, unit_b_null
    "B BBB"  # city_null, (unused), city_alt_null, city_alt_draw
    "B BBB"  # state_null, (unused), state_alt_null, (unused)
    "BH BBI"  # zip_null, zip_digits, (unused), zip_alt_null, zip_alt_number
    "B BB"  # country_null, (unused), country_alt_null
    "BBB BBB"  # notes_at_all, notes_null, notes_draw, type_draw, type_normalized_null, _raw_null
    "B B H B B"  # custom_at_all, lead_source_draw, score_draw, tag_count, tags_draw
)
APPLICATION_DRAWS = struct.Struct(
    "<I B B B"  # number, status_draw, custom_at_all, source_draw
)
PET_DRAWS = struct.Struct(
    "<B B H H B B B"  # kind_draw, breed_draw, updated_draw, (unused), age, color, name
    "I B B B"  # x_id_number, gender_null, gender, declawed
    "B B B B"  # fixed, service_animal, trained, vaccinated
    "B H B I"  # notes, weight_draw, custom_at_all, licence
)
SCREENING_DRAWS = struct.Struct(
    "<I B B"  # x_id_number, status, date_draw
)
INCOME_DRAWS = struct.Struct(
    "<I B B B"  # amount_draw, type_draw, normalized_null, raw_null
)
# Where in the applicant's draws the integration is (read before the record is built).
INTEGRATION_DRAW: Final = 5


# --- instants ----------------------------------------------------------------------------

# `format_instant` from pieces written once: a day's date, a minute of the day, a
# second, a millisecond. About 4x faster, and seeding formats several instants a record.
DAYS: dict[int, str] = {}
MINUTES: Final = tuple(f"{minute // 60:02d}:{minute % 60:02d}:" for minute in range(1440))
SECONDS: Final = tuple(f"{second:02d}." for second in range(60))
MILLISECONDS: Final = tuple(f"{millisecond:03d}Z" for millisecond in range(1000))
EPOCH_DAY: Final = date(1970, 1, 1)
DATES: dict[int, str] = {}


def instant_text(micros: int) -> str:
    """`leasestar.instants.format_instant(micros)`, from cached pieces."""
    day, rest = divmod(micros, DAY)
    prefix = DAYS.get(day)
    if prefix is None:
        prefix = DAYS[day] = f"{(EPOCH_DAY + timedelta(days=day)).isoformat()}T"
    seconds, micro = divmod(rest, 1_000_000)
    minutes, second = divmod(seconds, 60)
    return prefix + MINUTES[minutes] + SECONDS[second] + MILLISECONDS[micro // 1000]


def date_text(day: int) -> str:
    """The calendar date `day` days after 1970-01-01 (before, if negative), cached."""
    text = DATES.get(day)
    if text is None:
        text = DATES[day] = (EPOCH_DAY + timedelta(days=day)).isoformat()
    return text
