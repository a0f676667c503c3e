"""`leasestar token create | list | revoke`, run as a user runs them: a subprocess.

The tokens the CLI prints are then used against the real app over the same database,
so "the token works" and "the revoked token does not" are checked end to end.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from leasestar.config import Settings
from leasestar.main import create_app

TOKEN = re.compile(r"lst_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
CLI = [sys.executable, "-m", "leasestar"]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")}


def leasestar(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(),
        check=False,
    )


def leasestar_all(*commands: tuple[str | Path, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Run independent commands at once (each start-up costs most of a second)."""
    processes = [
        subprocess.Popen(
            [*CLI, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_clean_env(),
        )
        for args in commands
    ]
    results = []
    for args, process in zip(commands, processes, strict=True):
        stdout, stderr = process.communicate(timeout=60)
        results.append(
            subprocess.CompletedProcess([*CLI, *map(str, args)], process.returncode, stdout, stderr)
        )
    return results


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not TOKEN.search(result.stdout)
    return lines[0]


async def status_with(db_path: Path, token: str, path: str = "/v1/applicants?limit=1") -> int:
    async with AsyncTestClient(app=create_app(Settings(db_path=db_path))) as client:
        response = await client.get(path, headers={"Authorization": f"Bearer {token}"})
        return response.status_code


async def total_with(db_path: Path, token: str) -> int:
    async with AsyncTestClient(app=create_app(Settings(db_path=db_path))) as client:
        response = await client.get(
            "/v1/applicants?limit=1", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 200
        total: int = response.json()["meta"]["total"]
        return total


@pytest.fixture
def seeded_db(seeded_copy: Path) -> Path:
    return seeded_copy


def created_token(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    assert TOKEN.fullmatch(last), result.stdout  # the token, alone, on the last line
    return last


async def test_create_list_revoke_round_trip(seeded_db: Path) -> None:
    token = created_token(leasestar("token", "create", "--db", seeded_db, "--name", "ci"))
    assert await status_with(seeded_db, token) == 200
    assert await total_with(seeded_db, token) == 300

    listing = leasestar("token", "list", "--db", seeded_db)
    assert listing.returncode == 0, listing.stderr
    assert token not in listing.stdout  # shown once, never again
    ci_lines = [line for line in listing.stdout.splitlines() if line.split()[:1] == ["ci"]]
    assert len(ci_lines) == 1

    revoked = leasestar("token", "revoke", "--db", seeded_db, "ci")
    assert revoked.returncode == 0, revoked.stderr
    assert await status_with(seeded_db, token) == 401

    after = leasestar("token", "list", "--db", seeded_db)
    (line,) = (line for line in after.stdout.splitlines() if line.split()[:1] == ["ci"])
    assert line != ci_lines[0]  # the revocation shows
    assert re.search(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z.*\d{4}-\d{2}-\d{2}T", line)

    again = leasestar("token", "revoke", "--db", seeded_db, "ci")
    assert "ci" in one_line_error(again)
    assert await status_with(seeded_db, token) == 401


async def test_scoped_token_from_the_cli(seeded_db: Path) -> None:
    result = leasestar(
        "token", "create", "--db", seeded_db, "--name", "partner",
        "--integration", "int_yardi_01", "--integration", "int_resman_01",
    )  # fmt: skip
    token = created_token(result)
    connection = sqlite3.connect(seeded_db)
    try:
        (expected,) = connection.execute(
            "SELECT count(*) FROM applicants "
            "WHERE integration_id IN ('int_yardi_01', 'int_resman_01')"
        ).fetchone()
    finally:
        connection.close()
    assert 0 < expected < 300
    assert await total_with(seeded_db, token) == expected
    listing = leasestar("token", "list", "--db", seeded_db)
    (line,) = (line for line in listing.stdout.splitlines() if line.split()[:1] == ["partner"])
    assert "int_yardi_01" in line
    assert "int_resman_01" in line


async def test_duplicate_name_is_refused_and_the_first_token_still_works(seeded_db: Path) -> None:
    first = created_token(leasestar("token", "create", "--db", seeded_db, "--name", "dup"))
    second = leasestar("token", "create", "--db", seeded_db, "--name", "dup")
    assert "dup" in one_line_error(second)
    assert await status_with(seeded_db, first) == 200
    connection = sqlite3.connect(seeded_db)
    try:
        assert connection.execute("SELECT count(*) FROM tokens WHERE name = 'dup'").fetchone() == (
            1,
        )
    finally:
        connection.close()


def test_refusals_are_one_line(db_path: Path) -> None:
    results = leasestar_all(
        ("token", "revoke", "--db", db_path, "ghost"),
        ("token", "create", "--db", db_path, "--name", "bad name!"),
        ("token", "create", "--db", db_path, "--name", "x", "--integration", ""),
    )
    assert "ghost" in one_line_error(results[0])
    for result in results[1:]:
        one_line_error(result)
    connection = sqlite3.connect(db_path)
    try:
        assert connection.execute("SELECT count(*) FROM tokens").fetchone() == (0,)
    finally:
        connection.close()


def test_bad_db_paths_are_refused_and_nothing_is_touched(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "leasestar.db"
    victim = tmp_path / "notes.txt"
    content = b"my precious notes, not a database\n" * 100
    victim.write_bytes(content)
    directory = tmp_path / "a-directory"
    directory.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    results = leasestar_all(
        ("token", "create", "--name", "n", "--db", missing),
        ("token", "list", "--db", missing),
        ("token", "create", "--name", "n", "--db", victim),
        ("token", "revoke", "n", "--db", victim),
        ("token", "list", "--db", directory),
    )
    for result in results:
        one_line_error(result)
    assert "notes.txt" in one_line_error(results[2])
    assert victim.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no -wal, no -journal, no dir
    assert list(directory.iterdir()) == []


def test_console_script_is_installed(db_path: Path) -> None:
    script = Path(sys.executable).with_name("leasestar")
    assert script.exists()
    result = subprocess.run(
        [str(script), "token", "create", "--db", str(db_path), "--name", "via-script"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    created_token(result)
