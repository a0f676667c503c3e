"""A valid record reduced to what writing it needs: its encoding, content hash and columns.

Made where a record is parsed or generated (for a large input, in a worker process, so
that this work shares two cores with the SQLite writes) and written by
`writer.ApplicantWriter.write`. See docs/write-path.md.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final, NamedTuple

from leasestar.applicants.records import (
    APPLICANT_FIELDS,
    SERVICE_FIELDS,
    Applicant,
    applicant_encoder,
)

# The encoding of an Applicant starts with the four service fields, then x_id. The
# content hash covers everything from `,"x_id":` on, behind null service fields, which
# is byte for byte the encoding of the record with its service fields set to None.
assert APPLICANT_FIELDS[:5] == (*SERVICE_FIELDS, "x_id")
_TAIL_MARK: Final = b',"x_id":'
_NULL_SERVICE_HEAD: Final = b'{"id":null,"created_at":null,"updated_at":null,"last_seen":null'
_NOT_A_DIGIT: Final = re.compile(r"[^0-9]")


def phone_digits(phone: str | None) -> str | None:
    """The ASCII digits of a free-form phone: the stored column the phone_1 filter matches."""
    if phone is None:
        return None
    return _NOT_A_DIGIT.sub("", phone) or None


def content_tail(encoded: bytes) -> int:
    """Where the non-service fields start in an applicant's encoding."""
    # Inside a JSON string every `"` is escaped, so the first `,"x_id":` is the key.
    return encoded.index(_TAIL_MARK)


def _content_digest(encoded: bytes, tail: int) -> bytes:
    digest = hashlib.blake2b(_NULL_SERVICE_HEAD, digest_size=16)
    digest.update(memoryview(encoded)[tail:])
    return digest.digest()


def content_hash(record: Applicant) -> bytes:
    """Hash of every non-service field: equal hashes mean nothing changed."""
    encoded = applicant_encoder.encode(record)
    return _content_digest(encoded, content_tail(encoded))


class Prepared(NamedTuple):
    """A valid record reduced to what writing it needs."""

    key: tuple[str, str, str]  # integration_id, x_property_id, x_id
    given: tuple[str | None, str | None, str | None, str | None]  # the service fields
    # integration_vendor, property_id, first_name, middle_name, last_name, email_1,
    # phone_1 digits, date_of_birth, city, state, zip: the typed columns after the key
    columns: tuple[str | None, ...]
    digest: bytes  # content hash: every non-service field
    encoded: bytes  # the record's canonical encoding
    tail: int  # where the non-service fields start in `encoded`


RecordFields = tuple[Any, ...]

# What a generator yields: a record, or (from a trusted generator, seed's) a record
# already in stored form: its canonical encoding, byte for byte what
# `applicant_encoder` writes for it, and the fields `record_fields` would take from it.
# The second is written as it is, without building and validating Structs that would
# only be encoded again; the generator's tests hold it to that encoding.
Generated = Applicant | tuple[bytes, RecordFields]


def prepare(record: Applicant, encoded: bytes | None = None) -> Prepared:
    """Reduce a valid record (and its encoding, if known) to what writing it needs."""
    if encoded is None:
        encoded = applicant_encoder.encode(record)
    return _prepared(encoded, record_fields(record))


def prepare_generated(item: Generated) -> Prepared:
    """`prepare` for what a generator yields (`Generated`)."""
    if isinstance(item, Applicant):
        return prepare(item)
    encoded, fields = item
    return _prepared(encoded, fields)


def record_fields(record: Applicant) -> RecordFields:
    """The fields writing needs, in the order `_prepared` takes them."""
    return (
        record.integration_id,
        record.x_property_id,
        record.x_id,
        record.id,
        record.created_at,
        record.updated_at,
        record.last_seen,
        record.integration_vendor,
        record.property_id,
        record.first_name,
        record.middle_name,
        record.last_name,
        record.email_1,
        record.phone_1,
        record.date_of_birth,
        record.city,
        record.state,
        record.zip,
    )


def _prepared(encoded: bytes, fields: RecordFields) -> Prepared:
    """`fields` in `record_fields` order: the key, the service fields, then the columns."""
    tail = content_tail(encoded)
    return Prepared(
        fields[0:3],
        fields[3:7],
        (*fields[7:13], phone_digits(fields[13]), *fields[14:]),
        _content_digest(encoded, tail),
        encoded,
        tail,
    )
