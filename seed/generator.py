"""Deterministic synthetic applicants: plausible, varied, and awkward on purpose.

The same (count, seed) always gives the same records, byte for byte, service fields
included, so a seeded database is reproducible and re-seeding changes nothing. The
data is built to exercise the API: several integrations with upper-case vendors,
many properties, nested arrays of every length from empty up, a share of nulls in
every nullable field, timestamps spread over years, and deliberate ties in every
sort key (shared names, cities and timestamps) so the id tiebreak is always tested.

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
from collections.abc import Callable, Iterator, Sequence
from datetime import date, timedelta
from itertools import permutations
from typing import Any, Final, TypeVar

from app.applicants.ingest import RecordFields
from app.applicants.records import Applicant, applicant_encoder, applicant_line_decoder

INTEGRATIONS: Final = (
    ("int_yardi_01", "YARDI"),
    ("int_yardi_02", "YARDI"),
    ("int_entrata_01", "ENTRATA"),
    ("int_realpage_01", "REALPAGE"),
    ("int_appfolio_01", "APPFOLIO"),
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
PHONE_TYPES: Final = ("mobile", "home", "work")
PHONE_FORMATS: Final = ("({a}) {b}-{c}", "{a}-{b}-{c}", "+1 {a} {b} {c}", "1{a}{b}{c}")
APPLICANT_TYPES: Final = (("PRIMARY", "Primary"), ("CO_APPLICANT", "Co-Applicant"),
                          ("GUARANTOR", "Guarantor"), ("OCCUPANT", "Occupant"))  # fmt: skip
STATUSES: Final = (("Pending", "PENDING", "pending"), ("Approved", "APPROVED", "approved"),
                   ("Denied", "DENIED", "denied"), ("Cancelled", "CANCELLED", "cancelled"),
                   ("In Review", "IN_REVIEW", "in_review"))  # fmt: skip
APPLICATION_SOURCES: Final = ("web", "walk-in", "phone")
PETS: Final = (("dog", ("Labrador", "Beagle", "Poodle", "Mixed")),
               ("cat", ("Siamese", "Tabby", "Maine Coon")), ("bird", ("Parakeet",)))  # fmt: skip
PET_NAMES: Final = ("Max", "Bella", "Luna", "Charlie", "Milo", "Coco", "Rocky", "Kiwi")
PET_NOTES: Final = ("", "Friendly", "Needs a yard", "Crate trained")
COLORS: Final = ("black", "white", "brown", "golden", "grey", "spotted")
SCREENING_STATUSES: Final = ("Passed", "Failed", "Pending", "Conditional")
INCOME_TYPES: Final = (("EMPLOYMENT", "Employment"), ("SELF_EMPLOYMENT", "Self-employed"),
                       ("BENEFITS", "Benefits"), ("OTHER", "Other"))  # fmt: skip
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


_INTEGRATION = _spread(range(len(INTEGRATIONS)))
_PROPERTY = _spread(range(PROPERTIES_PER_INTEGRATION))
_FIRST = _spread(FIRST_NAMES)
_MIDDLE = _spread(MIDDLE_NAMES)
_LAST = _spread(LAST_NAMES)
_CITY = _spread(CITIES)
_STREET = _spread(STREETS)
_DOMAIN = _spread(EMAIL_DOMAINS)
_PHONE_TYPE = _spread(PHONE_TYPES)
_PHONE_FORMAT = _spread(PHONE_FORMATS)
_APPLICANT_TYPE = _spread(APPLICANT_TYPES)
_NOTES = _spread(NOTES)
_LEAD_SOURCE = _spread(LEAD_SOURCES)
_STATUS = _spread(STATUSES)
_APPLICATION_SOURCE = _spread(APPLICATION_SOURCES)
_PET = _spread(PETS)
_PET_NAME = _spread(PET_NAMES)
_PET_NOTES = _spread(PET_NOTES)
_COLOR = _spread(COLORS)
_GENDER = _spread(("Male", "Female"))
_SCREENING_STATUS = _spread(SCREENING_STATUSES)
_INCOME_TYPE = _spread(INCOME_TYPES)
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
_MONTH_DAYS = tuple(f"-{month:02d}-{day:02d}" for month in range(1, 13) for day in range(1, 29))
_BIRTH_YEARS = tuple(str(year) for year in range(1950, 2006))


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
    "BBHHI BB"  # phone_null, phone_format, phone_a, phone_b, phone_c, phone_type_null, _draw
    "BBHI BB"  # phone_2_at_all, phone_2_null, phone_2_area, phone_2_line, fax_at_all, fax_null
    "BHH"  # birth_null, birth_year, birth_day
    "BIB BBIB"  # address_null, _number, street_draw, address_alt_at_all, _null, _number, _street
    "BBH BB"  # apartment_at_all, apartment_null, apartment_number, unit_b_at_all, unit_b_null
    "B BBB"  # city_null, city_alt_at_all, city_alt_null, city_alt_draw
    "B BBB"  # state_null, state_alt_at_all, state_alt_null, state_alt_draw
    "BH BBI"  # zip_null, zip_digits, zip_alt_at_all, zip_alt_null, zip_alt_number
    "B BB"  # country_null, country_alt_at_all, country_alt_null
    "BBB BBB"  # notes_at_all, notes_null, notes_draw, type_draw, type_normalized_null, _raw_null
    "B B H B B"  # custom_at_all, lead_source_draw, score_draw, tag_count, tags_draw
)
_APPLICATION_DRAWS = struct.Struct(
    "<I B B B"  # number, status_draw, custom_at_all, source_draw
)
_PET_DRAWS = struct.Struct(
    "<B B H H B B B"  # kind_draw, breed_draw, updated_days, seen_days, age, color, name
    "I B B B"  # x_id_number, gender_null, gender, declawed
    "B B B B"  # fixed, service_animal, trained, vaccinated
    "B H B I"  # notes, weight_tenths, custom_at_all, licence
)
_SCREENING_DRAWS = struct.Struct(
    "<I B B"  # x_id_number, status, date_days
)
_INCOME_DRAWS = struct.Struct(
    "<I B B B"  # amount, type_draw, normalized_null, raw_null
)
# Where in the applicant's draws the integration is (read before the record is built).
_INTEGRATION_DRAW: Final = 5


def _flag(draw: int) -> bool | None:
    """A nullable yes/no from one byte: null 10%, else even odds."""
    return None if draw < NULL else draw & 1 == 1


# --- instants ----------------------------------------------------------------------------

# `format_instant` from pieces written once: a day's date, a minute of the day, a
# second, a millisecond. About 4x faster, and seeding formats several instants a record.
_DAYS: dict[int, str] = {}
_MINUTES: Final = tuple(f"{minute // 60:02d}:{minute % 60:02d}:" for minute in range(1440))
_SECONDS: Final = tuple(f"{second:02d}." for second in range(60))
_MILLISECONDS: Final = tuple(f"{millisecond:03d}Z" for millisecond in range(1000))
_EPOCH_DAY: Final = date(1970, 1, 1)


def _instant_text(micros: int) -> str:
    """`app.instants.format_instant(micros)`, from cached pieces."""
    day, rest = divmod(micros, DAY)
    prefix = _DAYS.get(day)
    if prefix is None:
        prefix = _DAYS[day] = f"{(_EPOCH_DAY + timedelta(days=day)).isoformat()}T"
    seconds, micro = divmod(rest, 1_000_000)
    minutes, second = divmod(seconds, 60)
    return prefix + _MINUTES[minutes] + _SECONDS[second] + _MILLISECONDS[micro // 1000]


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
        phone_null, phone_format, phone_a, phone_b, phone_c, phone_type_null, phone_type_draw,
        phone_2_at_all, phone_2_null, phone_2_area, phone_2_line, fax_at_all, fax_null,
        birth_null, birth_year, birth_day,
        address_null, address_number, street_draw,
        address_alt_at_all, address_alt_null, address_alt_number, address_alt_street,
        apartment_at_all, apartment_null, apartment_number, unit_b_at_all, unit_b_null,
        city_null, city_alt_at_all, city_alt_null, city_alt_draw,
        state_null, state_alt_at_all, state_alt_null, state_alt_draw,
        zip_null, zip_digits, zip_alt_at_all, zip_alt_null, zip_alt_number,
        country_null, country_alt_at_all, country_alt_null,
        notes_at_all, notes_null, notes_draw, type_draw, type_normalized_null, type_raw_null,
        custom_at_all, lead_source_draw, score_draw, tag_count, tags_draw,
    ) = draws  # fmt: skip
    integration_id, vendor = INTEGRATIONS[integration]
    property_number = _PROPERTY[property_draw]
    first, last = _FIRST[first_draw], _LAST[last_draw]
    city, state, zip_prefix = _CITY[city_draw]

    # Instants at millisecond precision (the API's); one record in eight lands exactly
    # on midnight of a day: ties in every datetime ordering, resolved by the id tiebreak.
    created = START + created_draw % (SPAN // 1000) * 1000
    if on_midnight < ONE_IN_EIGHT:
        created -= created % DAY
    updated = created + updated_steps % 400 * QUARTER_DAY
    last_seen = updated + seen_days % 30 * DAY
    applicant_id = "app_" + id_bits.hex()
    created_text, updated_text = _instant_text(created), _instant_text(updated)
    last_seen_text = _instant_text(last_seen)

    handle = f"{first.lower()}.{last.lower().replace(' ', '')}{handle_number % 1000}"
    email = f"{handle}@{_DOMAIN[domain_draw]}"
    email_1 = None if email_null < NULL else email.upper() if upper_draw < PERCENT[20] else email
    phone_1 = (
        None
        if phone_null < NULL
        else _PHONE_FORMAT[phone_format].format(
            a=200 + phone_a % 800, b=_THREE_DIGITS[phone_b % 1000], c=_FOUR_DIGITS[phone_c % 10000]
        )
    )
    date_of_birth = (
        None
        if birth_null < NULL
        else _BIRTH_YEARS[birth_year % len(_BIRTH_YEARS)]
        + _MONTH_DAYS[birth_day % len(_MONTH_DAYS)]
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
        "phone_1_type": None if phone_type_null < NULL else _PHONE_TYPE[phone_type_draw],
        "phone_2": f"{200 + phone_2_area % 800}-555-{_FOUR_DIGITS[phone_2_line % 10000]}"
        if phone_2_at_all < PERCENT[30] and phone_2_null >= NULL
        else None,
        "phone_2_type": "fax" if fax_at_all < PERCENT[20] and fax_null >= NULL else None,
        "date_of_birth": date_of_birth,
        "address_1": None
        if address_null < NULL
        else f"{1 + address_number % 9999} {_STREET[street_draw]}",
        "address_1_alternate": f"{1 + address_alt_number % 9999} {_STREET[address_alt_street]}"
        if address_alt_at_all < PERCENT[20] and address_alt_null >= NULL
        else None,
        "address_2": f"Apt {1 + apartment_number % 500}"
        if apartment_at_all < PERCENT[50] and apartment_null >= NULL
        else None,
        "address_2_alternate": "Unit B"
        if unit_b_at_all < PERCENT[10] and unit_b_null >= NULL
        else None,
        "city": city_value,
        "city_alternate": _CITY[city_alt_draw][0]
        if city_alt_at_all < PERCENT[20] and city_alt_null >= NULL
        else None,
        "state": state_value,
        "state_alternate": _CITY[state_alt_draw][1]
        if state_alt_at_all < PERCENT[20] and state_alt_null >= NULL
        else None,
        "zip": zip_value,
        "zip_alternate": f"{zip_alt_number % 10**5:05d}"
        if zip_alt_at_all < PERCENT[20] and zip_alt_null >= NULL
        else None,
        "country": None if country_null < NULL else "US",
        "country_alternate": "US"
        if country_alt_at_all < PERCENT[20] and country_alt_null >= NULL
        else None,
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
            _pet(randbytes, index, owner, created, created_text)
            for index in range(_PET_COUNT[pet_count])
        ],
        "screenings": [
            _screening(randbytes, index, owner, created, created_text, last_seen_text)
            for index in range(_SCREENING_COUNT[screening_count])
        ],
        "self_reported_income": [_income(randbytes) for _ in range(_INCOME_COUNT[income_count])],
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
    randbytes: RandomBytes, index: int, owner: str, created: int, created_text: str
) -> dict[str, Any]:
    (
        kind_draw, breed_draw, updated_days, seen_days, age, color, name,
        x_id_number, gender_null, gender, declawed,
        fixed, service_animal, trained, vaccinated,
        notes, weight_tenths, custom_at_all, licence,
    ) = _PET_DRAWS.unpack(randbytes(_PET_DRAWS.size))  # fmt: skip
    kind, breeds = _PET[kind_draw]
    return {
        "id": f"pet_{owner}_{index}",
        "created_at": created_text,
        "updated_at": _instant_text(created + updated_days % 90 * DAY),
        "last_seen": _instant_text(created + seen_days % 200 * DAY),
        "x_id": f"P{x_id_number % 10**7:07d}",
        "age_in_years": 1 + age % 15,
        "breed": breeds[breed_draw % len(breeds)],
        "color": _COLOR[color],
        "gender_raw": None if gender_null < NULL else _GENDER[gender],
        "is_declawed": _flag(declawed) if kind == "cat" else None,
        "is_fixed": _flag(fixed),
        "is_service_animal": _flag(service_animal),
        "is_trained": _flag(trained),
        "is_vaccinated": _flag(vaccinated),
        "name": _PET_NAME[name],
        "notes": _PET_NOTES[notes],
        "type": kind,
        # 2.0 .. 90.0 lb in tenths: tenths / 10 is the float round(x, 1) gives.
        "weight_in_pounds": (20 + weight_tenths % 881) / 10,
        "custom_data": {"license": f"L-{licence % 10**5:05d}"}
        if custom_at_all < PERCENT[30]
        else {},
    }


def _screening(
    randbytes: RandomBytes,
    index: int,
    owner: str,
    created: int,
    created_text: str,
    last_seen_text: str,
) -> dict[str, Any]:
    x_id_number, status, date_days = _SCREENING_DRAWS.unpack(randbytes(_SCREENING_DRAWS.size))
    return {
        "id": f"scr_{owner}_{index}",
        "created_at": created_text,
        "last_seen": last_seen_text,
        "x_id": f"S{x_id_number % 10**7:07d}",
        "status_raw": _SCREENING_STATUS[status],
        "screening_date": _instant_text(created + (1 + date_days % 19) * DAY),
    }


def _income(randbytes: RandomBytes) -> dict[str, Any]:
    amount, type_draw, normalized_null, raw_null = _INCOME_DRAWS.unpack(
        randbytes(_INCOME_DRAWS.size)
    )
    dollars = 150_000 + amount % 2_350_000  # $150,000 .. $2,499,999
    normalized, raw = _INCOME_TYPE[type_draw]
    return {
        "amount_in_cents": dollars * 100,
        "amount_raw": f"${dollars:,}.00",
        "type_normalized": None if normalized_null < NULL else normalized,
        "type_raw": None if raw_null < NULL else raw,
    }
