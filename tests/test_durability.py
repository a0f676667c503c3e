"""An import is all or nothing, whatever happens to the process, and never blocks readers.

SIGKILL leaves no chance to clean up: what the database holds afterwards is what SQLite
recovered from its file and WAL. Each kill below must leave the database exactly as it
was (integrity_check ok, same rows and bytes, same schema, same data version), and able
to take the same import again.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from leasestar.applicants.ndjson import export_ndjson
from leasestar.applicants.pipeline import import_ndjson, write_records
from leasestar.applicants.records import applicant_encoder
from leasestar.applicants.writer import KEPT_INDEXES
from leasestar.config import Settings
from leasestar.database import open_for_write
from leasestar.main import create_app
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import create_token
from tests.servers import children

LEASESTAR = Path(sys.executable).with_name("leasestar")
STORED = 200
IMPORTED = 12_000
# Runs `import_ndjson` in a subprocess with bulk mode from 100 rows and the worker
# process from line 100, printing each phase and then pausing in it, so the test can
# kill the process at that exact point.
PHASED_IMPORT = """
import sys, time
from pathlib import Path
from leasestar.applicants.pipeline import import_ndjson
from leasestar.database import open_for_write

class Phases:
    def advance(self, done, position=0):
        pass
    def phase(self, label):
        print(label, flush=True)
        if label == sys.argv[3]:
            time.sleep(60)

connection = open_for_write(Path(sys.argv[1]))
with open(sys.argv[2], "rb") as stream:
    import_ndjson(connection, stream, Phases(), bulk_min_rows=100, worker_after_lines=100)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def import_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """IMPORTED new applicants and updates of every stored one, as NDJSON (~25 MB)."""
    path = tmp_path_factory.mktemp("durability") / "import.ndjson"
    with path.open("wb") as out:
        for record in synthetic_applicants(STORED, seed=11):
            changed = msgspec.structs.replace(record, notes="changed", updated_at=None)
            out.write(applicant_encoder.encode(changed) + b"\n")
        for record in synthetic_applicants(IMPORTED, seed=12):
            out.write(applicant_encoder.encode(record) + b"\n")
    return path


@pytest.fixture
def stored_db(tmp_path: Path) -> Path:
    path = tmp_path / "durable.db"
    connection = open_for_write(path)
    try:
        write_records(connection, synthetic_applicants(STORED, seed=11))
    finally:
        connection.close()
    return path


