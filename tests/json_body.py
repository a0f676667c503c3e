"""Stored bodies read back as JSON in SQL, for tests that compare what the API serves
with what the database holds (the API's readers decode a page's bodies in bulk)."""

from __future__ import annotations

import sqlite3

import msgspec

from leasestar.applicants.bodies import DICTIONARIES, BodyDecoder, UnknownDictionary
from leasestar.applicants.cursors import KeyValue, SortValues, sort_key_values
from leasestar.applicants.records import SortKey


def register_json_body(connection: sqlite3.Connection) -> None:
    """Give `connection` the SQL function `json_body(body)`: a stored body's JSON, as text."""
    decoder = BodyDecoder.of(connection)

    def json_body(stored: bytes | str) -> str:
        if isinstance(stored, str):
            return stored  # JSON stored by a database from before
        try:
            return decoder.decode(stored).decode()
        except UnknownDictionary:
            decoder.add(connection.execute(DICTIONARIES).fetchall())
            return decoder.decode(stored).decode()

    connection.create_function("json_body", 1, json_body, deterministic=True)


def key_values(
    keys: tuple[SortKey, ...], record_json: bytes | str, change_seq: int | None
) -> tuple[KeyValue, ...]:
    """The values of the total-order `keys` for a served record, as stored in SQL."""
    return sort_key_values(keys, msgspec.json.decode(record_json, type=SortValues), change_seq)
