"""`make docs-check`: the documentation page rendered by a real browser, offline.

Starts `leasestar serve` on a free port over a freshly seeded temporary database, loads
`/schema` in headless Chromium with every host but 127.0.0.1 unresolvable (so a single
asset fetched from a CDN would break the page), asserts that Swagger UI rendered each
operation, saves a screenshot to docs/api-docs.png, and stops the server.

Not collected by pytest (it needs Chromium, which `make docs-check` installs).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "docs" / "api-docs.png"
LEASESTAR = Path(sys.executable).with_name("leasestar")
# What Swagger UI renders for each operation: an element id and the summary.
RENDERED = (
    "operations-applicants-listApplicants",
    "operations-applicants-getApplicant",
    "operations-service-health",
    "operations-service-metrics",
    "List applicants",
    "Get an applicant by id",
)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Every name but the server's fails to resolve: the page must need nothing else.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--virtual-time-budget=20000",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_healthy(base: str, server: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"docs-check: the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("docs-check: the server did not become healthy in time")


def _chromium(profile: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("docs-check: chromium is not installed (make docs-check installs it)")
    return subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="leasestar-docs-") as work:
        workdir = Path(work)
        database = workdir / "docs.db"
        subprocess.run(
            [LEASESTAR, "seed", "--count", "50", "--db", str(database)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        environment = {**os.environ, "LEASESTAR_LOG_FORMAT": "off"}
        server = subprocess.Popen(
            [LEASESTAR, "serve", "--db", str(database), "--host", "127.0.0.1", "--port", str(port)],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_healthy(base, server)
            dom = _chromium(workdir / "profile-dom", "--dump-dom", f"{base}/schema")
            missing = [text for text in RENDERED if text not in dom.stdout]
            if dom.returncode != 0 or missing:
                print(dom.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"docs-check: the page did not render {missing or 'at all'}")
            SCREENSHOT.parent.mkdir(exist_ok=True)
            SCREENSHOT.unlink(missing_ok=True)
            shot = _chromium(
                workdir / "profile-shot",
                f"--screenshot={SCREENSHOT}",
                "--window-size=1280,1600",
                f"{base}/schema",
            )
            if shot.returncode != 0 or not SCREENSHOT.is_file():
                print(shot.stderr[-2000:], file=sys.stderr)
                raise SystemExit("docs-check: no screenshot was taken")
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    print(f"docs-check: /schema rendered {len(RENDERED)} expected items; screenshot {SCREENSHOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
