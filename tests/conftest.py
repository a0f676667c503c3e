"""Shared fixtures: a fresh SQLite file per test, seeded data, real tokens, the real app."""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from litestar.testing import AsyncTestClient

from leasestar.applicants.pipeline import write_records
from leasestar.config import ListenAddress, Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import create_token

# The in-process test client's address (Litestar's AsyncTestClient): an app built with it
# as its metrics address serves /metrics to that client, as `leasestar serve` does on the
# address of --metrics-address.
TEST_CLIENT_ADDRESS = ListenAddress("testserver.local", 80)


# Litestar's logging writes from a queue-listener thread to the stderr it found when the
# app was made; under pytest that is a capture stream, closed when its test ends. A record
# that thread writes a moment later (httpx logs every test-client request at INFO) then
# fails with "I/O operation on closed file", and pytest reports the thread's exception as
# an error of whichever test runs next. As in production, a handler's own I/O error must
# not become an exception: logging's switch for exactly that.
logging.raiseExceptions = False

# CI runs every property test with a seed fixed per test (and no example database), so a
# landing never depends on the draw: what fails once fails every time, and on a developer's
# machine too with HYPOTHESIS_PROFILE=ci. Elsewhere the seed is random, to find new cases.
# No deadline anywhere: a deadline is a timing assertion, and on a loaded machine an
# example's first run (imports, a cold cache) took 1 s against the 200 ms default.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile(
    "ci" if os.environ.get("CI") or os.environ.get("HYPOTHESIS_PROFILE") == "ci" else "dev"
)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A new, empty database file with the schema applied."""
    path = tmp_path / "leasestar.db"
    open_for_write(path).close()
    return path


@pytest.fixture
def db(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A write connection to the test database."""
    connection = open_for_write(db_path)
    yield connection
    connection.close()


@pytest.fixture
def seeded_db(db_path: Path, db: sqlite3.Connection) -> Path:
    """The test database with 300 deterministic synthetic applicants."""
    write_records(db, synthetic_applicants(300, seed=7))
    return db_path


@pytest.fixture
def token(db: sqlite3.Connection) -> str:
    """An unscoped bearer token."""
    return create_token(db, "test-all")


@pytest.fixture
async def client(seeded_db: Path, token: str) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """The real app over the seeded database, authenticated with `token`."""
    app = create_app(Settings(db_path=seeded_db, metrics_address=TEST_CLIENT_ADDRESS))
    async with AsyncTestClient(app=app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


# --- Added for the API contract suite: the seeded data made once, copied per test ------


@pytest.fixture(scope="session")
def seeded_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 300 applicants of `seeded_db`, seeded once per session into a template file."""
    path = tmp_path_factory.mktemp("template") / "seeded.db"
    connection = open_for_write(path)
    try:
        write_records(connection, synthetic_applicants(300, seed=7))
    finally:
        connection.close()
    return path


@pytest.fixture
def seeded_copy(db_path: Path, seeded_template: Path) -> Path:
    """`db_path` holding exactly what `seeded_db` writes, copied from the template (fast).

    A test module that makes many requests overrides `seeded_db` with this fixture.
    """
    source = sqlite3.connect(seeded_template)
    target = sqlite3.connect(db_path)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    return db_path
