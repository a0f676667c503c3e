"""A real leasestar server for tests: uvicorn in a subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 60.0
UVICORN = [sys.executable, "-m", "uvicorn", "--factory", "leasestar.main:create_app_from_env",
           "--host", "127.0.0.1"]  # fmt: skip


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")}
    env.update(extra)
    return env


def wait_for_health(base_url: str, process: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}: {log.read_text()}")
        try:
            response = httpx.get(f"{base_url}/health", timeout=2)
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        if response.status_code == 503 and "not ready" in response.json()["error"]["message"]:
            time.sleep(0.1)  # the columnar copy is being opened (or built)
            continue
        assert response.status_code == 200
        assert response.json() == {"status": "ok"}
        return
    raise AssertionError(f"server did not answer /health in {START_TIMEOUT} s: {log.read_text()}")


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@contextlib.contextmanager
def serving(path: Path, log: Path, **env: str) -> Iterator[tuple[str, int]]:
    """uvicorn serving the database at `path` (settings from `env`): (base URL, port)."""
    port = free_port()
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [*UVICORN, "--port", str(port)],
            cwd=ROOT,
            env=clean_env(LEASESTAR_DB=str(path), **env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_for_health(base_url, process, log)
        yield base_url, port
    finally:
        stop(process)


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (Linux: /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
