"""The response bodies of the API as msgspec Structs: what the server documents, what
the client decodes.

One definition for both sides. The server declares these Structs for its OpenAPI
document (its handlers send bytes already stored in the database, in this shape), and
`leasestar.client` decodes every response into them; `tests/test_openapi.py` checks that
real responses decode into them strictly and validate against the document. This module
imports nothing but msgspec and the standard library, so the client installs without
the server's dependencies.

The Structs of `leasestar/applicants/records.py` describe what import accepts: most
fields may be left out and get a default. A served record is stricter: every field is
present (null when unknown), the service fields are always set, and datetimes are RFC
3339 instants. These Structs say that, field for field, in the same order (a test holds
the two sets of fields equal).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime
from typing import Annotated, Any, Final, Literal, cast

import msgspec

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
# 64-bit integers say so in the document (`format: int64`), or generated clients may read
# them as 32-bit ints.
Int64 = Annotated[
    int,
    msgspec.Meta(
        ge=-(2**63),
        le=2**63 - 1,
        # Nullable where used: the format goes on the integer branch of the oneOf.
        extra_json_schema={
            "extra": {"one_of": [{"type": "integer", "format": "int64"}, {"type": "null"}]}
        },
    ),
]
Count = Annotated[int, msgspec.Meta(extra_json_schema={"extra": {"format": "int64", "minimum": 0}})]

# The fields an ordering may name (`order-by`), in the order of the specification; the
# sync feed's ordering names `change_seq`.
SORTABLE_FIELDS: Final = (
    "id",
    "created_at",
    "updated_at",
    "last_seen",
    "x_id",
    "x_property_id",
    "property_id",
    "integration_id",
    "integration_vendor",
    "first_name",
    "middle_name",
    "last_name",
    "email_1",
    "date_of_birth",
    "city",
    "state",
    "zip",
)
ORDERING_FIELDS: Final = (*SORTABLE_FIELDS, "change_seq")


class Served(msgspec.Struct, kw_only=True):
    """No field has a default: every one is always in the JSON, `null` when unknown.

    Unknown fields are ignored, so a server that adds a field does not break a client
    built before it (the document test holds the served fields equal to these).
    """


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


def narrowed_record(fields: Iterable[str]) -> type[Served]:
    """The record of an answer asked for with `fields=`: a Struct of the served
    `Applicant`'s fields named (those this client knows), typed as there."""
    chosen = set(fields)
    members = [(f.name, f.type) for f in msgspec.structs.fields(Applicant) if f.name in chosen]
    return cast(
        "type[Served]",
        msgspec.defstruct("ApplicantFields", members, bases=(Served,), kw_only=True),
    )


class SortKey(msgspec.Struct, frozen=True, gc=False):
    """One key of an ordering, as echoed in `meta.orderBy`."""

    # A plain str in Python (the server builds keys from parsed text, and a client built
    # before a field became sortable still reads the answer); the document lists the
    # fields as an enum, for generated clients.
    field: Annotated[
        str, msgspec.Meta(extra_json_schema={"extra": {"enum": list(ORDERING_FIELDS)}})
    ]
    direction: Literal["asc", "desc"]


class PageMeta(msgspec.Struct, gc=False):
    """The `meta` object: what was applied, and what is left."""

    offset: Count
    limit: int
    order_by: Annotated[
        list[SortKey],
        msgspec.Meta(
            description="The ordering applied, one object per key; `[]` for no sorting. "
            "On the sync feed (`changed_since`) it is `change_seq` ascending."
        ),
    ] = msgspec.field(name="orderBy")
    has_more: bool = msgspec.field(name="hasMore")
    total: Count
    # Absent, not null, where they do not apply: the document gives each its plain type
    # (a one-member oneOf, which `str | UnsetType` would otherwise give, confuses
    # generators).
    next: Annotated[
        str | msgspec.UnsetType,
        msgspec.Meta(
            description="Lists only, present while `hasMore` is true: the opaque cursor "
            "of the next page, for `?cursor=`. It keeps the ordering, filters and limit, "
            "and never skips or repeats a record that exists throughout the walk.",
            extra_json_schema={"extra": {"one_of": None, "type": "string"}},
        ),
    ] = msgspec.UNSET
    change_seq: Annotated[
        int | msgspec.UnsetType,
        msgspec.Meta(
            description="Sync feed only (`changed_since`): the change sequence of the "
            "page's last record (or `changed_since` itself when nothing is new). Store "
            "the last page's value and pass it as `changed_since` next time.",
            extra_json_schema={
                "extra": {"one_of": None, "type": "integer", "format": "int64", "minimum": 0}
            },
        ),
    ] = msgspec.field(default=msgspec.UNSET, name="changeSeq")


class ApplicantList(msgspec.Struct):
    """`GET /v1/applicants`: one page of applicants."""

    meta: PageMeta
    results: list[Applicant]


class ApplicantSingle(msgspec.Struct):
    """`GET /v1/applicants/{id}`: one applicant."""

    meta: PageMeta
    results: Applicant
