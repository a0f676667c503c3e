"""A record reduced to its row (prepared.py): the content hash and the phone digits.

Expected values are built here by hand or with the Structs' own encoder, never read
back from the code under test: a stored row is compared with what CONTRACT.md says it
must be.
"""

from __future__ import annotations

import hashlib

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from leasestar.applicants.prepared import content_hash, phone_digits
from leasestar.applicants.records import Applicant, applicant_encoder
from leasestar.seed.generator import synthetic_applicants

# --- the content hash and the typed columns ---------------------------------------------


def reference_hash(record: Applicant) -> bytes:
    """The content hash as first specified: the encoding with null service fields."""
    blank = msgspec.structs.replace(
        record, id=None, created_at=None, updated_at=None, last_seen=None
    )
    return hashlib.blake2b(applicant_encoder.encode(blank), digest_size=16).digest()


def test_content_hash_is_the_hash_of_the_record_without_service_fields() -> None:
    for record in synthetic_applicants(200, seed=3):
        assert content_hash(record) == reference_hash(record)
    # The id cannot hold `"` or `,` (APPLICANT_ID_RULE), so the decoy is in x_id only.
    tricky = Applicant(
        id="app_:x_id:evil",
        x_id=',"x_id":',
        x_property_id="P",
        property_id="p",
        integration_id="i",
        integration_vendor="V",
    )
    assert content_hash(tricky) == reference_hash(tricky)


@given(st.none() | st.text() | st.from_regex(r"\+?1? ?\(?[0-9]{3}\)?[ .-]?[0-9]{3}-?[0-9]{4}"))
def test_stored_phone_digits_are_what_the_phone_filter_matches(phone: str | None) -> None:
    """The phone_1 column keeps the ASCII digits only (other Unicode digits are not 0-9)."""
    expected = None if phone is None else "".join(c for c in phone if "0" <= c <= "9") or None
    assert phone_digits(phone) == expected
