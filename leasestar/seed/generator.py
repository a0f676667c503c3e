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
time. The values drawn from are `vocabulary.py`'s; the byte tables and struct formats
`draws.py`'s.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, Final

from leasestar.applicants.prepared import RecordFields
from leasestar.applicants.records import Applicant, applicant_encoder, applicant_line_decoder

# Enumerated-looking values (vendors, phone kinds, normalized statuses) are drawn only
# from what the mirrored API's published OpenAPI document enumerates for them
# (propexo/documentation, fern/openapi/openapi.yml), so that a client generated from it
# reads the demo data; import itself still takes any string (the specification leaves
# them open).
from leasestar.seed.draws import (
    AGE_DAYS,
    APPLICANT_DRAWS,
    APPLICANT_TYPE,
    APPLICATION_COUNT,
    APPLICATION_DRAWS,
    APPLICATION_SOURCE,
    AREA_CODE,
    CITY,
    DOMAIN,
    FIRST,
    FOUR_DIGITS,
    GENDER,
    INCOME_COUNT,
    INCOME_DRAWS,
    INCOME_TYPE,
    INTEGRATION,
    INTEGRATION_DRAW,
    LAST,
    LEAD_SOURCE,
    MIDDLE,
    NOTE_PICKS,
    NULL,
    ONE_IN_EIGHT,
    PERCENT,
    PET_COUNT,
    PET_DRAWS,
    PET_NAME,
    PET_TYPE,
    PHONE_2_TYPE,
    PHONE_FORMAT,
    PHONE_TYPE,
    PRIMARY_INCOME,
    PROPERTY,
    SCREENING_COUNT,
    SCREENING_DRAWS,
    SCREENING_STATUS,
    SECONDARY_INCOME,
    STATUS,
    STREET,
    TAG_PICKS,
    THREE_DIGITS,
    UNITS,
    UPTO_TWO,
    IncomeBand,
    date_text,
    instant_text,
    yes_no,
)
from leasestar.seed.vocabulary import (
    DAY,
    INCOME_TYPES,
    INTEGRATIONS,
    QUARTER_DAY,
    SPAN,
    START,
)

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
        draws = APPLICANT_DRAWS.unpack(randbytes(APPLICANT_DRAWS.size))
        if number % 2 == 0:
            integration = INTEGRATION[draws[INTEGRATION_DRAW]]
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
        _unused_8,
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
    property_number = PROPERTY[property_draw]
    first, last = FIRST[first_draw], LAST[last_draw]
    city, state, zip_prefix = CITY[city_draw]

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
    created_text, updated_text = instant_text(created), instant_text(updated)
    last_seen_text = instant_text(last_seen)

    handle = f"{first.lower()}.{last.lower().replace(' ', '')}{handle_number % 1000}"
    email = f"{handle}@{DOMAIN[domain_draw]}"
    email_1 = None if email_null < NULL else email.upper() if upper_draw < PERCENT[20] else email
    # North American numbers: a real area code, an exchange from 200 up.
    # The specification types phone_1 and its kind as strings: never null.
    phone_1 = PHONE_FORMAT[phone_format].format(
        a=AREA_CODE[phone_a & 0xFF],
        b=THREE_DIGITS[200 + phone_b % 800],
        c=FOUR_DIGITS[phone_c % 10000],
    )
    phone_2 = (
        f"{AREA_CODE[phone_2_area & 0xFF]}-555-{FOUR_DIGITS[phone_2_line % 10000]}"
        if phone_2_at_all < PERCENT[30] and phone_2_null >= NULL
        else None
    )
    # 18 or older at created_at (the day of the application).
    date_of_birth = (
        None
        if birth_null < NULL
        else date_text(created // DAY - AGE_DAYS[age_draw & 0xFF] - birth_day % 365)
    )
    first_name = None if first_null < NULL else first
    middle_name = (
        MIDDLE[middle_draw] if middle_at_all < PERCENT[50] and middle_null >= NULL else None
    )
    last_name = None if last_null < NULL else last
    city_value = None if city_null < NULL else city
    state_value = None if state_null < NULL else state
    zip_value = None if zip_null < NULL else f"{zip_prefix}{zip_digits % 100:02d}"
    x_property_id = f"{vendor[:2]}-P{property_number:03d}"
    property_id = f"prop_{integration_id[4:]}_{property_number:03d}"
    type_normalized, type_raw = APPLICANT_TYPE[type_draw]
    # A guarantor vouches for the lease but does not live there: no pets.
    pets = 0 if type_normalized == "GUARANTOR" else PET_COUNT[pet_count]
    # An alternate (mailing or previous) address is one address, or none: its parts are
    # all absent, or each there (or null) and of one place.
    alternate = address_alt_at_all < PERCENT[20]
    alt_city, alt_state, alt_zip_prefix = CITY[city_alt_draw]
    owner = applicant_id[-8:]  # names the nested pets and screenings
    # 0, 1 or 2 preferred units of each kind.
    units_preferred = [UNITS[preferred_1 % 400], UNITS[preferred_2 % 400]]
    del units_preferred[UPTO_TWO[preferred_count] :]
    unit_ids_preferred = [
        f"unit_{unit_preferred_1 % 10**5:05d}",
        f"unit_{unit_preferred_2 % 10**5:05d}",
    ]
    del unit_ids_preferred[UPTO_TWO[unit_preferred_count] :]

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
        "x_unit_id": None if unit_null < NULL else UNITS[unit_number % 400],
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
        "email_2": f"{first.lower()}{email_2_number % 100}@{DOMAIN[email_2_domain]}"
        if email_2_at_all < PERCENT[30] and email_2_null >= NULL
        else None,
        "phone_1": phone_1,
        "phone_1_type": PHONE_TYPE[phone_type_draw],
        "phone_2": phone_2,
        # Never null, even with no phone_2 (a form's kind selector keeps its choice): the
        # mirrored API's published enum of kinds has no null, and a client generated
        # from it (openapi-python-client) refuses the record that holds one.
        "phone_2_type": PHONE_2_TYPE[phone_2_type_draw],
        "date_of_birth": date_of_birth,
        "address_1": None
        if address_null < NULL
        else f"{1 + address_number % 9999} {STREET[street_draw]}",
        "address_1_alternate": f"{1 + address_alt_number % 9999} {STREET[address_alt_street]}"
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
        "notes": NOTE_PICKS[notes_draw]
        if notes_at_all < PERCENT[40] and notes_null >= NULL
        else None,
        "type_normalized": None if type_normalized_null < NULL else type_normalized,
        "type_raw": None if type_raw_null < NULL else type_raw,
        "custom_data": {
            "lead_source": LEAD_SOURCE[lead_source_draw],
            "score": 300 + score_draw % 551,
            "tags": TAG_PICKS[UPTO_TWO[tag_count]][tags_draw],
        }
        if custom_at_all < PERCENT[70]
        else {},
        "applications": [
            _application(randbytes, x_id) for _ in range(APPLICATION_COUNT[application_count])
        ],
        "pets": [
            _pet(randbytes, index, owner, created, created_text, updated_steps, last_seen_text)
            for index in range(pets)
        ],
        "screenings": [
            _screening(randbytes, index, owner, created, updated, created_text, last_seen_text)
            for index in range(SCREENING_COUNT[screening_count])
        ],
        "self_reported_income": [
            _income(randbytes, SECONDARY_INCOME if index else PRIMARY_INCOME)
            for index in range(INCOME_COUNT[income_count])
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
    number, status_draw, custom_at_all, source_draw = APPLICATION_DRAWS.unpack(
        randbytes(APPLICATION_DRAWS.size)
    )
    status_raw, status_normalized, status = STATUS[status_draw]
    return {
        "applicant_id": x_id,  # an application belongs to its applicant: always x_id
        "application_id": f"APP-{number % 10**6:06d}",
        "status_raw": status_raw,
        "status_normalized": status_normalized,
        "status": status,
        "custom_data": {"source": APPLICATION_SOURCE[source_draw]}
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
    ) = PET_DRAWS.unpack(randbytes(PET_DRAWS.size))  # fmt: skip
    (
        kind, breeds, kind_notes,
        declawed_below, fixed_below, service_below, trained_below, vaccinated_below,
    ) = PET_TYPE[kind_draw]  # fmt: skip
    breed, lightest, weights, step, oldest, colors = breeds[breed_draw]
    return {
        "id": f"pet_{owner}_{index}",
        "created_at": created_text,
        "updated_at": instant_text(created + updated_draw % (updated_steps + 1) * QUARTER_DAY),
        "last_seen": last_seen_text,
        "x_id": f"P{x_id_number % 10**7:07d}",
        "age_in_years": 1 + age % oldest,
        "breed": breed,
        "color": colors[color],
        "gender_raw": None if gender_null < NULL else GENDER[gender],
        "is_declawed": yes_no(declawed, declawed_below),
        "is_fixed": yes_no(fixed, fixed_below),
        "is_service_animal": yes_no(service_animal, service_below),
        "is_trained": yes_no(trained, trained_below),
        "is_vaccinated": yes_no(vaccinated, vaccinated_below),
        "name": PET_NAME[name],
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
    x_id_number, status, date_draw = SCREENING_DRAWS.unpack(randbytes(SCREENING_DRAWS.size))
    return {
        "id": f"scr_{owner}_{index}",
        "created_at": created_text,
        "last_seen": last_seen_text,
        "x_id": f"S{x_id_number % 10**7:07d}",
        "status_raw": SCREENING_STATUS[status],
        "screening_date": instant_text(min(created + date_draw * SCREENING_STEP, updated)),
    }


def _income(randbytes: RandomBytes, bands: tuple[tuple[IncomeBand, ...], ...]) -> dict[str, Any]:
    """One income, from the bands of its type (`PRIMARY_INCOME` or `SECONDARY_INCOME`).

    The amount draw's low byte picks the band, its other 24 bits the amount in it."""
    amount_draw, type_draw, normalized_null, raw_null = INCOME_DRAWS.unpack(
        randbytes(INCOME_DRAWS.size)
    )
    kind = INCOME_TYPE[type_draw]
    lowest, amounts, step = bands[kind][amount_draw & 0xFF]
    cents = lowest + (amount_draw >> 8) % amounts * step
    normalized, raw = INCOME_TYPES[kind]
    return {
        "amount_in_cents": cents,
        "amount_raw": f"${cents // 100:,}.{cents % 100:02d}",  # as the source wrote it
        "type_normalized": None if normalized_null < NULL else normalized,
        "type_raw": None if raw_null < NULL else raw,
    }
