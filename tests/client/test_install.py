"""The client installs and works without the server's dependencies.

`pip install ./client` into a fresh virtual environment (no pip of its own, nothing but
what the install brings), then the client from that environment walks a real server.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.test_hardening import ROOT, copy_database, new_token, serve

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVER_ONLY = ("litestar", "aiosqlite", "uvicorn", "prometheus_client", "brotli", "swagger_ui")
WALK = """
import importlib.util, sys
from leasestar.client import Client
missing = [name for name in sys.argv[3].split(",") if importlib.util.find_spec(name) is None]
assert missing == sys.argv[3].split(","), f"server dependencies installed: {missing}"
with Client(sys.argv[1], sys.argv[2]) as client:
    print(sum(1 for _ in client.applicants.list(limit=250)))
"""


def test_the_client_installs_alone_and_walks_a_server(
    tmp_path: Path, seeded_template: Path
) -> None:
    environment = tmp_path / "client-env"
    venv.create(environment, with_pip=False)
    python = environment / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         str(ROOT / "client")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    if installed.returncode != 0 and "No matching distribution" in installed.stderr:
        pytest.skip(f"no package index reachable for httpx and msgspec: {installed.stderr}")
    assert installed.returncode == 0, installed.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "list", "--format=freeze"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert {"leasestar-client", "httpx", "msgspec"} <= names
    assert "leasestar" not in names

    db = copy_database(seeded_template, tmp_path / "leasestar.db")
    token = new_token(db, "installed")
    with serve(db, "--rate-limit", "off") as server:
        walked = subprocess.run(
            [str(python), "-c", WALK, server.base_url, token, ",".join(SERVER_ONLY)],
            cwd=tmp_path,  # not the checkout: only what was installed can be imported
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert walked.returncode == 0, walked.stderr
    assert walked.stdout.strip() == "300"
