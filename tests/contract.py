"""The contract's vocabulary, written out once for the tests (CONTRACT.md, README).

Tests restate these on purpose instead of importing the app's own tables: an assertion
against `leasestar`'s table would pass whatever the table said.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Sortable fields, in the contract's order.
SORTABLE: Final = (
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
# The applicant's top-level fields, in the specification's order (section 2.3).
RECORD_FIELDS: Final = (
    "id",
    "created_at",
    "updated_at",
    "last_seen",
    "x_id",
    "x_property_id",
    "x_lead_id",
    "x_unit_id",
    "x_unit_id_preferred",
    "x_lease_id",
    "property_id",
    "unit_id_preferred",
    "integration_id",
    "integration_vendor",
    "first_name",
    "middle_name",
    "last_name",
    "email_1",
    "email_2",
    "phone_1",
    "phone_1_type",
    "phone_2",
    "phone_2_type",
    "date_of_birth",
    "address_1",
    "address_1_alternate",
    "address_2",
    "address_2_alternate",
    "city",
    "city_alternate",
    "state",
    "state_alternate",
    "zip",
    "zip_alternate",
    "country",
    "country_alternate",
    "notes",
    "type_normalized",
    "type_raw",
    "custom_data",
    "applications",
    "pets",
    "screenings",
    "self_reported_income",
)
# The sortable fields schema.sql lets be null.
NULLABLE_SORTABLE: Final = (
    "first_name",
    "middle_name",
    "last_name",
    "email_1",
    "date_of_birth",
    "city",
    "state",
    "zip",
)
# What identifies a record: its id and its source key, which a write never changes.
IDENTITY: Final = ("id", "integration_id", "x_property_id", "x_id")
INSTANT_FIELDS: Final = ("created_at", "updated_at", "last_seen")
# Date bound parameter -> (field, comparison); inclusive bounds.
DATE_BOUNDS: Final[Mapping[str, tuple[str, str]]] = {
    "updated_at_gte": ("updated_at", ">="),
    "updated_at_lte": ("updated_at", "<="),
    "last_seen_gte": ("last_seen", ">="),
    "last_seen_lte": ("last_seen", "<="),
}
EQUALITY_FILTERS: Final = ("integration_id", "integration_vendor", "property_id", "x_property_id")
# Filters of the list route only (unknown parameters on /v1/applicants/{id}).
LIST_ONLY_FILTERS: Final = (*EQUALITY_FILTERS, "email_1", "phone_1", "x_id")
SHARED_PARAMETERS: Final = ("offset", "limit", "order-by", "fields", *DATE_BOUNDS)
LIST_ONLY_PARAMETERS: Final = (*LIST_ONLY_FILTERS, "cursor", "changed_since", "wait")
META_KEYS: Final = ("offset", "limit", "orderBy", "hasMore", "total")
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 250
MAX_OFFSET: Final = 2**63 - 1
# The code each status carries (CONTRACT.md, "Errors").
ERROR_CODES: Final = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    414: "uri_too_long",
    429: "rate_limited",
    431: "request_header_fields_too_large",
    500: "internal_error",
    503: "service_unavailable",
}
# Fields of a served applicant that are never null (CONTRACT.md, "Applicant JSON").
NEVER_NULL: Final = frozenset(
    {
        "id",
        "created_at",
        "updated_at",
        "last_seen",
        "x_id",
        "x_property_id",
        "property_id",
        "integration_id",
        "integration_vendor",
        "x_unit_id_preferred",
        "unit_id_preferred",
        "custom_data",
        "applications",
        "pets",
        "screenings",
        "self_reported_income",
    }
)
