"""The response bodies of `/v1/applicants` exactly as served, for the OpenAPI document.

The Structs of `records.py` describe what import accepts: most fields may be left out
and get a default, so a schema generated from them marks those fields optional and the
service fields nullable. A served record is stricter: every field is present (null when
unknown), the service fields are always set, and datetimes are RFC 3339 instants. These
Structs say that, field for field, in the same order; the handlers still send the bytes
stored in the database. `tests/test_openapi.py` checks that both sets of fields stay the
same and that real responses decode into these Structs and validate against the schema.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any

import msgspec

from leasestar.applicants.records import PageMeta

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class Served(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """No field has a default: every one is always in the JSON, `null` when unknown."""


class Application(Served, kw_only=True):
    applicant_id: str
    application_id: str | None
    status_raw: str | None
    status_normalized: str | None
    status: str | None
    custom_data: dict[str, Any]


class Pet(Served, kw_only=True):
    id: str | None
    created_at: datetime | None
    updated_at: datetime | None
    last_seen: datetime | None
    x_id: str | None
    age_in_years: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None
    breed: str | None
    color: str | None
    gender_raw: str | None
    is_declawed: bool | None
    is_fixed: bool | None
    is_service_animal: bool | None
    is_trained: bool | None
    is_vaccinated: bool | None
    name: str | None
    notes: str | None
    type: str | None
    weight_in_pounds: float | None
    custom_data: dict[str, Any]


class Screening(Served, kw_only=True):
    id: str | None
    created_at: datetime | None
    last_seen: datetime | None
    x_id: str | None
    status_raw: str | None
    screening_date: datetime | None


class Income(Served, kw_only=True):
    amount_in_cents: Int64 | None
    amount_raw: str | None
    type_normalized: str | None
    type_raw: str | None


class Applicant(Served, kw_only=True):
    """One applicant as served: every field of the specification, in its order."""

    id: NonEmpty
    created_at: datetime
    updated_at: datetime
    last_seen: datetime
    x_id: NonEmpty
    x_property_id: NonEmpty
    x_lead_id: str | None
    x_unit_id: str | None
    x_unit_id_preferred: list[str]
    x_lease_id: str | None
    property_id: NonEmpty
    unit_id_preferred: list[str]
    integration_id: NonEmpty
    integration_vendor: NonEmpty
    first_name: str | None
    middle_name: str | None
    last_name: str | None
    email_1: str | None
    email_2: str | None
    phone_1: str | None
    phone_1_type: str | None
    phone_2: str | None
    phone_2_type: str | None
    date_of_birth: date | None
    address_1: str | None
    address_1_alternate: str | None
    address_2: str | None
    address_2_alternate: str | None
    city: str | None
    city_alternate: str | None
    state: str | None
    state_alternate: str | None
    zip: str | None
    zip_alternate: str | None
    country: str | None
    country_alternate: str | None
    notes: str | None
    type_normalized: str | None
    type_raw: str | None
    custom_data: dict[str, Any]
    applications: list[Application]
    pets: list[Pet]
    screenings: list[Screening]
    self_reported_income: list[Income]


class ApplicantList(msgspec.Struct):
    """`GET /v1/applicants`: one page of applicants."""

    meta: PageMeta
    results: list[Applicant]


class ApplicantSingle(msgspec.Struct):
    """`GET /v1/applicants/{id}`: one applicant."""

    meta: PageMeta
    results: Applicant
