"""Deterministic synthetic applicants: plausible, varied, and awkward on purpose.

The same (count, seed) always gives the same records, byte for byte, service fields
included, so a seeded database is reproducible and re-seeding changes nothing. The
data is built to exercise the API: several integrations with upper-case vendors,
many properties, nested arrays of every length from empty up, a share of nulls in
every nullable field, timestamps spread over years, and deliberate ties in every
sort key (shared names, cities and timestamps) so the id tiebreak is always tested.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Final

from app.applicants.records import Applicant, Application, Income, Pet, Screening
from app.instants import format_instant

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
APPLICANT_TYPES: Final = (("PRIMARY", "Primary"), ("CO_APPLICANT", "Co-Applicant"),
                          ("GUARANTOR", "Guarantor"), ("OCCUPANT", "Occupant"))  # fmt: skip
STATUSES: Final = (("Pending", "PENDING", "pending"), ("Approved", "APPROVED", "approved"),
                   ("Denied", "DENIED", "denied"), ("Cancelled", "CANCELLED", "cancelled"),
                   ("In Review", "IN_REVIEW", "in_review"))  # fmt: skip
PETS: Final = (("dog", ("Labrador", "Beagle", "Poodle", "Mixed")),
               ("cat", ("Siamese", "Tabby", "Maine Coon")), ("bird", ("Parakeet",)))  # fmt: skip
PET_NAMES: Final = ("Max", "Bella", "Luna", "Charlie", "Milo", "Coco", "Rocky", "Kiwi")
COLORS: Final = ("black", "white", "brown", "golden", "grey", "spotted")
SCREENING_STATUSES: Final = ("Passed", "Failed", "Pending", "Conditional")
INCOME_TYPES: Final = (("EMPLOYMENT", "Employment"), ("SELF_EMPLOYMENT", "Self-employed"),
                       ("BENEFITS", "Benefits"), ("OTHER", "Other"))  # fmt: skip

# 2019-01-01 .. 2026-01-01 in microseconds: "timestamps spread over years".
START: Final = 1_546_300_800_000_000
SPAN: Final = 7 * 365 * 86_400_000_000
DAY: Final = 86_400_000_000
NULL_RATE: Final = 0.1


class _Draw:
    """Draws from one seeded generator, with the helpers the records need."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def maybe(self, value: str) -> str | None:
        return None if self.rng.random() < NULL_RATE else value

    def instant(self) -> int:
        # One record in eight lands exactly on midnight of a day: ties in every
        # datetime ordering, resolved by the id tiebreak.
        moment = START + self.rng.randrange(SPAN)
        if self.rng.random() < 0.125:
            moment -= moment % DAY
        return moment - moment % 1000

    def flag(self) -> bool | None:
        return None if self.rng.random() < NULL_RATE else self.rng.random() < 0.5


def _pet(draw: _Draw, index: int, owner: str, created: int) -> Pet:
    rng = draw.rng
    kind, breeds = rng.choice(PETS)
    return Pet(
        id=f"pet_{owner}_{index}",
        created_at=format_instant(created),
        updated_at=format_instant(created + rng.randrange(90) * DAY),
        last_seen=format_instant(created + rng.randrange(200) * DAY),
        x_id=f"P{rng.randrange(10**7):07d}",
        age_in_years=rng.randrange(1, 16),
        breed=rng.choice(breeds),
        color=rng.choice(COLORS),
        gender_raw=draw.maybe(rng.choice(("Male", "Female"))),
        is_declawed=draw.flag() if kind == "cat" else None,
        is_fixed=draw.flag(),
        is_service_animal=draw.flag(),
        is_trained=draw.flag(),
        is_vaccinated=draw.flag(),
        name=rng.choice(PET_NAMES),
        notes=rng.choice(("", "Friendly", "Needs a yard", "Crate trained")),
        type=kind,
        weight_in_pounds=round(rng.uniform(2, 90), 1),
        custom_data={"license": f"L-{rng.randrange(10**5):05d}"} if rng.random() < 0.3 else {},
    )