@pytest.fixture(params=["stored", "empty"])
def killed_db(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """What a killed import writes to: STORED rows (the write goes to the WAL), or none
    (a write into an empty database goes to the file, behind a rollback journal)."""
    if request.param == "stored":
        path: Path = request.getfixturevalue("stored_db")
        return path
    path = tmp_path / "empty.db"
    open_for_write(path).close()
    return path


def state(path: Path) -> tuple[Any, ...]:
    """What a reader can see, byte for byte, and that the file is sound."""
    connection = open_for_write(path)  # recovers the WAL like any first opener
    try:
        out = io.BytesIO()
        export_ndjson(connection, out)
        return (
            connection.execute("PRAGMA integrity_check").fetchall(),
            out.getvalue(),
            connection.execute("SELECT * FROM applicants ORDER BY id").fetchall(),
            connection.execute("SELECT change_seq FROM sync_state").fetchall(),
            connection.execute("SELECT type, name, sql FROM sqlite_schema ORDER BY 2").fetchall(),
        )
    finally:
        connection.close()


def read_position(process: subprocess.Popen[bytes], path: Path) -> int:
    """How far the process has read into the file at `path` (Linux: /proc fdinfo)."""
    fds = Path(f"/proc/{process.pid}/fd")
    try:
        for fd in fds.iterdir():
            if os.readlink(fd) == str(path):
                fdinfo = Path(f"/proc/{process.pid}/fdinfo/{fd.name}").read_text()
                return int(fdinfo.split("pos:", 1)[1].split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def wait_for(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def assert_gone(pids: list[int]) -> None:
    """Each process ends by itself (the import's worker notices its parent is gone)."""

    def alive() -> list[int]:
        running = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if state != "Z":
                running.append(pid)
        return running

    wait_for(lambda: not alive(), timeout=20)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process if it still runs, and reap it (never leave one behind)."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def assert_journal_of_the_write(path: Path, before: tuple[Any, ...]) -> None:
    """A write into an empty database runs behind a rollback journal; otherwise in the WAL."""
    assert Path(f"{path}-journal").exists() == (not before[2])


def assert_recovers_and_imports(path: Path, before: tuple[Any, ...], import_file: Path) -> None:
    after = state(path)
    assert after[0] == [("ok",)]
    assert after == before
    connection = open_for_write(path)
    try:
        with import_file.open("rb") as stream:
            report = import_ndjson(connection, stream)
        # The file updates the STORED rows: into an empty database, it inserts them.
        assert report.counts.inserted == IMPORTED + (0 if before[2] else STORED)
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        connection.close()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux /proc")
def test_sigkill_mid_file_leaves_the_database_as_it_was(killed_db: Path, import_file: Path) -> None:
    """`leasestar import FILE` killed once it has read 80% of the file.

    By then its worker process parses the lines (from line 8,193): it must not outlive
    the importer.
    """
    before = state(killed_db)
    most = import_file.stat().st_size * 4 // 5
    process = subprocess.Popen(
        [str(LEASESTAR), "import", "--db", str(killed_db), str(import_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: read_position(process, import_file) > most or process.poll() is not None)
        assert process.poll() is None, "the import finished before it could be killed"
        workers = children(process.pid)
        assert_journal_of_the_write(killed_db, before)
        process.send_signal(signal.SIGKILL)
    finally:
        stop(process)
    assert process.returncode == -signal.SIGKILL
    assert workers  # the parser, and multiprocessing's resource tracker
    assert_gone(workers)
    assert_recovers_and_imports(killed_db, before, import_file)


@pytest.mark.slow
def test_sigkill_while_waiting_for_more_input_leaves_the_database_as_it_was(
    stored_db: Path, import_file: Path
) -> None:
    """`leasestar import -` fed half a file on stdin, killed while it waits for the rest."""
    before = state(stored_db)
    lines = import_file.read_bytes().splitlines(keepends=True)
    process = subprocess.Popen(
        [str(LEASESTAR), "import", "--db", str(stored_db), "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdin is not None
        # Returns once the importer has read all of it but a pipe's buffer.
        process.stdin.write(b"".join(lines[: len(lines) // 2]))
        process.stdin.flush()
        time.sleep(0.2)
        assert process.poll() is None
        process.send_signal(signal.SIGKILL)
    finally:
        stop(process)
    assert process.returncode == -signal.SIGKILL
    assert_recovers_and_imports(stored_db, before, import_file)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["first index", "middle index", "committing"])
def test_sigkill_in_each_phase_of_a_bulk_import_leaves_the_database_as_it_was(
    killed_db: Path, import_file: Path, moment: str
) -> None:
    """Killed with the secondary indexes dropped, half rebuilt, or all rebuilt."""
    before = state(killed_db)
    dropped = sum(
        1
        for kind, name, sql in before[4]
        if kind == "index" and sql and " ON applicants " in sql and name not in KEPT_INDEXES
    )
    assert dropped >= 10
    phase = {
        "first index": f"building indexes 1/{dropped}",
        "middle index": f"building indexes {dropped // 2}/{dropped}",
        "committing": "committing",
    }[moment]
    process = subprocess.Popen(
        [sys.executable, "-c", PHASED_IMPORT, str(killed_db), str(import_file), phase],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert process.stdout is not None
        labels = []
        for label in process.stdout:
            labels.append(label.decode().strip())
            if labels[-1] in (phase, "done"):
                break
        assert labels[-1] == phase, labels
        workers = children(process.pid)
        assert_journal_of_the_write(killed_db, before)
        process.send_signal(signal.SIGKILL)
    finally:
        stop(process)
    assert process.returncode == -signal.SIGKILL
    assert_gone(workers)
    assert_recovers_and_imports(killed_db, before, import_file)


# --- readers during an import ---------------------------------------------------------


class GatedStream(io.RawIOBase):
    """A byte stream that stops after `gate` lines until `opened` is set."""

    def __init__(self, data: bytes, gate: int) -> None:
        self._lines: Iterator[bytes] = iter(data.splitlines(keepends=True))
        self._gate = gate
        self._served = 0
        self.waiting = threading.Event()
        self.opened = threading.Event()

    def readline(self, size: int | None = -1) -> bytes:
        if self._served == self._gate:
            self.waiting.set()
            assert self.opened.wait(60)
        self._served += 1
        return next(self._lines, b"")


def start_import(
    path: Path, stream: IO[bytes], bulk_min_rows: int
) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        connection = open_for_write(path)
        try:
            outcome.append(import_ndjson(connection, stream, bulk_min_rows=bulk_min_rows))
        except BaseException as error:  # handed to the test thread
            outcome.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


async def page(client: AsyncTestClient) -> dict[str, Any]:  # type: ignore[type-arg]
    response = await client.get("/v1/applicants", params={"limit": "250", "order-by": ""})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize("bulk_min_rows", [10**9, 20], ids=["row-by-row", "bulk"])
async def test_reads_are_served_from_the_last_commit_while_an_import_runs(
    tmp_path: Path, bulk_min_rows: int
) -> None:
    path = tmp_path / "reads.db"
    connection = open_for_write(path)
    try:
        write_records(connection, synthetic_applicants(100, seed=21))
        token = create_token(connection, "reader")
    finally:
        connection.close()
    new = b"".join(applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(100, seed=22))
    stream = GatedStream(new, gate=60)
    async with AsyncTestClient(app=create_app(Settings(db_path=path))) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        before = await page(client)
        assert before["meta"]["total"] == 100
        thread, outcome = start_import(path, stream, bulk_min_rows)  # type: ignore[arg-type]
        assert await asyncio.to_thread(stream.waiting.wait, 60)
        # 60 rows written (and, in bulk mode, every secondary index dropped) but not
        # committed: readers see exactly the last commit, and are not kept waiting.
        started = time.monotonic()
        during = await page(client)
        assert during == before
        one = before["results"][0]
        response = await client.get(f"/v1/applicants/{one['id']}")
        assert response.json()["results"] == one
        response = await client.get("/v1/applicants", params={"order-by": "last_name,first_name"})
        assert response.json()["meta"]["total"] == 100
        assert time.monotonic() - started < 5
        stream.opened.set()
        await asyncio.to_thread(thread.join, 60)
        assert outcome
        assert not isinstance(outcome[0], BaseException), outcome
        after = await page(client)
        assert after["meta"]["total"] == 200
        assert {r["id"] for r in before["results"]} < {r["id"] for r in after["results"]}


async def test_every_response_during_an_import_comes_from_one_snapshot(tmp_path: Path) -> None:
    """Pages fetched while an import commits are all old or all new, never a mix."""
    path = tmp_path / "snapshot.db"
    connection = open_for_write(path)
    try:
        write_records(connection, synthetic_applicants(120, seed=31))
        token = create_token(connection, "reader")
    finally:
        connection.close()
    new = b"".join(applicant_encoder.encode(r) + b"\n" for r in synthetic_applicants(120, seed=32))
    async with AsyncTestClient(app=create_app(Settings(db_path=path))) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        old_ids = {r["id"] for r in (await page(client))["results"]}
        thread, outcome = start_import(path, io.BytesIO(new), bulk_min_rows=50)
        seen_totals = set()
        while thread.is_alive() or not seen_totals >= {240}:
            body = await page(client)
            ids = {r["id"] for r in body["results"]}
            assert body["meta"]["total"] == len(ids)
            assert ids == old_ids or (len(ids) == 240 and old_ids < ids), body["meta"]
            seen_totals.add(body["meta"]["total"])
        thread.join()
        assert outcome
        assert not isinstance(outcome[0], BaseException), outcome
        assert seen_totals <= {120, 240}
