"""The seed generator: what `seed` stores is what an import of the record would store.

`synthetic_records` builds each record's stored bytes directly (no Structs), and the
writer stores them unchecked, so these tests hold it to the contract instead: the
bytes are the canonical encoding of the Applicant they decode to, the fields are that
Applicant's, the stream is deterministic, and the data keeps the variety the API
tests rely on. And the data is plausible: the bounds it is held to below are written
here, from what real applicants, pets and incomes look like, not from the generator's
own tables.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import date, datetime, timedelta
from decimal import Decimal

import msgspec
import pytest

from leasestar.applicants.prepared import record_fields
from leasestar.applicants.records import (
    SERVICE_FIELDS,
    Applicant,
    applicant_encoder,
    applicant_line_decoder,
)
from leasestar.seed.generator import synthetic_applicants, synthetic_records
from leasestar.seed.vocabulary import (
    APPLICATION_COUNTS,
    INCOME_COUNTS,
    PET_COUNTS,
    SCREENING_COUNTS,
)

COUNT = 3000
# Typed string (not "string or null") by the specification, section 2.3, though import
# takes null: the seed always fills them.
SEEDED_NEVER_NULL = ("phone_1", "phone_1_type", "phone_2_type")

# What the mirrored API's published OpenAPI document (propexo/documentation,
# fern/openapi/openapi.yml, schema Applicant) enumerates, copied from it by hand: a client
# generated from that document refuses any other value.
PUBLISHED_PHONE_KINDS = {"FAX", "HOME", "MOBILE", "OTHER", "WORK"}
PUBLISHED_VENDORS = {
    "BUILDIUM", "ENTRATA", "MRI", "PROPERTYWARE", "PROPERTYWARE_REST", "REALPAGE",
    "REALPAGE_RPX", "RENTMANAGER", "RENTVINE", "RESMAN", "SAMPLE1", "SAMPLE2",
}  # fmt: skip
PUBLISHED_APPLICATION_STATUSES = {"APPROVED", "DENIED", "CANCELED", "OTHER", "PENDING"}


@pytest.fixture(scope="module")
def applicants() -> list[Applicant]:
    return list(synthetic_applicants(COUNT, seed=0))


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_records_are_their_canonical_encoding_with_their_own_fields(seed: int) -> None:
    for encoded, fields in synthetic_records(COUNT, seed):
        record = applicant_line_decoder.decode(encoded)  # validates, as an import does
        assert applicant_encoder.encode(record) == encoded
        assert fields == record_fields(record)


def test_the_same_arguments_give_the_same_bytes() -> None:
    assert list(synthetic_records(500, 3)) == list(synthetic_records(500, 3))
    assert list(synthetic_records(200, 3)) == list(synthetic_records(500, 3))[:200]
    first = {encoded for encoded, _ in synthetic_records(200, 3)}
    assert first.isdisjoint(encoded for encoded, _ in synthetic_records(200, 4))


def test_every_nullable_field_is_sometimes_null_and_sometimes_filled(
    applicants: list[Applicant],
) -> None:
    for field in msgspec.structs.fields(Applicant):
        if field.default is None and field.name not in (*SERVICE_FIELDS, *SEEDED_NEVER_NULL):
            values = [getattr(record, field.name) for record in applicants]
            assert None in values, field.name
            assert any(value is not None for value in values), field.name
    for nested, fields in (
        ("pets", ("gender_raw", "is_declawed", "is_fixed", "is_vaccinated")),
        ("self_reported_income", ("type_normalized", "type_raw")),
    ):
        items = [item for record in applicants for item in getattr(record, nested)]
        for name in fields:
            assert {getattr(item, name) is None for item in items} == {True, False}, name


def test_enumerated_values_are_the_published_ones(two_seeds: list[Applicant]) -> None:
    phone_kinds, vendors, statuses = Counter[str | None](), Counter[str](), Counter[str | None]()
    for record in two_seeds:
        phone_kinds.update((record.phone_1_type, record.phone_2_type))
        vendors[record.integration_vendor] += 1
        statuses.update(application.status_normalized for application in record.applications)
        assert record.phone_1 is not None, record.id
        assert record.phone_1_type in PUBLISHED_PHONE_KINDS, record.id
        # Never null: the published enum has no null, and generated clients refuse one.
        assert record.phone_2_type in PUBLISHED_PHONE_KINDS, record.id
        for application in record.applications:
            assert application.status_normalized in PUBLISHED_APPLICATION_STATUSES, record.id
            # The deprecated `status` is the normalized status in lower case.
            assert application.status == application.status_normalized.lower(), record.id
    assert vendors.keys() <= PUBLISHED_VENDORS
    # Every published kind and status occurs, and several vendors: a demo shows them all.
    assert phone_kinds.keys() >= PUBLISHED_PHONE_KINDS
    assert statuses.keys() >= PUBLISHED_APPLICATION_STATUSES
    assert len(vendors) >= 5


PHONE_SHAPES = (
    r"\([2-9][0-9]{2}\) [2-9][0-9]{2}-[0-9]{4}",  # (512) 555-0123
    r"[2-9][0-9]{2}([-.])[2-9][0-9]{2}\1[0-9]{4}",  # 512-555-0123, 512.555.0123
    r"(\+?1)?[2-9][0-9]{9}",  # 5125550123, 15125550123, +15125550123 (E.164)
    r"(\+1 |1-)[2-9][0-9]{2}-[2-9][0-9]{2}-[0-9]{4}",  # +1 512-555-0123, 1-512-555-0123
)


def test_phones_are_written_as_source_systems_send_them(two_seeds: list[Applicant]) -> None:
    shapes = Counter[int]()
    for record in two_seeds:
        for phone in (record.phone_1, record.phone_2):
            if phone is None:
                continue
            matching = [i for i, shape in enumerate(PHONE_SHAPES) if re.fullmatch(shape, phone)]
            assert matching, phone
            shapes[matching[0]] += 1
            digits = re.sub("[^0-9]", "", phone)
            assert len(digits) == 10 or (len(digits) == 11 and digits[0] == "1"), phone
    assert shapes.keys() == set(range(len(PHONE_SHAPES)))


def test_the_data_is_varied_and_awkward_on_purpose(applicants: list[Applicant]) -> None:
    vendors = {record.integration_vendor for record in applicants}
    assert len(vendors) >= 5
    assert all(vendor.isupper() for vendor in vendors)
    assert len({record.integration_id for record in applicants}) >= 6
    assert len({record.property_id for record in applicants}) >= 200
    # Nested arrays of every length the generator allows, from empty up.
    for name, lengths in (
        ("applications", APPLICATION_COUNTS),
        ("pets", PET_COUNTS),
        ("screenings", SCREENING_COUNTS),
        ("self_reported_income", INCOME_COUNTS),
    ):
        assert {len(getattr(record, name)) for record in applicants} == set(lengths), name
    assert all(
        application.applicant_id == record.x_id
        for record in applicants
        for application in record.applications
    )
    # Timestamps spread over years, with exact ties (one in eight on midnight).
    created = [record.created_at for record in applicants]
    years = {datetime.fromisoformat(text).year for text in created if text}
    assert len(years) >= 6
    assert len(set(created)) < len(created)
    assert sum(text.endswith("T00:00:00.000Z") for text in created if text) > COUNT // 16
    # Ties in the name and city orderings; x_ids shared by pairs in two integrations.
    assert max(Counter(record.last_name for record in applicants).values()) > 20
    assert max(Counter(record.city for record in applicants).values()) > 100
    by_x_id: dict[str, set[str]] = {}
    for record in applicants:
        by_x_id.setdefault(record.x_id, set()).add(record.integration_id)
    assert all(len(integrations) == 2 for integrations in by_x_id.values())


# --- plausibility ---------------------------------------------------------------------

PLAUSIBILITY_SEEDS = (7, 2024)  # 7: the data set the API tests serve (tests/conftest.py)


@pytest.fixture(scope="module")
def two_seeds() -> list[Applicant]:
    return [record for seed in PLAUSIBILITY_SEEDS for record in synthetic_applicants(COUNT, seed)]


def instant(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text)


def test_instants_are_in_order_in_every_record_and_nested_item(
    two_seeds: list[Applicant],
) -> None:
    for record in two_seeds:
        created, updated, seen = (
            instant(record.created_at),
            instant(record.updated_at),
            instant(record.last_seen),
        )
        assert created <= updated <= seen, record.id
        for pet in record.pets:
            pet_created, pet_updated, pet_seen = (
                instant(pet.created_at),
                instant(pet.updated_at),
                instant(pet.last_seen),
            )
            assert pet_created <= pet_updated <= pet_seen, pet.id
            # A pet is part of its record: listed no earlier than the record was
            # created, changed no later than the record last changed, seen with it.
            assert created <= pet_created, pet.id
            assert pet_updated <= updated, pet.id
            assert pet_seen <= seen, pet.id
        for screening in record.screenings:
            screening_created, screening_seen = (
                instant(screening.created_at),
                instant(screening.last_seen),
            )
            ran = instant(screening.screening_date)
            assert screening_created <= screening_seen, screening.id
            assert created <= screening_created, screening.id
            assert screening_seen <= seen, screening.id
            # Screened after the application came in, within days, before last seen.
            assert screening_created <= ran <= screening_created + timedelta(days=30), screening.id
            assert ran <= screening_seen, screening.id


# Adult weights in lb, by type, with some slack over the usual range; a dog's size class
# narrows it for the breeds named.
PET_WEIGHTS = {
    "dog": (4.0, 120.0),
    "cat": (5.0, 22.0),
    "bird": (0.02, 4.0),
    "fish": (0.005, 1.0),
    "reptile": (0.05, 8.0),
    "rabbit": (1.0, 12.0),
}
SMALL_DOGS = {"Shih Tzu", "Pug", "Dachshund", "Boston Terrier", "French Bulldog", "Maltese",
              "Cavalier King Charles Spaniel", "Yorkshire Terrier", "Chihuahua"}  # fmt: skip
LARGE_DOGS = {"Labrador Retriever", "Labrador", "Golden Retriever", "German Shepherd", "Boxer",
              "Standard Poodle", "Rottweiler", "Doberman"}  # fmt: skip
SMALL_DOG_WEIGHT = (4.0, 30.0)
LARGE_DOG_WEIGHT = (40.0, 120.0)
# Oldest plausible age in years, by type.
PET_AGES = {"dog": 20, "cat": 25, "bird": 60, "fish": 20, "reptile": 40, "rabbit": 14}


def test_every_pet_weighs_and_is_as_old_as_its_kind(two_seeds: list[Applicant]) -> None:
    types_of_breed: dict[str | None, set[str | None]] = {}
    for record in two_seeds:
        for pet in record.pets:
            assert pet.type in PET_WEIGHTS, pet.type
            assert pet.weight_in_pounds is not None
            assert pet.age_in_years is not None
            lightest, heaviest = PET_WEIGHTS[pet.type]
            if pet.type == "dog" and pet.breed in SMALL_DOGS:
                lightest, heaviest = SMALL_DOG_WEIGHT
            elif pet.type == "dog" and pet.breed in LARGE_DOGS:
                lightest, heaviest = LARGE_DOG_WEIGHT
            assert lightest <= pet.weight_in_pounds <= heaviest, (pet.type, pet.breed, pet)
            assert 0 <= pet.age_in_years <= PET_AGES[pet.type], (pet.type, pet.age_in_years)
            types_of_breed.setdefault(pet.breed, set()).add(pet.type)
    # A breed is of one kind of animal: no Siamese dogs, no Labrador cats.
    assert {breed: types for breed, types in types_of_breed.items() if len(types) > 1} == {}
    assert {"dog", "cat"} <= {pet.type for record in two_seeds for pet in record.pets}


def test_pet_answers_fit_the_animal(two_seeds: list[Applicant]) -> None:
    pets = [pet for record in two_seeds for pet in record.pets]
    assert all(pet.is_declawed is None for pet in pets if pet.type != "cat")
    assert all(pet.is_service_animal is not True for pet in pets if pet.type != "dog")
    assert all(
        pet.is_fixed is None and pet.is_vaccinated is None and pet.is_trained is None
        for pet in pets
        if pet.type == "fish"
    )
    dogs = [pet for pet in pets if pet.type == "dog" and pet.is_service_animal is not None]
    assert 0 < sum(bool(pet.is_service_animal) for pet in dogs) < len(dogs) // 4


# An income with no period is a month's if it is under this, else a year's: nobody
# renting reports a yearly income under $20,000 as such, nor a monthly one over it.
MONTHLY_BELOW = Decimal(20_000)


def annual(income_dollars: Decimal) -> Decimal:
    return income_dollars * 12 if income_dollars < MONTHLY_BELOW else income_dollars


def test_self_reported_incomes_are_a_renters(two_seeds: list[Applicant]) -> None:
    totals = []
    for record in two_seeds:
        total = Decimal(0)
        for income in record.self_reported_income:
            assert income.amount_in_cents is not None
            assert income.amount_raw is not None
            # amount_raw is the source's text of the same amount: "$4,250.00".
            assert income.amount_raw.startswith("$"), income.amount_raw
            dollars = Decimal(income.amount_raw[1:].replace(",", ""))
            assert dollars * 100 == income.amount_in_cents, income
            assert Decimal(1_000) <= annual(dollars) <= Decimal(1_000_000), income
            total += annual(dollars)
        if record.self_reported_income:
            totals.append(total)
    assert len(totals) > len(two_seeds) // 2
    # Mostly $20k-$200k a year, almost all $15k-$300k; some monthly amounts, a few high.
    renters = sum(Decimal(20_000) <= total <= Decimal(200_000) for total in totals)
    assert renters >= 0.85 * len(totals)
    assert sum(Decimal(15_000) <= total <= Decimal(300_000) for total in totals) >= 0.95 * len(
        totals
    )
    amounts = [
        income.amount_in_cents
        for record in two_seeds
        for income in record.self_reported_income
        if income.amount_in_cents is not None
    ]
    assert any(cents < MONTHLY_BELOW * 100 for cents in amounts)  # monthly amounts
    assert any(total > 200_000 for total in totals)  # and the occasional high earner


def test_applicants_are_adults(two_seeds: list[Applicant]) -> None:
    ages = []
    for record in two_seeds:
        if record.date_of_birth is None:
            continue
        born, applied = date.fromisoformat(record.date_of_birth), instant(record.created_at).date()
        age = applied.year - born.year - ((applied.month, applied.day) < (born.month, born.day))
        assert 18 <= age <= 100, (record.id, record.date_of_birth, record.created_at)
        ages.append(age)
    assert len(ages) > len(two_seeds) // 2
    assert len(set(ages)) > 30


def test_no_implausible_combinations(two_seeds: list[Applicant]) -> None:
    places = {(record.city, record.state) for record in two_seeds if record.city and record.state}
    zip_prefixes: dict[str | None, set[str]] = {}
    for record in two_seeds:
        if record.city and record.zip:
            zip_prefixes.setdefault(record.city, set()).add(record.zip[:3])
    for record in two_seeds:
        # The first phone always has its number and its kind.
        assert record.phone_1 is not None, record.id
        assert record.phone_1_type is not None, record.id
        # The alternate address is one place, in the same city, state and zip.
        if record.city_alternate and record.state_alternate:
            assert (record.city_alternate, record.state_alternate) in places, record.id
        if record.city_alternate and record.zip_alternate:
            assert record.zip_alternate[:3] in zip_prefixes[record.city_alternate], record.id
        # A guarantor does not live in the unit, and neither do pets of theirs.
        if "GUARANTOR" in (record.type_normalized, (record.type_raw or "").upper()):
            assert record.pets == [], record.id
