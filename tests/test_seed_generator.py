"""The seed generator: what `seed` stores is what an import of the record would store.

`synthetic_records` builds each record's stored bytes directly (no Structs), and the
writer stores them unchecked, so these tests hold it to the contract instead: the
bytes are the canonical encoding of the Applicant they decode to, the fields are that
Applicant's, the stream is deterministic, and the data keeps the variety the API
tests rely on.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import msgspec
import pytest

from app.applicants.ingest import _fields
from app.applicants.records import (
    SERVICE_FIELDS,
    Applicant,
    applicant_encoder,
    applicant_line_decoder,
)
from seed.generator import (
    APPLICATION_COUNTS,
    INCOME_COUNTS,
    PET_COUNTS,
    SCREENING_COUNTS,
    synthetic_applicants,
    synthetic_records,
)

COUNT = 3000


@pytest.fixture(scope="module")
def applicants() -> list[Applicant]:
    return list(synthetic_applicants(COUNT, seed=0))


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_records_are_their_canonical_encoding_with_their_own_fields(seed: int) -> None:
    for encoded, fields in synthetic_records(COUNT, seed):
        record = applicant_line_decoder.decode(encoded)  # validates, as an import does
        assert applicant_encoder.encode(record) == encoded
        assert fields == _fields(record)


def test_the_same_arguments_give_the_same_bytes() -> None:
    assert list(synthetic_records(500, 3)) == list(synthetic_records(500, 3))
    assert list(synthetic_records(200, 3)) == list(synthetic_records(500, 3))[:200]
    first = {encoded for encoded, _ in synthetic_records(200, 3)}
    assert first.isdisjoint(encoded for encoded, _ in synthetic_records(200, 4))


def test_every_nullable_field_is_sometimes_null_and_sometimes_filled(
    applicants: list[Applicant],
) -> None:
    for field in msgspec.structs.fields(Applicant):
        if field.default is None and field.name not in SERVICE_FIELDS:
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
