"""The applicant record and its envelopes, as msgspec Structs.

One set of Structs serves both directions: import decodes NDJSON lines into them
(validating and normalising as it goes), and encoding them gives the canonical JSON
that is stored in `applicants.body` and served byte for byte. Every field is always
encoded (no `omit_defaults`): unknown values are `null`, empty arrays `[]`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

import msgspec

# SortKey is defined with the served Structs; re-exported for the query modules.
from leasestar.client.records import SortKey as SortKey
from leasestar.instants import canonical_instant, is_calendar_date

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
CustomData = dict[str, Any]

# The service's id is served at /v1/applicants/{id}, so it must be one path segment that
# every client writes alike and every server reads back unchanged: RFC 3986's unreserved
# characters (never percent-encoded) and ":" (allowed in a segment), but not the dot
# segments "." and "..", which clients and proxies fold away. A "/" would split the
# segment, and anything else needs percent-encoding that clients apply unevenly.
APPLICANT_ID_RULE: Final = "must be 1-128 characters of A-Z a-z 0-9 . _ ~ : - (and not . or ..)"
_APPLICANT_ID: Final = re.compile(r"[A-Za-z0-9._~:-]{1,128}")


def is_applicant_id(value: str) -> bool:
    """Whether `value` may be an applicant's id (reachable at /v1/applicants/{id})."""
    return _APPLICANT_ID.fullmatch(value) is not None and value not in (".", "..")


# Deeper custom_data is refused: it cannot be a real source record, and unbounded
# nesting is how a hostile file exhausts the stack of whoever reads our export.
MAX_CUSTOM_DATA_DEPTH = 32


def _check_custom_data(value: Any, depth: int = 0) -> None:
    """Refuse custom_data that is too deep or holds integers beyond 64 bits."""
    if depth > MAX_CUSTOM_DATA_DEPTH:
        raise ValueError(f"custom_data is nested deeper than {MAX_CUSTOM_DATA_DEPTH} levels")
    if isinstance(value, dict):
        for item in value.values():
            _check_custom_data(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_custom_data(item, depth + 1)
    elif isinstance(value, int) and not -(2**63) <= value <= 2**63 - 1:
        raise ValueError("custom_data holds an integer beyond 64 bits")


def _instant_or_none(field: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return canonical_instant(value)
    except ValueError as error:
        raise ValueError(f"{field}: {error}") from None


class Record(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, gc=False):
    """Common options: keyword construction, unknown fields refused on import.

    gc=False is safe because decoded JSON cannot form reference cycles.
    """


class Application(Record, kw_only=True):
    applicant_id: str
    application_id: str | None = None
    status_raw: str | None = None
    status_normalized: str | None = None
    status: str | None = None
    custom_data: CustomData = {}

    def __post_init__(self) -> None:
        _check_custom_data(self.custom_data)


class Pet(Record, kw_only=True):
    id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    last_seen: str | None = None
    x_id: str | None = None
    age_in_years: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    breed: str | None = None
    color: str | None = None
    gender_raw: str | None = None
    is_declawed: bool | None = None
    is_fixed: bool | None = None
    is_service_animal: bool | None = None
    is_trained: bool | None = None
    is_vaccinated: bool | None = None
    name: str | None = None
    notes: str | None = None
    type: str | None = None
    weight_in_pounds: float | None = None
    custom_data: CustomData = {}

    def __post_init__(self) -> None:
        self.created_at = _instant_or_none("created_at", self.created_at)
        self.updated_at = _instant_or_none("updated_at", self.updated_at)
        self.last_seen = _instant_or_none("last_seen", self.last_seen)
        _check_custom_data(self.custom_data)


class Screening(Record, kw_only=True):
    id: str | None = None
    created_at: str | None = None
    last_seen: str | None = None
    x_id: str | None = None
    status_raw: str | None = None
    screening_date: str | None = None

    def __post_init__(self) -> None:
        self.created_at = _instant_or_none("created_at", self.created_at)
        self.last_seen = _instant_or_none("last_seen", self.last_seen)
        self.screening_date = _instant_or_none("screening_date", self.screening_date)


class Income(Record, kw_only=True):
    amount_in_cents: Int64 | None = None
    amount_raw: str | None = None
    type_normalized: str | None = None
    type_raw: str | None = None


class Applicant(Record, kw_only=True):
    """One applicant, fields in the order of the specification (section 2.3).

    The four service fields (`id`, `created_at`, `updated_at`, `last_seen`) may be
    absent on import; storage fills them (see leasestar/applicants/writer.py). Everything a
    stored or served record holds is filled.
    """

    id: str | None = None  # APPLICANT_ID_RULE, checked below
    created_at: str | None = None
    updated_at: str | None = None
    last_seen: str | None = None
    x_id: NonEmpty
    x_property_id: NonEmpty
    x_lead_id: str | None = None
    x_unit_id: str | None = None
    x_unit_id_preferred: list[str] = []
    x_lease_id: str | None = None
    property_id: NonEmpty
    unit_id_preferred: list[str] = []
    integration_id: NonEmpty
    integration_vendor: NonEmpty
    first_name: str | None = None
    middle_name: str | None = None
    last_name: str | None = None
    email_1: str | None = None
    email_2: str | None = None
    phone_1: str | None = None
    phone_1_type: str | None = None
    phone_2: str | None = None
    phone_2_type: str | None = None
    date_of_birth: str | None = None
    address_1: str | None = None
    address_1_alternate: str | None = None
    address_2: str | None = None
    address_2_alternate: str | None = None
    city: str | None = None
    city_alternate: str | None = None
    state: str | None = None
    state_alternate: str | None = None
    zip: str | None = None
    zip_alternate: str | None = None
    country: str | None = None
    country_alternate: str | None = None
    notes: str | None = None
    type_normalized: str | None = None
    type_raw: str | None = None
    custom_data: CustomData = {}
    applications: list[Application] = []
    pets: list[Pet] = []
    screenings: list[Screening] = []
    self_reported_income: list[Income] = []

    def __post_init__(self) -> None:
        if self.id is not None and not is_applicant_id(self.id):
            raise ValueError(f"id: {APPLICANT_ID_RULE}")
        # The specification's vendor names are upper case (YARDI, ENTRATA): one spelling
        # per vendor, so the equality filter on it finds them all.
        if self.integration_vendor != self.integration_vendor.upper():
            raise ValueError("integration_vendor: must be upper case")
        self.created_at = _instant_or_none("created_at", self.created_at)
        self.updated_at = _instant_or_none("updated_at", self.updated_at)
        self.last_seen = _instant_or_none("last_seen", self.last_seen)
        if self.date_of_birth is not None and not is_calendar_date(self.date_of_birth):
            raise ValueError("date_of_birth: must be a calendar date YYYY-MM-DD")
        for index, application in enumerate(self.applications):
            if application.applicant_id != self.x_id:
                raise ValueError(f"applications[{index}].applicant_id: must equal x_id")
        _check_custom_data(self.custom_data)


APPLICANT_FIELDS: tuple[str, ...] = Applicant.__struct_fields__
SERVICE_FIELDS = ("id", "created_at", "updated_at", "last_seen")

applicant_encoder = msgspec.json.Encoder()
applicant_line_decoder = msgspec.json.Decoder(Applicant)
