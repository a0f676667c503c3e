"""Installed as a user installs it (issue 11, part 1): a wheel, a fresh venv, no checkout.

The wheel is built from a copy of the source tree (so the build leaves nothing in the
checkout), installed with its dependencies into a new virtual environment in a
temporary directory, next to another project's top-level `app` package, and every
command runs from a directory outside the checkout with nothing of the checkout on the
path: `seed`, `token create`, `export`, `import`, `serve` with real requests, and
`--version` both as the console script and as `python -m leasestar`. pip's cache makes a
second run quick.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.test_hardening import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
INSTALL_TIMEOUT = 600
COMMAND_TIMEOUT = 120
# What a copy of the source tree leaves out: the development venv and caches.
NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "work", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "*.db*"
)


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    outside: Path  # a working directory that is not the checkout

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`argv[0]` from the venv's bin/, run outside the checkout with a clean env."""
        return subprocess.run(
            [str(self.venv / "bin" / argv[0]), *argv[1:]],
            cwd=self.outside,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=check,
        )

    def env(self) -> dict[str, str]:
        drop = ("LEASESTAR_", "PYTHON", "VIRTUAL_ENV")
        return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _pip(python: Path, *argv: str) -> None:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *argv],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    wheels = base / "wheels"
    _pip(Path(sys.executable), "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(source))
    (wheel,) = wheels.glob("leasestar-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=COMMAND_TIMEOUT)
    _pip(venv / "bin" / "python", "install", "--quiet", str(wheel))
    # Another project's top-level `app` package, installed beside leasestar.
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "app").mkdir()
    (site / "app" / "__init__.py").write_text("OWNER = 'another project'\n")
    outside = base / "elsewhere"
    outside.mkdir()
    return Installed(venv, wheel, outside)


def test_the_wheel_holds_one_import_package_with_the_schema(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        schema = wheel.read("leasestar/schema.sql")
    top_level = {name.split("/", 1)[0] for name in names}
    assert top_level == {"leasestar", f"leasestar-{PROJECT['version']}.dist-info"}
    assert schema == (ROOT / "schema.sql").read_bytes()
    assert "leasestar/seed/generator.py" in names


def test_version_matches_the_package_metadata(installed: Installed) -> None:
    expected = f"leasestar {PROJECT['version']}"
    # The first line; the next says which litestream replicas would use (README).
    assert installed.run("leasestar", "--version").stdout.splitlines()[0] == expected
    assert (
        installed.run("python", "-m", "leasestar", "--version").stdout.splitlines()[0] == expected
    )


def test_it_runs_from_the_venv_beside_another_projects_app_package(installed: Installed) -> None:
    found = installed.run(
        "python", "-c", "import app, leasestar; print(app.OWNER); print(leasestar.__file__)"
    ).stdout.splitlines()
    assert found[0] == "another project"
    assert Path(found[1]).is_relative_to(installed.venv)
    assert not Path(found[1]).is_relative_to(ROOT)


@contextmanager
def serving(installed: Installed, db: Path) -> Iterator[str]:
    """The installed `leasestar serve` on a free port, until the block ends."""
    port = free_port()
    flags = ("--port", str(port), "--workers", "2", "--log-format", "off")
    log = installed.outside / f"serve-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(installed.venv / "bin" / "leasestar"), "serve", "--db", str(db), *flags],
            cwd=installed.outside,
            env=installed.env(),
            stdout=sink,
            stderr=sink,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            assert process.poll() is None, log.read_text(errors="replace")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0, log.read_text(errors="replace")


def test_every_command_works_outside_the_checkout(installed: Installed) -> None:
    seeded = installed.run("leasestar", "seed", "--db", "seeded.db", "--count", "40")
    assert seeded.stdout == "seeded 40 applicants (seed 0); 40 rows written\n"
    installed.run("leasestar", "export", "--db", "seeded.db", "applicants.ndjson")
    lines = (installed.outside / "applicants.ndjson").read_bytes().splitlines()
    assert len(lines) == 40
    imported = installed.run("leasestar", "--db", "served.db", "import", "applicants.ndjson")
    assert imported.stdout.startswith("imported 40 applicants: 40 new")
    created = installed.run("leasestar", "token", "create", "--db", "served.db", "--name", "e2e")
    token = created.stdout.splitlines()[-1]
    with serving(installed, installed.outside / "served.db") as base:
        headers = {"Authorization": f"Bearer {token}"}
        page = httpx.get(f"{base}/v1/applicants?limit=5&order-by=id", headers=headers)
        assert page.status_code == 200
        assert page.json()["meta"]["total"] == 40
        first_id = sorted(line.split(b'"id":"', 1)[1].split(b'"', 1)[0] for line in lines)[0]
        assert page.json()["results"][0]["id"] == first_id.decode()
        docs = httpx.get(f"{base}/schema")
        assert docs.status_code == 200
        assert httpx.get(f"{base}/schema/assets/swagger-ui.css").status_code == 200
    assert (installed.outside / "served.db-ratelimit").exists()  # beside its database
