"""Clients generated from the served OpenAPI document work the first time.

Generators nobody here wrote, pinned: openapi-python-client (the test extra) and
openapi-typescript with openapi-fetch and TypeScript 5 (tests/generated_clients/
package.json and its lock file). Each client is generated from /schema/openapi.json of a
real server, then used as its README shows, with no workaround arguments
(tests/generated_clients/python_walk.py, walk.ts): a list walked by cursor, the sync
feed, a record by id, and a 400 read as the typed error body. The expected ids come
from the database file through plain SQL.

Node.js comes from Debian (`apt-get install nodejs npm`) when it is missing and this
runs as root; otherwise the TypeScript test is skipped, saying why. npm installs are
kept in .cache/generated-clients/ (git-ignored) and redone only when the lock changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.client.test_client import ids_ordered, max_change_seq
from tests.json_body import register_json_body
from tests.test_hardening import ROOT, Server, copy_database, new_token, serve

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HERE = Path(__file__).resolve().parent / "generated_clients"
NODE_CACHE = ROOT / ".cache" / "generated-clients"
STEP_TIMEOUT = 300  # seconds, for each generator, compiler and client run
PYTHON_GENERATOR_CONFIG = """\
project_name_override: leasestar-api-generated
package_name_override: leasestar_api
post_hooks: []
"""


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, seeded_template: Path
) -> Iterator[tuple[Server, Path, str]]:
    db = copy_database(seeded_template, tmp_path_factory.mktemp("generated") / "leasestar.db")
    token = new_token(db, "generated")
    with serve(db, "--rate-limit", "off") as server:
        yield server, db, token


@pytest.fixture(scope="module")
def document(served: tuple[Server, Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The document as the server serves it, saved for the generators."""
    response = httpx.get(f"{served[0].base_url}/schema/openapi.json", timeout=30)
    assert response.status_code == 200
    path = tmp_path_factory.mktemp("document") / "openapi.json"
    path.write_bytes(response.content)
    return path


def scalar(db: Path, sql: str) -> Any:
    connection = sqlite3.connect(db)
    register_json_body(connection)
    try:
        return connection.execute(sql).fetchone()[0]
    finally:
        connection.close()


def assert_walked(db: Path, seen: dict[str, Any]) -> None:
    """What both walkers must have seen (they make the same requests)."""
    # SQLite's BINARY order of UTF-8 text is code point order, the API's; nulls first.
    assert seen["walk"] == ids_ordered(db, "last_name, first_name, id")
    assert seen["sync"] == ids_ordered(db, "change_seq")
    assert seen["change_seq"] == max_change_seq(db)
    # Served instants are `YYYY-MM-DDTHH:MM:SS.mmmZ`, which sort as text.
    assert seen["updated_since_2023"] == scalar(
        db,
        "SELECT count(*) FROM applicants "
        "WHERE json_extract(json_body(body), '$.updated_at') >= '2023'",
    )
    assert seen["get"] == seen["walk"][0]
    assert seen["error"] == [400, "invalid_request", "limit", "0"]


def run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"{command[:3]}: {result.stdout}\n{result.stderr}"
    return result


def test_openapi_python_client(
    served: tuple[Server, Path, str], document: Path, tmp_path: Path
) -> None:
    server, db, token = served
    config = tmp_path / "config.yml"
    config.write_text(PYTHON_GENERATOR_CONFIG)
    project = tmp_path / "generated"
    generated = run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(document),
         "--config", str(config), "--output-path", str(project)],
        cwd=tmp_path,
    )  # fmt: skip
    # No warnings: every schema and operation of the document was understood.
    assert "Warning" not in generated.stdout + generated.stderr, generated.stdout
    # The walker type-checks against the generated package (typed models, typed error).
    run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            str(HERE / "python_walk.py"),
        ],
        cwd=tmp_path,
        MYPYPATH=str(project),
    )
    walked = run(
        [sys.executable, str(HERE / "python_walk.py"), server.base_url, token],
        cwd=tmp_path,
        PYTHONPATH=str(project),
    )
    assert_walked(db, json.loads(walked.stdout))


def _node_and_npm() -> tuple[str, str]:
    """node and npm, installed from Debian if missing (as root); else a skip saying why."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if (node is None or npm is None) and shutil.which("apt-get") and os.geteuid() == 0:
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "nodejs", "npm"]):
            subprocess.run(command, capture_output=True, timeout=900, check=False)
        node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(
            "Node.js and npm are not installed, and cannot be here (apt-get needs root): "
            "the TypeScript client generated from the document is not checked"
        )
    return node, npm


def _node_modules(npm: str) -> Path:
    """The pinned tools, installed once per lock file into the git-ignored cache."""
    lock = (HERE / "package-lock.json").read_bytes()
    stamp = NODE_CACHE / "installed-lock.sha256"
    digest = hashlib.sha256(lock).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        shutil.rmtree(NODE_CACHE, ignore_errors=True)
        NODE_CACHE.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(HERE / name, NODE_CACHE / name)
        installed = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=NODE_CACHE,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT,
            check=False,
        )
        unreachable = ("ENOTFOUND", "ECONNREFUSED", "ETIMEDOUT", "EAI_AGAIN")
        if installed.returncode != 0 and any(code in installed.stderr for code in unreachable):
            pytest.skip(f"the npm registry cannot be reached: {installed.stderr[-500:]}")
        assert installed.returncode == 0, installed.stderr
        stamp.write_text(digest)
    return NODE_CACHE / "node_modules"


def test_openapi_typescript_with_openapi_fetch(
    served: tuple[Server, Path, str], document: Path, tmp_path: Path
) -> None:
    server, db, token = served
    node, npm = _node_and_npm()
    modules = _node_modules(npm)
    for name in ("walk.ts", "tsconfig.json", "package.json"):
        shutil.copyfile(HERE / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(modules, target_is_directory=True)
    run([node, str(modules / "openapi-typescript" / "bin" / "cli.js"), str(document),
         "-o", "schema.d.ts"], cwd=tmp_path)  # fmt: skip
    tsc = str(modules / "typescript" / "bin" / "tsc")
    run([node, tsc, "--noEmit", "-p", "."], cwd=tmp_path)  # strict, see tsconfig.json
    run([node, tsc, "-p", "."], cwd=tmp_path)  # the same program, emitted to run it
    walked = run([node, "out/walk.js", server.base_url, token], cwd=tmp_path)
    assert_walked(db, json.loads(walked.stdout))
