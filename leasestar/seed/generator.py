"""Deterministic synthetic applicants: plausible, varied, and awkward on purpose.

The same (count, seed) always gives the same records, byte for byte, service fields
included, so a seeded database is reproducible and re-seeding changes nothing. The
data is built to exercise the API: several integrations with upper-case vendors,
many properties, nested arrays of every length from empty up, a share of nulls in
every nullable field, timestamps spread over years, and deliberate ties in every
sort key (shared names, cities and timestamps) so the id tiebreak is always tested.
And plausible, field by field and together: created_at <= updated_at <= last_seen in
every record and nested item (a pet's or screening's within its applicant's), adult
applicants, a phone's type only with the phone, one place per address, pets that weigh,
age and answer as their kind and breed do, and incomes a renter reports (a year's or a
month's). tests/test_seed_generator.py holds it to that.

Speed (`leasestar seed --count 1000000` has two minutes, issue 3): a record is built
as the plain JSON document it is stored as, not as Structs. `synthetic_records`
yields each one's canonical encoding (what msgspec writes for the Applicant, so what
an import of it stores, byte for byte) with the columns writing needs; the seed
writes those without decoding them again. `synthetic_applicants` decodes the same
bytes into validated Applicants, for tests and callers that want Structs. And the
random draws of a record come from one call: `randbytes` unpacked into named fields
with one `struct` format, each a byte (a pick from a 256-slot table, or a yes/no
against a threshold) or a wider integer reduced to its range. About 90 draws a
record through Python-level `randrange`/`choice` were most of the old generator's
time.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, timedelta
from itertools import permutations
from typing import Any, Final, NamedTuple, TypeVar

from leasestar.applicants.prepared import RecordFields
from leasestar.applicants.records import Applicant, applicant_encoder, applicant_line_decoder

# Enumerated-looking values (vendors, phone kinds, normalized statuses) are drawn only
# from what the mirrored API's published OpenAPI document enumerates for them
# (propexo/documentation, fern/openapi/openapi.yml), so that a client generated from it
# reads the demo data; import itself still takes any string (the specification leaves
# them open).
INTEGRATIONS: Final = (
    ("int_mri_01", "MRI"),
    ("int_mri_02", "MRI"),
    ("int_entrata_01", "ENTRATA"),
    ("int_realpage_01", "REALPAGE"),
    ("int_buildium_01", "BUILDIUM"),
    ("int_resman_01", "RESMAN"),
)
PROPERTIES_PER_INTEGRATION: Final = 40
FIRST_NAMES: Final = (
    "Olivia", "Liam", "Emma", "Noah", "Ava", "Elijah", "Sophia", "James", "Isabella",
    "William", "Mia", "Benjamin", "Charlotte", "Lucas", "Amelia", "Henry", "Harper",
    "Theodore", "Evelyn", "Mateo", "José", "Zoë", "Chloé", "Łukasz", "Søren", "Aaliyah",
    "Mei", "Hiroshi", "Priya", "Oluwaseun",
)  # fmt: skip
MIDDLE_NAMES: Final = ("A.", "Marie", "Lee", "James", "Rose", "Ann", "J.", "Grace", "Ray")
LAST_NAMES: Final = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis",
    "Rodriguez", "Martinez", "Hernandez", "Lopez", "Gonzalez", "Wilson", "Anderson",
    "Thomas", "Taylor", "Moore", "Jackson", "Martin", "Lee", "Pérez", "Thompson", "White",
    "Harris", "Sánchez", "Clark", "Ramírez", "Lewis", "Robinson", "O'Brien", "van der Berg",
    "Nguyen", "Kim", "Patel", "Müller",
)  # fmt: skip
CITIES: Final = (
    ("Austin", "TX", "787"), ("Dallas", "TX", "752"), ("Houston", "TX", "770"),
    ("Denver", "CO", "802"), ("Phoenix", "AZ", "850"), ("Atlanta", "GA", "303"),
    ("Seattle", "WA", "981"), ("Portland", "OR", "972"), ("Chicago", "IL", "606"),
    ("Raleigh", "NC", "276"), ("Nashville", "TN", "372"), ("Tampa", "FL", "336"),
)  # fmt: skip
STREETS: Final = ("Main St", "Oak Ave", "Maple Dr", "Cedar Ln", "Elm St", "Park Blvd", "Pine Ct")
EMAIL_DOMAINS: Final = ("example.com", "mail.example.org", "inbox.example.net")
# Real area codes: the cities' own, and others, as people keep their numbers when they move.
AREA_CODES: Final = (
    "512", "737", "214", "469", "972", "713", "832", "281", "303", "720", "602", "480",
    "404", "678", "206", "425", "503", "971", "312", "773", "919", "984", "615", "629",
    "813", "727", "212", "415", "617", "305", "702", "818",
)  # fmt: skip
# (type, share): a first phone is mostly a mobile; a second may also be a fax.
PHONE_TYPES: Final = (("MOBILE", 14), ("HOME", 4), ("WORK", 2), ("OTHER", 1))
PHONE_2_TYPES: Final = (("MOBILE", 4), ("HOME", 3), ("WORK", 3), ("FAX", 2), ("OTHER", 1))
# As source systems send them: typed by hand into a form, E.164 from an SMS provider,
# bare digits from a CSV export, with or without the country code.
PHONE_FORMATS: Final = (
    "({a}) {b}-{c}", "{a}-{b}-{c}", "{a}.{b}.{c}", "{a}{b}{c}", "+1{a}{b}{c}", "+1 {a}-{b}-{c}",
    "1-{a}-{b}-{c}",
)  # fmt: skip
APPLICANT_TYPES: Final = (("PRIMARY", "Primary"), ("CO_APPLICANT", "Co-Applicant"),
                          ("GUARANTOR", "Guarantor"), ("OCCUPANT", "Occupant"))  # fmt: skip
# An applicant's age in whole years at created_at, and its share: renters are mostly young
# adults, never minors (a minor is an occupant on a lease, not an applicant).
APPLICANT_AGES: Final = (
    tuple((age, 4) for age in range(18, 25)) + tuple((age, 5) for age in range(25, 35))
    + tuple((age, 3) for age in range(35, 45)) + tuple((age, 2) for age in range(45, 55))
    + tuple((age, 1) for age in range(55, 80))
)  # fmt: skip
# (status_raw, status_normalized, status): the source's words, the published normalized
# status they mean, and its lower case. "In Review" is still pending; "Waitlisted" is none
# of the named outcomes.
STATUSES: Final = (("Pending", "PENDING", "pending"), ("Approved", "APPROVED", "approved"),
                   ("Denied", "DENIED", "denied"), ("Cancelled", "CANCELED", "canceled"),
                   ("In Review", "PENDING", "pending"),
                   ("Waitlisted", "OTHER", "other"))  # fmt: skip
APPLICATION_SOURCES: Final = ("web", "walk-in", "phone")
# Pets by type: (type, share in 100 pets, breeds, notes). A breed: (name, share within its
# type, lightest and heaviest adult weight in lb, oldest age in years, colors). Every pet
# is at least a year old, so it weighs what an adult of its breed does.
PET_TYPES: Final = (
    ("dog", 50, (
        ("Mixed", 6, 10, 70, 15, ("black", "brown", "tan", "white", "brindle", "spotted")),
        ("Labrador Retriever", 4, 55, 80, 13, ("black", "yellow", "chocolate")),
        ("Golden Retriever", 2, 55, 75, 12, ("golden", "cream", "red")),
        ("German Shepherd", 2, 50, 90, 11, ("black and tan", "sable", "black")),
        ("Pit Bull Terrier", 2, 35, 65, 14, ("blue", "brindle", "white", "fawn")),
        ("Boxer", 1, 50, 80, 10, ("fawn", "brindle", "white")),
        ("Standard Poodle", 1, 40, 70, 14, ("white", "black", "apricot", "grey")),
        ("Siberian Husky", 1, 35, 60, 13, ("grey and white", "black and white", "red and white")),
        ("Border Collie", 1, 30, 55, 14, ("black and white", "red merle", "blue merle")),
        ("Beagle", 2, 18, 30, 14, ("tricolor", "lemon", "red and white")),
        ("French Bulldog", 2, 16, 28, 11, ("fawn", "brindle", "cream", "blue")),
        ("Boston Terrier", 1, 12, 25, 13, ("black and white", "brindle and white")),
        ("Dachshund", 2, 11, 25, 15, ("red", "black and tan", "dapple")),
        ("Pug", 1, 14, 18, 13, ("fawn", "black")),
        ("Shih Tzu", 2, 9, 16, 15, ("white and gold", "black and white", "brindle")),
        ("Cavalier King Charles Spaniel", 1, 13, 18, 12, ("blenheim", "tricolor", "ruby")),
    ), ("", "Friendly", "Needs a yard", "Crate trained", "House trained")),
    ("cat", 34, (
        ("Domestic Shorthair", 6, 7, 14, 18,
         ("black", "orange tabby", "brown tabby", "grey", "calico", "tuxedo")),
        ("Domestic Longhair", 2, 7, 15, 18, ("black", "grey", "white", "tortoiseshell")),
        ("Siamese", 1, 6, 12, 18, ("seal point", "blue point", "chocolate point")),
        ("Maine Coon", 1, 10, 18, 15, ("brown tabby", "red tabby", "black", "silver")),
        ("Persian", 1, 7, 12, 15, ("white", "cream", "silver", "black")),
        ("Ragdoll", 1, 10, 18, 15, ("seal point", "blue bicolor", "lilac point")),
    ), ("", "Friendly", "Indoor only", "Litter trained")),
    ("bird", 6, (
        ("Parakeet", 4, 0.06, 0.09, 10, ("green", "blue", "yellow")),
        ("Cockatiel", 2, 0.17, 0.26, 20, ("grey", "lutino", "pied")),
        ("Lovebird", 1, 0.09, 0.13, 12, ("green", "peach-faced", "blue")),
        ("Canary", 1, 0.03, 0.06, 10, ("yellow", "orange", "white")),
        ("African Grey", 1, 0.88, 1.43, 40, ("grey",)),
    ), ("", "Caged", "Talks", "Friendly")),
    ("fish", 3, (
        ("Goldfish", 3, 0.05, 0.5, 10, ("orange", "gold", "calico", "white")),
        ("Betta", 2, 0.01, 0.02, 4, ("red", "blue", "purple", "white")),
        ("Angelfish", 1, 0.02, 0.06, 10, ("silver", "black", "marble")),
    ), ("", "10-gallon tank", "20-gallon tank")),
    ("reptile", 3, (
        ("Bearded Dragon", 3, 0.6, 1.2, 12, ("tan", "orange", "yellow")),
        ("Leopard Gecko", 2, 0.1, 0.18, 15, ("yellow", "tangerine", "albino")),
        ("Ball Python", 2, 2.0, 5.0, 25, ("brown", "banana", "piebald")),
        ("Corn Snake", 1, 0.5, 1.8, 15, ("orange", "red", "amelanistic")),
        ("Red-eared Slider", 1, 0.5, 2.5, 25, ("green",)),
    ), ("", "Terrarium", "Heat lamp")),
    ("rabbit", 4, (
        ("Holland Lop", 2, 2.0, 4.0, 10, ("brown", "white", "black", "orange")),
        ("Mini Rex", 1, 3.5, 4.5, 10, ("black", "white", "castor", "blue")),
        ("Lionhead", 1, 2.5, 3.75, 9, ("white", "grey", "tortoiseshell")),
        ("Netherland Dwarf", 1, 1.1, 2.5, 11, ("white", "black", "chestnut")),
    ), ("", "Litter trained", "Free roaming", "Friendly")),
)  # fmt: skip
# Which yes/no fields apply to which type, and how many in 100 of those not null are
# yes. None: never asked of the type, so always null (a fish is neither declawed nor
# vaccinated, and in the ADA's sense only a dog is a service animal).
#              declawed, fixed, service, trained, vaccinated
PET_FLAGS: Final = {
    "dog": (None, 80, 8, 75, 92),
    "cat": (20, 88, None, 90, 85),
    "bird": (None, None, None, 30, None),
    "fish": (None, None, None, None, None),
    "reptile": (None, None, None, None, None),
    "rabbit": (None, 60, None, 55, 35),
}
PET_NAMES: Final = ("Max", "Bella", "Luna", "Charlie", "Milo", "Coco", "Rocky", "Kiwi")
SCREENING_STATUSES: Final = ("Passed", "Failed", "Pending", "Conditional")
INCOME_TYPES: Final = (("EMPLOYMENT", "Employment"), ("SELF_EMPLOYMENT", "Self-employed"),
                       ("BENEFITS", "Benefits"), ("OTHER", "Other"))  # fmt: skip
# Self-reported income, as source systems hold it: an amount with no period, a year's
# or a month's. So that a reader can tell which, a monthly amount is always under
# MONTHLY_BELOW dollars and a yearly one never is. Per income type, in INCOME_TYPES'
# order: (share in 100, monthly, lowest dollars, highest dollars) bands. An applicant's
# first income is the main one; any further one is a side income (part-time work,
# benefits, support), so smaller.
MONTHLY_BELOW: Final = 20_000
PRIMARY_INCOME_BANDS: Final = (
    ((52, False, 20_000, 90_000), (18, False, 90_000, 200_000),
     (25, True, 1_700, 12_500), (5, False, 200_000, 450_000)),
    ((45, False, 20_000, 110_000), (15, False, 110_000, 200_000),
     (32, True, 1_700, 15_000), (8, False, 200_000, 600_000)),
    ((75, True, 850, 3_800), (25, False, 20_000, 48_000)),
    ((60, True, 1_700, 9_000), (40, False, 20_000, 90_000)),
)  # fmt: skip
SECONDARY_INCOME_BANDS: Final = (
    ((65, True, 600, 4_000), (35, False, 20_000, 55_000)),
    ((75, True, 300, 5_000), (25, False, 20_000, 70_000)),
    ((100, True, 300, 2_500),),
    ((100, True, 100, 2_000),),
)  # fmt: skip
NOTES: Final = ("", "Prefers email", "Needs parking", "Relocating for work")
LEAD_SOURCES: Final = ("web", "referral", "ils", "walk-in")
TAGS: Final = ("pets", "parking", "furnished", "corporate")
# How many items a nested array gets: every length from empty up, the short ones most.
APPLICATION_COUNTS: Final = (0, 1, 1, 1, 2, 3)
PET_COUNTS: Final = (0, 0, 0, 1, 1, 2, 4)
SCREENING_COUNTS: Final = (0, 1, 1, 2)
INCOME_COUNTS: Final = (0, 1, 1, 2, 3)

# 2019-01-01 .. 2026-01-01 in microseconds: "timestamps spread over years".
START: Final = 1_546_300_800_000_000
SPAN: Final = 7 * 365 * 86_400_000_000
DAY: Final = 86_400_000_000
QUARTER_DAY: Final = DAY // 4
T = TypeVar("T")


# --- drawing from random bytes ---------------------------------------------------------
#
# A byte `b` (0..255) is a yes/no with `b < PERCENT[p]` (p% likely) or a pick from a
# 256-slot table (`_spread`), each item in 256 // n or 256 // n + 1 slots: uniform to
# within a slot, which synthetic data does not notice. A range beyond a byte takes a
# draw of 16 bits (ranges up to ~1,000: a bias under 2%), 32 or 64 bits modulo its size.


# `draw < PERCENT[p]`: a byte draw that is true p% of the time (to within 1/256).
PERCENT: Final = tuple(round(p * 256 / 100) for p in range(101))
NULL: Final = PERCENT[10]  # the share of nulls in every nullable field: 10%
ONE_IN_EIGHT: Final = 32


def _spread(items: Sequence[T]) -> tuple[T, ...]:
    """A 256-slot table of `items`, as evenly as 256 slots allow: `table[byte]` picks one."""
    return tuple(items[slot * len(items) // 256] for slot in range(256))


def _weighted(shares: Iterable[tuple[T, int]]) -> tuple[T, ...]:
    """A 256-slot table of items, each in (about) its share of the slots."""
    return _spread([item for item, share in shares for _ in range(share)])


def _yes_below(percent: int | None) -> int | None:
    """For `_yes_no`: the byte below which a draw not null is yes, `percent`% of them."""
    return None if percent is None else NULL + round(percent * (256 - NULL) / 100)


def _yes_no(draw: int, yes_below: int | None) -> bool | None:
    """A nullable yes/no from one byte: null 10% (always, if `yes_below` is None)."""
    return None if yes_below is None or draw < NULL else draw < yes_below


_INTEGRATION = _spread(range(len(INTEGRATIONS)))
_PROPERTY = _spread(range(PROPERTIES_PER_INTEGRATION))
_FIRST = _spread(FIRST_NAMES)
_MIDDLE = _spread(MIDDLE_NAMES)
_LAST = _spread(LAST_NAMES)
_CITY = _spread(CITIES)
_STREET = _spread(STREETS)
_DOMAIN = _spread(EMAIL_DOMAINS)
_AREA_CODE = _spread(AREA_CODES)
_PHONE_TYPE = _weighted(PHONE_TYPES)
_PHONE_2_TYPE = _weighted(PHONE_2_TYPES)
_PHONE_FORMAT = _spread(PHONE_FORMATS)
_APPLICANT_TYPE = _spread(APPLICANT_TYPES)
_NOTES = _spread(NOTES)
_LEAD_SOURCE = _spread(LEAD_SOURCES)
_STATUS = _spread(STATUSES)
_APPLICATION_SOURCE = _spread(APPLICATION_SOURCES)
_PET_NAME = _spread(PET_NAMES)
_GENDER = _spread(("Male", "Female"))
_SCREENING_STATUS = _spread(SCREENING_STATUSES)


class _Breed(NamedTuple):
    """A breed as `_pet` draws it: weight = (lightest + draw % weights * step) / 100 lb."""

    name: str
    lightest: int  # hundredths of a lb
    weights: int  # how many weights, `step` apart
    step: int  # hundredths of a lb: tenths from a pound up, as owners weigh them
    oldest: int  # years
    colors: tuple[str, ...]  # a 256-slot table


class _PetType(NamedTuple):
    name: str
    breeds: tuple[_Breed, ...]  # 256-slot tables, like the rest
    notes: tuple[str, ...]
    declawed: int | None  # `_yes_no` thresholds
    fixed: int | None
    service_animal: int | None
    trained: int | None
    vaccinated: int | None


def _breed(
    name: str, lightest: float, heaviest: float, oldest: int, colors: Sequence[str]
) -> _Breed:
    step = 10 if lightest >= 1 else 1
    low, high = round(lightest * 100), round(heaviest * 100)
    return _Breed(name, low, (high - low) // step + 1, step, oldest, _spread(colors))


_PET_TYPE = _weighted(
    (
        _PetType(
            kind,
            _weighted(
                (_breed(name, low, high, oldest, colors), share)
                for name, share, low, high, oldest, colors in breeds
            ),
            _spread(notes),
            *(_yes_below(percent) for percent in PET_FLAGS[kind]),
        ),
        share,
    )
    for kind, share, breeds, notes in PET_TYPES
)
_INCOME_TYPE = _spread(range(len(INCOME_TYPES)))
_IncomeBand = tuple[int, int, int]  # lowest cents, how many amounts, cents apart


def _income_bands(bands: Sequence[tuple[int, bool, int, int]]) -> tuple[_IncomeBand, ...]:
    """A 256-slot table of bands: a month's amounts to the cent, a year's to $100."""
    table = []
    for share, monthly, low, high in bands:
        step = 1 if monthly else 10_000
        table.append(((low * 100, (high - low) * 100 // step, step), share))
    return _weighted(table)


_PRIMARY_INCOME = tuple(_income_bands(bands) for bands in PRIMARY_INCOME_BANDS)
_SECONDARY_INCOME = tuple(_income_bands(bands) for bands in SECONDARY_INCOME_BANDS)
_APPLICATION_COUNT = _spread(APPLICATION_COUNTS)
_PET_COUNT = _spread(PET_COUNTS)
_SCREENING_COUNT = _spread(SCREENING_COUNTS)
_INCOME_COUNT = _spread(INCOME_COUNTS)
_UPTO_TWO = _spread((0, 1, 2))
# custom_data.tags: 0, 1 or 2 distinct tags, in drawn order.
_TAGS: Final[tuple[tuple[list[str], ...], ...]] = (
    _spread([[]]),
    _spread([list(pair) for pair in permutations(TAGS, 1)]),
    _spread([list(pair) for pair in permutations(TAGS, 2)]),
)
# Numbers written with leading zeros, written once.
_UNITS = tuple(f"U{number:04d}" for number in range(1, 401))  # U0001 .. U0400
_THREE_DIGITS = tuple(f"{number:03d}" for number in range(1000))
_FOUR_DIGITS = tuple(f"{number:04d}" for number in range(10000))
# Days from a date of birth to created_at's day, at least, by drawn age: `age` years span
# at most age * 365 + ceil(age / 4) days (18 years: 6,575), never more than this for
# these ages, so an applicant is at least the age drawn, 18 or more, at created_at.
_AGE_DAYS = _weighted((int(age * 365.2425) + 2, share) for age, share in APPLICANT_AGES)


# The draws of one object are one `randbytes` call unpacked by one struct format, each
# line of it commented with the names it unpacks into, in order. B: a byte (a yes/no or
# a table pick), H: 16 bits, I: 32 bits, Q: 64 bits (a number reduced to its range),
# 12s: the id's 96 random bits.
_APPLICANT_DRAWS = struct.Struct(
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
    "BBHI BB"  # phone_2_at_all, phone_2_null, phone_2_area, phone_2_line, _type_draw, _type_null
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
_APPLICATION_DRAWS = struct.Struct(
    "<I B B B"  # number, status_draw, custom_at_all, source_draw
)
_PET_DRAWS = struct.Struct(
    "<B B H H B B B"  # kind_draw, breed_draw, updated_draw, (unused), age, color, name
    "I B B B"  # x_id_number, gender_null, gender, declawed
    "B B B B"  # fixed, service_animal, trained, vaccinated
    "B H B I"  # notes, weight_draw, custom_at_all, licence
)
_SCREENING_DRAWS = struct.Struct(
    "<I B B"  # x_id_number, status, date_draw
)
_INCOME_DRAWS = struct.Struct(
    "<I B B B"  # amount_draw, type_draw, normalized_null, raw_null
)
# Where in the applicant's draws the integration is (read before the record is built).
_INTEGRATION_DRAW: Final = 5


# --- instants ----------------------------------------------------------------------------

# `format_instant` from pieces written once: a day's date, a minute of the day, a
# second, a millisecond. About 4x faster, and seeding formats several instants a record.
_DAYS: dict[int, str] = {}
_MINUTES: Final = tuple(f"{minute // 60:02d}:{minute % 60:02d}:" for minute in range(1440))
_SECONDS: Final = tuple(f"{second:02d}." for second in range(60))
_MILLISECONDS: Final = tuple(f"{millisecond:03d}Z" for millisecond in range(1000))
_EPOCH_DAY: Final = date(1970, 1, 1)
_DATES: dict[int, str] = {}


def _instant_text(micros: int) -> str:
    """`leasestar.instants.format_instant(micros)`, from cached pieces."""
    day, rest = divmod(micros, DAY)
    prefix = _DAYS.get(day)
    if prefix is None:
        prefix = _DAYS[day] = f"{(_EPOCH_DAY + timedelta(days=day)).isoformat()}T"
    seconds, micro = divmod(rest, 1_000_000)
    minutes, second = divmod(seconds, 60)
    return prefix + _MINUTES[minutes] + _SECONDS[second] + _MILLISECONDS[micro // 1000]


def _date_text(day: int) -> str:
    """The calendar date `day` days after 1970-01-01 (before, if negative), cached."""
    text = _DATES.get(day)
    if text is None:
        text = _DATES[day] = (_EPOCH_DAY + timedelta(days=day)).isoformat()
    return text


# --- records -----------------------------------------------------------------------------

RandomBytes = Callable[[int], bytes]  # random.Random.randbytes
_encode: Final = applicant_encoder.encode  # the encoder whose bytes the API serves


def synthetic_records(count: int, seed: int = 0) -> Iterator[tuple[bytes, RecordFields]]:
    """`count` records from `seed`, each as (canonical encoding, fields for writing).

    The encoding is what `applicant_encoder` writes for the Applicant it decodes to
    (a plain dict in the Applicant's field order encodes to the same bytes), so the
    seed stores exactly what importing its export stores. Consecutive pairs share an
    x_id in two different integrations, as source systems reuse ids: the upsert key
    stays unique while x_id orderings get ties.
    """
    rng = random.Random(seed)
    randbytes = rng.randbytes
    integration = 0
    for number in range(count):
        draws = _APPLICANT_DRAWS.unpack(randbytes(_APPLICANT_DRAWS.size))
        if number % 2 == 0:
            integration = _INTEGRATION[draws[_INTEGRATION_DRAW]]
        else:
            integration = (integration + 1) % len(INTEGRATIONS)
        yield _record(randbytes, draws, f"S{seed}-{number // 2:07d}", integration)


def synthetic_applicants(count: int, seed: int = 0) -> Iterator[Applicant]:
    """The records of `synthetic_records(count, seed)` as validated Applicants."""
    for encoded, _ in synthetic_records(count, seed):
        yield applicant_line_decoder.decode(encoded)


def _record(
    randbytes: RandomBytes, draws: tuple[Any, ...], x_id: str, integration: int
) -> tuple[bytes, RecordFields]:
    (
        id_bits, created_draw, on_midnight, updated_steps, seen_days,
        _integration_draw, property_draw, first_draw, last_draw, city_draw,
        application_count, pet_count, screening_count, income_count,
        lead_null, lead_number, unit_null, unit_number,
        preferred_count, preferred_1, preferred_2,
        unit_preferred_count, unit_preferred_1, unit_preferred_2,
        lease_at_all, lease_null, lease_number,
        first_null, middle_at_all, middle_null, middle_draw, last_null,
        email_null, upper_draw, domain_draw, handle_number, email_2_at_all,
        email_2_null, email_2_domain, email_2_number,
        _unused_6, phone_format, phone_a, phone_b, phone_c, _unused_7, phone_type_draw,
        phone_2_at_all, phone_2_null, phone_2_area, phone_2_line, phone_2_type_draw,
        phone_2_type_null,
        birth_null, age_draw, birth_day,
        address_null, address_number, street_draw,
        address_alt_at_all, address_alt_null, address_alt_number, address_alt_street,
        apartment_at_all, apartment_null, apartment_number, unit_b_at_all, unit_b_null,
        city_null, _unused_1, city_alt_null, city_alt_draw,
        state_null, _unused_2, state_alt_null, _unused_3,
        zip_null, zip_digits, _unused_4, zip_alt_null, zip_alt_number,
        country_null, _unused_5, country_alt_null,
        notes_at_all, notes_null, notes_draw, type_draw, type_normalized_null, type_raw_null,
        custom_at_all, lead_source_draw, score_draw, tag_count, tags_draw,
    ) = draws  # fmt: skip
    integration_id, vendor = INTEGRATIONS[integration]
    property_number = _PROPERTY[property_draw]
    first, last = _FIRST[first_draw], _LAST[last_draw]
    city, state, zip_prefix = _CITY[city_draw]

    # Instants at millisecond precision (the API's); one record in eight lands exactly
    # on midnight of a day: ties in every datetime ordering, resolved by the id tiebreak.
    # created <= updated <= last_seen, and so for every pet and screening (theirs lie
    # within their applicant's: a nested item's change is its record's change).
    created = START + created_draw % (SPAN // 1000) * 1000
    if on_midnight < ONE_IN_EIGHT:
        created -= created % DAY
    updated_steps %= 400
    updated = created + updated_steps * QUARTER_DAY
    last_seen = updated + seen_days % 30 * DAY
    applicant_id = "app_" + id_bits.hex()
    created_text, updated_text = _instant_text(created), _instant_text(updated)
    last_seen_text = _instant_text(last_seen)

    handle = f"{first.lower()}.{last.lower().replace(' ', '')}{handle_number % 1000}"
    email = f"{handle}@{_DOMAIN[domain_draw]}"
    email_1 = None if email_null < NULL else email.upper() if upper_draw < PERCENT[20] else email
    # North American numbers: a real area code, an exchange from 200 up.
    # The specification types phone_1 and its kind as strings: never null.
    phone_1 = _PHONE_FORMAT[phone_format].format(
        a=_AREA_CODE[phone_a & 0xFF],
        b=_THREE_DIGITS[200 + phone_b % 800],
        c=_FOUR_DIGITS[phone_c % 10000],
    )
    phone_2 = (
        f"{_AREA_CODE[phone_2_area & 0xFF]}-555-{_FOUR_DIGITS[phone_2_line % 10000]}"
        if phone_2_at_all < PERCENT[30] and phone_2_null >= NULL
        else None
    )
    # 18 or older at created_at (the day of the application).
    date_of_birth = (
        None
        if birth_null < NULL
        else _date_text(created // DAY - _AGE_DAYS[age_draw & 0xFF] - birth_day % 365)
    )
    first_name = None if first_null < NULL else first
    middle_name = (
        _MIDDLE[middle_draw] if middle_at_all < PERCENT[50] and middle_null >= NULL else None
    )
    last_name = None if last_null < NULL else last
    city_value = None if city_null < NULL else city
    state_value = None if state_null < NULL else state
    zip_value = None if zip_null < NULL else f"{zip_prefix}{zip_digits % 100:02d}"
    x_property_id = f"{vendor[:2]}-P{property_number:03d}"
    property_id = f"prop_{integration_id[4:]}_{property_number:03d}"
    type_normalized, type_raw = _APPLICANT_TYPE[type_draw]
    # A guarantor vouches for the lease but does not live there: no pets.
    pets = 0 if type_normalized == "GUARANTOR" else _PET_COUNT[pet_count]
    # An alternate (mailing or previous) address is one address, or none: its parts are
    # all absent, or each there (or null) and of one place.
    alternate = address_alt_at_all < PERCENT[20]
    alt_city, alt_state, alt_zip_prefix = _CITY[city_alt_draw]
    owner = applicant_id[-8:]  # names the nested pets and screenings
    # 0, 1 or 2 preferred units of each kind.
    units_preferred = [_UNITS[preferred_1 % 400], _UNITS[preferred_2 % 400]]
    del units_preferred[_UPTO_TWO[preferred_count] :]
    unit_ids_preferred = [
        f"unit_{unit_preferred_1 % 10**5:05d}",
        f"unit_{unit_preferred_2 % 10**5:05d}",
    ]
    del unit_ids_preferred[_UPTO_TWO[unit_preferred_count] :]

    # A plain dict in the Applicant's field order: msgspec encodes it to the same bytes
    # as the Struct, without the Struct's construction and validation.
    document = {
        "id": applicant_id,
        "created_at": created_text,
        "updated_at": updated_text,
        "last_seen": last_seen_text,
        "x_id": x_id,
        "x_property_id": x_property_id,
        "x_lead_id": None if lead_null < NULL else f"L{lead_number % 10**7:07d}",
        "x_unit_id": None if unit_null < NULL else _UNITS[unit_number % 400],
        "x_unit_id_preferred": units_preferred,
        "x_lease_id": f"LS{lease_number % 10**6:06d}"
        if lease_at_all < PERCENT[40] and lease_null >= NULL
        else None,
        "property_id": property_id,
        "unit_id_preferred": unit_ids_preferred,
        "integration_id": integration_id,
        "integration_vendor": vendor,
        "first_name": first_name,
        "middle_name": middle_name,
        "last_name": last_name,
        "email_1": email_1,
        "email_2": f"{first.lower()}{email_2_number % 100}@{_DOMAIN[email_2_domain]}"
        if email_2_at_all < PERCENT[30] and email_2_null >= NULL
        else None,
        "phone_1": phone_1,
        # A phone's type only with the phone.
        "phone_1_type": _PHONE_TYPE[phone_type_draw],
        "phone_2": phone_2,
        "phone_2_type": _PHONE_2_TYPE[phone_2_type_draw]
        if phone_2 is not None and phone_2_type_null >= NULL
        else None,
        "date_of_birth": date_of_birth,
        "address_1": None
        if address_null < NULL
        else f"{1 + address_number % 9999} {_STREET[street_draw]}",
        "address_1_alternate": f"{1 + address_alt_number % 9999} {_STREET[address_alt_street]}"
        if alternate and address_alt_null >= NULL
        else None,
        "address_2": f"Apt {1 + apartment_number % 500}"
        if apartment_at_all < PERCENT[50] and apartment_null >= NULL
        else None,
        "address_2_alternate": "Unit B"
        if alternate and unit_b_at_all < PERCENT[30] and unit_b_null >= NULL
        else None,
        "city": city_value,
        "city_alternate": alt_city if alternate and city_alt_null >= NULL else None,
        "state": state_value,
        "state_alternate": alt_state if alternate and state_alt_null >= NULL else None,
        "zip": zip_value,
        "zip_alternate": f"{alt_zip_prefix}{zip_alt_number % 100:02d}"
        if alternate and zip_alt_null >= NULL
        else None,
        "country": None if country_null < NULL else "US",
        "country_alternate": "US" if alternate and country_alt_null >= NULL else None,
        "notes": _NOTES[notes_draw] if notes_at_all < PERCENT[40] and notes_null >= NULL else None,
        "type_normalized": None if type_normalized_null < NULL else type_normalized,
        "type_raw": None if type_raw_null < NULL else type_raw,
        "custom_data": {
            "lead_source": _LEAD_SOURCE[lead_source_draw],
            "score": 300 + score_draw % 551,
            "tags": _TAGS[_UPTO_TWO[tag_count]][tags_draw],
        }
        if custom_at_all < PERCENT[70]
        else {},
        "applications": [
            _application(randbytes, x_id) for _ in range(_APPLICATION_COUNT[application_count])
        ],
        "pets": [
            _pet(randbytes, index, owner, created, created_text, updated_steps, last_seen_text)
            for index in range(pets)
        ],
        "screenings": [
            _screening(randbytes, index, owner, created, updated, created_text, last_seen_text)
            for index in range(_SCREENING_COUNT[screening_count])
        ],
        "self_reported_income": [
            _income(randbytes, _SECONDARY_INCOME if index else _PRIMARY_INCOME)
            for index in range(_INCOME_COUNT[income_count])
        ],
    }
    fields = (
        integration_id,
        x_property_id,
        x_id,
        applicant_id,
        created_text,
        updated_text,
        last_seen_text,
        vendor,
        property_id,
        first_name,
        middle_name,
        last_name,
        email_1,
        phone_1,
        date_of_birth,
        city_value,
        state_value,
        zip_value,
    )
    return _encode(document), fields


def _application(randbytes: RandomBytes, x_id: str) -> dict[str, Any]:
    number, status_draw, custom_at_all, source_draw = _APPLICATION_DRAWS.unpack(
        randbytes(_APPLICATION_DRAWS.size)
    )
    status_raw, status_normalized, status = _STATUS[status_draw]
    return {
        "applicant_id": x_id,  # an application belongs to its applicant: always x_id
        "application_id": f"APP-{number % 10**6:06d}",
        "status_raw": status_raw,
        "status_normalized": status_normalized,
        "status": status,
        "custom_data": {"source": _APPLICATION_SOURCE[source_draw]}
        if custom_at_all < PERCENT[50]
        else {},
    }


def _pet(
    randbytes: RandomBytes,
    index: int,
    owner: str,
    created: int,
    created_text: str,
    updated_steps: int,
    last_seen_text: str,
) -> dict[str, Any]:
    """A pet of its applicant's: listed when the record was created, changed at the
    latest when the record last was (`updated_steps` quarter days after), seen with it.
    Its breed, weight, age, colour, notes and yes/no answers are those of its type."""
    (
        kind_draw, breed_draw, updated_draw, _unused, age, color, name,
        x_id_number, gender_null, gender, declawed,
        fixed, service_animal, trained, vaccinated,
        notes, weight_draw, custom_at_all, licence,
    ) = _PET_DRAWS.unpack(randbytes(_PET_DRAWS.size))  # fmt: skip
    (
        kind, breeds, kind_notes,
        declawed_below, fixed_below, service_below, trained_below, vaccinated_below,
    ) = _PET_TYPE[kind_draw]  # fmt: skip
    breed, lightest, weights, step, oldest, colors = breeds[breed_draw]
    return {
        "id": f"pet_{owner}_{index}",
        "created_at": created_text,
        "updated_at": _instant_text(created + updated_draw % (updated_steps + 1) * QUARTER_DAY),
        "last_seen": last_seen_text,
        "x_id": f"P{x_id_number % 10**7:07d}",
        "age_in_years": 1 + age % oldest,
        "breed": breed,
        "color": colors[color],
        "gender_raw": None if gender_null < NULL else _GENDER[gender],
        "is_declawed": _yes_no(declawed, declawed_below),
        "is_fixed": _yes_no(fixed, fixed_below),
        "is_service_animal": _yes_no(service_animal, service_below),
        "is_trained": _yes_no(trained, trained_below),
        "is_vaccinated": _yes_no(vaccinated, vaccinated_below),
        "name": _PET_NAME[name],
        "notes": kind_notes[notes],
        "type": kind,
        # In hundredths of a lb: hundredths / 100 is the float round(x, 2) gives.
        "weight_in_pounds": (lightest + weight_draw % weights * step) / 100,
        "custom_data": {"license": f"L-{licence % 10**5:05d}"}
        if custom_at_all < PERCENT[30]
        else {},
    }


# A screening runs within three days of the application (17 minutes a step of its draw).
SCREENING_STEP: Final = 17 * 60_000_000


def _screening(
    randbytes: RandomBytes,
    index: int,
    owner: str,
    created: int,
    updated: int,
    created_text: str,
    last_seen_text: str,
) -> dict[str, Any]:
    """A screening requested with the application and seen with its record; it ran
    within three days, and by the time the record last changed (`updated`)."""
    x_id_number, status, date_draw = _SCREENING_DRAWS.unpack(randbytes(_SCREENING_DRAWS.size))
    return {
        "id": f"scr_{owner}_{index}",
        "created_at": created_text,
        "last_seen": last_seen_text,
        "x_id": f"S{x_id_number % 10**7:07d}",
        "status_raw": _SCREENING_STATUS[status],
        "screening_date": _instant_text(min(created + date_draw * SCREENING_STEP, updated)),
    }


def _income(randbytes: RandomBytes, bands: tuple[tuple[_IncomeBand, ...], ...]) -> dict[str, Any]:
    """One income, from the bands of its type (`_PRIMARY_INCOME` or `_SECONDARY_INCOME`).

    The amount draw's low byte picks the band, its other 24 bits the amount in it."""
    amount_draw, type_draw, normalized_null, raw_null = _INCOME_DRAWS.unpack(
        randbytes(_INCOME_DRAWS.size)
    )
    kind = _INCOME_TYPE[type_draw]
    lowest, amounts, step = bands[kind][amount_draw & 0xFF]
    cents = lowest + (amount_draw >> 8) % amounts * step
    normalized, raw = INCOME_TYPES[kind]
    return {
        "amount_in_cents": cents,
        "amount_raw": f"${cents // 100:,}.{cents % 100:02d}",  # as the source wrote it
        "type_normalized": None if normalized_null < NULL else normalized,
        "type_raw": None if raw_null < NULL else raw,
    }
