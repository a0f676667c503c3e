"""Fixtures shared by the applicant tests: a real server per test module (streaming and
long polls), and a small database of look-alike emails and phones (filters, keysets)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from leasestar.applicants.pipeline import write_records
from leasestar.applicants.records import Applicant
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import create_token
from tests.servers import serving

RECORDS = 2_500  # more than two of the stream's 1,000-row batches
SCOPE = "int_entrata_01"
# High enough never to refuse a test, and its headers show what each request counted.
RATE_LIMIT = 100_000


class Server(msgspec.Struct):
    base_url: str
    path: Path
    token: str
    scoped_token: str


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """uvicorn over 2,500 seeded applicants, with an unscoped and a scoped token."""
    directory = tmp_path_factory.mktemp("stream")
    path = directory / "leasestar.db"
    connection = open_for_write(path)
    try:
        write_records(connection, synthetic_applicants(RECORDS, seed=3))
        token = create_token(connection, "all")
        scoped = create_token(connection, "one", (SCOPE,))
    finally:
        connection.close()
    with serving(path, directory / "server.log", LEASESTAR_RATE_LIMIT=f"{RATE_LIMIT}/minute") as (
        base_url,
        _,
    ):
        yield Server(base_url=base_url, path=path, token=token, scoped_token=scoped)


def client_of(server: Server, token: str | None = None) -> httpx.Client:
    """An HTTP client of the server, with the unscoped token unless another is given."""
    return httpx.Client(
        base_url=server.base_url,
        headers={"Authorization": f"Bearer {token or server.token}"},
        timeout=60,
    )


@pytest.fixture
def emails_db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """Three applicants whose emails differ only in case, ASCII or not."""
    connection = open_for_write(tmp_path / "query.db")
    stamp = "2024-01-01T00:00:00.000Z"
    write_records(
        connection,
        [
            Applicant(
                id=f"app_{n}",
                created_at=stamp,
                updated_at=stamp,
                last_seen=stamp,
                x_id=str(n),
                x_property_id="P",
                property_id="p",
                integration_id="int_a",
                integration_vendor="YARDI",
                email_1=email,
                phone_1=phone,
            )
            for n, (email, phone) in enumerate(
                [
                    ("ann@example.com", "(555) 123-4567"),
                    ("Ánn@example.com", "+1 555 123 4567"),
                    ("ánn@example.com", "44 555 123 4567"),
                ]
            )
        ],
    )
    yield connection
    connection.close()