def synthetic_applicant(rng: random.Random, number: int, seed: int, integration: int) -> Applicant:
    """The `number`-th applicant of the stream of `seed`, from integration number `integration`.

    Consecutive pairs share an x_id in two different integrations, as source systems
    reuse ids: the upsert key stays unique while x_id orderings get ties.
    """
    draw = _Draw(rng)
    integration_id, vendor = INTEGRATIONS[integration]
    property_number = rng.randrange(PROPERTIES_PER_INTEGRATION)
    x_property_id = f"{vendor[:2]}-P{property_number:03d}"
    x_id = f"S{seed}-{number // 2:07d}"
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    city, state, zip_prefix = rng.choice(CITIES)
    created = draw.instant()
    updated = created + rng.randrange(0, 400) * DAY // 4
    updated -= updated % 1000
    last_seen = updated + rng.randrange(0, 30) * DAY
    applicant_id = f"app_{rng.getrandbits(96):024x}"
    handle = f"{first.lower()}.{last.lower().replace(' ', '')}{rng.randrange(1000)}"
    email = f"{handle}@{rng.choice(EMAIL_DOMAINS)}"
    phone = rng.choice(("({a}) {b}-{c}", "{a}-{b}-{c}", "+1 {a} {b} {c}", "1{a}{b}{c}")).format(
        a=rng.randrange(200, 1000), b=f"{rng.randrange(1000):03d}", c=f"{rng.randrange(10000):04d}"
    )
    type_normalized, type_raw = rng.choice(APPLICANT_TYPES)
    applications = [
        Application(
            applicant_id=x_id,
            application_id=f"APP-{rng.randrange(10**6):06d}",
            status_raw=raw,
            status_normalized=normalized,
            status=status,
            custom_data={"source": rng.choice(("web", "walk-in", "phone"))}
            if rng.random() < 0.5
            else {},
        )
        for raw, normalized, status in (
            rng.choice(STATUSES) for _ in range(rng.choice((0, 1, 1, 1, 2, 3)))
        )
    ]
    pets = [
        _pet(draw, index, applicant_id[-8:], created)
        for index in range(rng.choice((0, 0, 0, 1, 1, 2, 4)))
    ]
    screenings = [
        Screening(
            id=f"scr_{applicant_id[-8:]}_{index}",
            created_at=format_instant(created),
            last_seen=format_instant(last_seen),
            x_id=f"S{rng.randrange(10**7):07d}",
            status_raw=rng.choice(SCREENING_STATUSES),
            screening_date=format_instant(created + rng.randrange(1, 20) * DAY),
        )
        for index in range(rng.choice((0, 1, 1, 2)))
    ]
    incomes = []
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        cents = rng.randrange(150_000, 2_500_000) * 100
        normalized_income, raw_income = rng.choice(INCOME_TYPES)
        incomes.append(
            Income(
                amount_in_cents=cents,
                amount_raw=f"${cents // 100:,}.00",
                type_normalized=draw.maybe(normalized_income),
                type_raw=draw.maybe(raw_income),
            )
        )
    birth_year = rng.randrange(1950, 2006)
    return Applicant(
        id=applicant_id,
        created_at=format_instant(created),
        updated_at=format_instant(updated),
        last_seen=format_instant(last_seen),
        x_id=x_id,
        x_property_id=x_property_id,
        x_lead_id=draw.maybe(f"L{rng.randrange(10**7):07d}"),
        x_unit_id=draw.maybe(f"U{rng.randrange(1, 400):04d}"),
        x_unit_id_preferred=[f"U{rng.randrange(1, 400):04d}" for _ in range(rng.randrange(3))],
        x_lease_id=draw.maybe(f"LS{rng.randrange(10**6):06d}") if rng.random() < 0.4 else None,
        property_id=f"prop_{integration_id[4:]}_{property_number:03d}",
        unit_id_preferred=[f"unit_{rng.randrange(10**5):05d}" for _ in range(rng.randrange(3))],
        integration_id=integration_id,
        integration_vendor=vendor,
        first_name=draw.maybe(first),
        middle_name=draw.maybe(rng.choice(MIDDLE_NAMES)) if rng.random() < 0.5 else None,
        last_name=draw.maybe(last),
        email_1=draw.maybe(email if rng.random() < 0.8 else email.upper()),
        email_2=draw.maybe(f"{first.lower()}{rng.randrange(100)}@{rng.choice(EMAIL_DOMAINS)}")
        if rng.random() < 0.3
        else None,
        phone_1=draw.maybe(phone),
        phone_1_type=draw.maybe(rng.choice(PHONE_TYPES)),
        phone_2=draw.maybe(f"{rng.randrange(200, 1000)}-555-{rng.randrange(10000):04d}")
        if rng.random() < 0.3
        else None,
        phone_2_type=draw.maybe("fax") if rng.random() < 0.2 else None,
        date_of_birth=draw.maybe(
            f"{birth_year:04d}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        ),
        address_1=draw.maybe(f"{rng.randrange(1, 9999)} {rng.choice(STREETS)}"),
        address_1_alternate=draw.maybe(f"{rng.randrange(1, 9999)} {rng.choice(STREETS)}")
        if rng.random() < 0.2
        else None,
        address_2=draw.maybe(f"Apt {rng.randrange(1, 500)}") if rng.random() < 0.5 else None,
        address_2_alternate=draw.maybe("Unit B") if rng.random() < 0.1 else None,
        city=draw.maybe(city),
        city_alternate=draw.maybe(rng.choice(CITIES)[0]) if rng.random() < 0.2 else None,
        state=draw.maybe(state),
        state_alternate=draw.maybe(rng.choice(CITIES)[1]) if rng.random() < 0.2 else None,
        zip=draw.maybe(f"{zip_prefix}{rng.randrange(100):02d}"),
        zip_alternate=draw.maybe(f"{rng.randrange(10**5):05d}") if rng.random() < 0.2 else None,
        country=draw.maybe("US"),
        country_alternate=draw.maybe("US") if rng.random() < 0.2 else None,
        notes=draw.maybe(rng.choice(("", "Prefers email", "Needs parking", "Relocating for work")))
        if rng.random() < 0.4
        else None,
        type_normalized=draw.maybe(type_normalized),
        type_raw=draw.maybe(type_raw),
        custom_data={
            "lead_source": rng.choice(("web", "referral", "ils", "walk-in")),
            "score": rng.randrange(300, 851),
            "tags": rng.sample(("pets", "parking", "furnished", "corporate"), rng.randrange(3)),
        }
        if rng.random() < 0.7
        else {},
        applications=applications,
        pets=pets,
        screenings=screenings,
        self_reported_income=incomes,
    )


def synthetic_applicants(count: int, seed: int = 0) -> Iterator[Applicant]:
    """`count` applicants from `seed`: the same arguments give the same records."""
    rng = random.Random(seed)
    integration = 0
    for number in range(count):
        if number % 2 == 0:
            integration = rng.randrange(len(INTEGRATIONS))
        else:
            integration = (integration + 1) % len(INTEGRATIONS)
        yield synthetic_applicant(rng, number, seed, integration)
