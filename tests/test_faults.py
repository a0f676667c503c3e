"""Faults (issue 5, part 4): bad database files, a write lock held by an import, SIGTERM.

- `leasestar serve` on a file it must not use (missing directory, unreadable, not SQLite,
  damaged, another application's SQLite file, a newer schema) ends at once with one line
  on stderr and a non-zero exit, and leaves the file byte for byte as it was.
- An import holding the write lock, pending rows and all, never fails a read: the API
  answers from the last committed snapshot.
- SIGTERM to a real server drains the requests in flight: every one gets its complete
  200, and the process exits 0.
- Faults a deployment meets (issue 11), each created for real: a full disk (a 2 MB
  tmpfs), a read-only directory (a read-only remount), a lock held past the busy timeout,
  a truncated or damaged file, a taken port. Each is one line naming the cause, exit 1,
  and the database as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import brotli
import pytest
from litestar.testing import AsyncTestClient

from leasestar import commands
from leasestar.applicants.records import Applicant
from leasestar.applicants.writer import ApplicantWriter
from leasestar.cli import main
from leasestar.config import Settings
from leasestar.main import create_app
from tests.strategies import MINIMAL
from tests.test_hardening import (
    ROOT,
    clean_env,
    copy_database,
    free_port,
    leasestar_command,
    new_token,
    parse_response,
    query_one,
    serve,
)

Client = AsyncTestClient  # type: ignore[type-arg]
LIST = "/v1/applicants"


# --- serve refuses files it must not use ----------------------------------------------


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with the SHA-256 of its bytes."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        if path.is_file()
        else "<dir>"
        for path in sorted(directory.rglob("*"))
    }


def serve_refuses(db: Path) -> str:
    """Run `leasestar serve --db DB`; it must end non-zero with one line on stderr."""
    return refuses("serve", "--db", str(db), "--port", str(free_port()))


def refuses(*argv: str) -> str:
    """Run `leasestar ARGV`; it must end non-zero with one line on stderr, which is returned."""
    result = subprocess.run(
        [*leasestar_command(), *argv],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    stderr = result.stderr.decode()
    assert result.returncode != 0, stderr
    assert stderr.endswith("\n")
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith("leasestar: "), stderr
    assert "Traceback" not in stderr
    assert result.stdout == b""
    return stderr.strip()


def _sqlite_file(path: Path, *statements: str) -> Path:
    connection = sqlite3.connect(path)
    try:
        for statement in statements:
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()
    return path


def _damaged(path: Path) -> Path:
    """A real SQLite file whose header survives but whose pages are overwritten."""
    _sqlite_file(path, "CREATE TABLE t (x)", "INSERT INTO t VALUES (1)")
    data = bytearray(path.read_bytes())
    data[100:] = bytes((n * 37 + 11) % 256 for n in range(len(data) - 100))
    path.write_bytes(bytes(data))
    return path


BAD_FILES = {
    "text": lambda p: p.write_text("name,email\nAnn,ann@example.com\n") and p,
    "random-bytes": lambda p: p.write_bytes(bytes(range(256)) * 16) and p,
    "truncated-sqlite": lambda p: (
        _sqlite_file(p, "CREATE TABLE t (x)").write_bytes(p.read_bytes()[:40]) and p
    ),
    "damaged-sqlite": _damaged,
    "another-applications-sqlite": lambda p: _sqlite_file(
        p, "CREATE TABLE notes (body TEXT)", "INSERT INTO notes VALUES ('keep me')"
    ),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_serve_refuses_a_file_that_is_not_a_leasestar_database(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "leasestar.db"
    BAD_FILES[kind](db)
    before = snapshot(tmp_path)
    message = serve_refuses(db)
    assert str(db) in message
    assert snapshot(tmp_path) == before  # no byte changed, no -wal/-shm/-journal left


def test_serve_refuses_a_newer_schema_version(tmp_path: Path, seeded_template: Path) -> None:
    db = copy_database(seeded_template, tmp_path / "leasestar.db")
    _sqlite_file(db, "PRAGMA journal_mode = DELETE", "PRAGMA user_version = 99")
    before = snapshot(tmp_path)
    message = serve_refuses(db)
    assert "schema version 99" in message
    assert "upgrade leasestar" in message
    assert snapshot(tmp_path) == before


def test_serve_refuses_a_missing_directory(tmp_path: Path) -> None:
    db = tmp_path / "not" / "there" / "leasestar.db"
    message = serve_refuses(db)
    assert "directory does not exist" in message
    assert not (tmp_path / "not").exists()  # nothing created on the way


def test_serve_refuses_a_directory_in_place_of_the_file(tmp_path: Path) -> None:
    db = tmp_path / "leasestar.db"
    db.mkdir()
    (db / "inside").write_text("untouched")
    before = snapshot(tmp_path)
    assert "is not a file" in serve_refuses(db)
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0,
    reason="root reads a file whatever its mode; the directory case above covers root",
)
def test_serve_refuses_an_unreadable_file(tmp_path: Path, seeded_template: Path) -> None:
    db = copy_database(seeded_template, tmp_path / "leasestar.db")
    before = snapshot(tmp_path)
    db.chmod(0)
    try:
        assert "cannot read database" in serve_refuses(db)
    finally:
        db.chmod(0o600)
    assert snapshot(tmp_path) == before


# --- a write lock held by an import ---------------------------------------------------


@pytest.fixture
async def client(seeded_copy: Path) -> AsyncIterator[Client]:
    token = new_token(seeded_copy, "reader")
    app = create_app(Settings(db_path=seeded_copy, log_format="off"))
    async with AsyncTestClient(app=app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def _new_applicant(number: int) -> Applicant:
    return Applicant(
        x_id=f"lock-{number}",
        x_property_id="lock-property",
        property_id="lock-property",
        integration_id="lock-integration",
        integration_vendor="LOCKTEST",
        first_name="Pending",
    )


async def _reads(client: Client, some_id: str) -> tuple[int, int, int]:
    """Total of the list, status of a record, status of /health."""
    listed = await client.get(LIST, params={"limit": 5})
    assert listed.status_code == 200, listed.text
    record = await client.get(f"{LIST}/{some_id}")
    health = await client.get("/health")
    return listed.json()["meta"]["total"], record.status_code, health.status_code


async def test_reads_answer_from_the_last_commit_while_an_import_holds_the_lock(
    client: Client, seeded_copy: Path
) -> None:
    some_id = query_one(seeded_copy, "SELECT id FROM applicants LIMIT 1")
    total_before, _, _ = await _reads(client, some_id)
    writer_connection = sqlite3.connect(seeded_copy, isolation_level=None)
    try:
        with ApplicantWriter(writer_connection) as writer:  # BEGIN IMMEDIATE
            for number in range(50):
                writer.upsert(_new_applicant(number))
            writer_connection.execute("UPDATE applicants SET body = body WHERE id = ?", (some_id,))
            # The lock is held, 50 rows pending: every read answers, from the old snapshot.
            for _ in range(3):
                assert await _reads(client, some_id) == (total_before, 200, 200)
            pending = await client.get(LIST, params={"integration_id": "lock-integration"})
            assert pending.json()["meta"]["total"] == 0
        # Committed: the next read sees the import.
        total_after, _, _ = await _reads(client, some_id)
        assert total_after == total_before + 50
    finally:
        writer_connection.close()


async def test_reads_answer_while_a_raw_exclusive_transaction_is_open(
    client: Client, seeded_copy: Path
) -> None:
    some_id = query_one(seeded_copy, "SELECT id FROM applicants LIMIT 1")
    total_before, _, _ = await _reads(client, some_id)
    locker = sqlite3.connect(seeded_copy, isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        locker.execute("DELETE FROM applicants WHERE id = ?", (some_id,))
        started = time.monotonic()
        assert await _reads(client, some_id) == (total_before, 200, 200)
        # Answered at once from the snapshot, not after waiting out the busy timeout.
        assert time.monotonic() - started < 5
        locker.execute("ROLLBACK")
    finally:
        locker.close()


# --- SIGTERM drains in-flight requests --------------------------------------------------


def server_side_sockets(port: int) -> list[tuple[str, int]]:
    """(TCP state, bytes unread) of each server-side connection of `port`, from /proc."""
    sockets = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            state = fields[3]
            if local_port == port and state != "0A":  # 0A: the listening socket
                sockets.append((state, int(fields[4].split(":")[1], 16)))
    return sockets


def read_response(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    received = bytearray()
    while chunk := connection.recv(1 << 16):
        received += chunk
    return parse_response(bytes(received))


@pytest.fixture
def drain_db(tmp_path: Path, seeded_template: Path) -> Path:
    return copy_database(seeded_template, tmp_path / "leasestar.db")


Answer = tuple[int, dict[str, str], bytes]


def _sigterm_during_burst(db: Path, token: str, burst: int) -> tuple[int, list[Answer], Answer]:
    """Send `burst` page requests and one long poll, SIGTERM the server once it has read
    them all, then read the answers: (requests unfinished at the signal, the pages' answers,
    the long poll's answer). The server must exit 0."""
    # Big pages, sorted and brotli-compressed: work enough that some are still being served
    # when the signal comes. The long poll (a sync request with nothing newer, held for
    # seconds) is in flight at the signal whatever the machine's speed or load: without
    # it, a fast server can serve a whole burst by the time it has read it.
    with sqlite3.connect(db) as connection:
        (high_water,) = connection.execute("SELECT change_seq FROM sync_state").fetchone()
    page = (
        f"GET {LIST}?limit=250&order-by=city,first_name HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nAccept-Encoding: br\r\nConnection: close\r\n\r\n"
    ).encode()
    long_poll = (
        f"GET {LIST}?changed_since={high_water}&wait=4 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    ).encode()
    with serve(db, "--log-format", "off", "--rate-limit", "off") as server:
        connections = [
            socket.create_connection(("127.0.0.1", server.port), timeout=60)
            for _ in range(burst + 1)
        ]
        try:
            connections[0].sendall(long_poll)
            for connection in connections[1:]:
                connection.sendall(page)
            # Wait until the server has read every request (nothing left unread in any of
            # its sockets): from then on each one is in flight, not merely queued.
            deadline = time.monotonic() + 60
            while True:
                sockets = server_side_sockets(server.port)
                established = [unread for state, unread in sockets if state == "01"]
                if len(sockets) >= burst + 1 and not any(established):
                    break
                assert time.monotonic() < deadline, sockets
                time.sleep(0.002)
            server.process.send_signal(signal.SIGTERM)
            in_flight = len(established)  # responses not yet finished at the signal
            answers = [read_response(connection) for connection in connections]
        finally:
            for connection in connections:
                connection.close()
        returncode = server.process.wait(timeout=60)
        assert returncode == 0, server.log()[-2000:]
        # And it stopped listening.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    return in_flight, answers[1:], answers[0]


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads socket queues from /proc")
def test_sigterm_drains_requests_in_flight_then_exits_0(drain_db: Path) -> None:
    token = new_token(drain_db, "drain")
    in_flight, answers, held = _sigterm_during_burst(drain_db, token, 40)
    assert in_flight >= 1  # the long poll, at least
    for status, headers, body in answers:
        assert status == 200
        assert int(headers["content-length"]) == len(body)
        page = json.loads(brotli.decompress(body))
        assert len(page["results"]) == 250
    status, headers, body = held
    assert status == 200
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body)["results"] == []


# --- faults a deployment meets (issue 11): one line naming the cause, nothing lost ------

RESTORE = "restore it from a backup or an earlier `leasestar export`"


# The commands that write to a database, and export, with the arguments each needs
# ("IMPORT" stands for a file to import).
COMMANDS: dict[str, list[str]] = {
    "seed": ["seed", "--count", "5"],
    "import": ["import", "IMPORT"],
    "token-create": ["token", "create", "--name", "late"],
    "serve": ["serve", "--port", "0"],
    "export": ["export"],
}
WRITERS = ("seed", "import", "token-create", "serve")


def command_line(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """COMMANDS[command] ready to run in this process (a `serve` that got as far as
    serving would fail the test)."""
    monkeypatch.setattr(commands, "run_server", lambda *args, **kwargs: pytest.fail("served"))
    source = tmp_path / "in.ndjson"
    source.write_bytes(json.dumps({**MINIMAL, "x_id": "FAULT"}).encode() + b"\n")
    return [str(source) if part == "IMPORT" else part for part in COMMANDS[command]]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """`leasestar ARGV` in this process: its exit status and its one stderr line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("leasestar: "), err
    return code, err.removeprefix("leasestar: ").rstrip("\n")


def content(db: Path) -> tuple[list[Any], list[Any]]:
    """What a database holds (applicants and tokens), read without writing a byte."""
    connection = sqlite3.connect(f"file:{db}?immutable=1", uri=True)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return (
            connection.execute("SELECT id, body FROM applicants ORDER BY id").fetchall(),
            connection.execute("SELECT name, revoked_at FROM tokens ORDER BY name").fetchall(),
        )
    finally:
        connection.close()


def _mount(*arguments: str) -> None:
    result = subprocess.run(["mount", *arguments], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here ({result.stderr.strip() or result.returncode})")


@contextmanager
def small_disk(directory: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `directory` (needs root: skipped where mount is refused)."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    directory.mkdir()
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory))
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


@contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """Make `directory` read-only: a read-only remount of its tmpfs as root (root ignores
    modes), its mode otherwise."""
    if os.geteuid() == 0:
        _mount("-o", "remount,ro", str(directory))
        try:
            yield
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(directory)], check=False)
    else:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)


@pytest.fixture
def ndjson(tmp_path: Path) -> Path:
    """3,000 applicants as NDJSON (about 6 MB), outside any small disk."""
    source = tmp_path / "source.db"
    assert main(["seed", "--db", str(source), "--count", "3000", "--seed", "11"]) == 0
    out = tmp_path / "applicants.ndjson"
    assert main(["export", "--db", str(source), str(out)]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("command", ["import", "seed"])
def test_a_full_disk_says_so_and_keeps_the_database(
    tmp_path: Path, ndjson: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        db = disk / "leasestar.db"
        assert main(["seed", "--db", str(db), "--count", "20"]) == 0
        capsys.readouterr()
        before = content(db)
        argv = [str(ndjson)] if command == "import" else ["--count", "3000", "--seed", "5"]
        code, message = run_cli(capsys, command, "--db", str(db), *argv)
        assert code == 1
        assert message == (
            f"no space left on device: database or disk is full writing {db}; nothing was "
            "written (free space on its disk, then run the command again)"
        )
        assert content(db) == before


@pytest.mark.parametrize("command", [*WRITERS, "export"])
def test_a_read_only_directory_is_named(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    argv = command_line(command, tmp_path, monkeypatch)
    with small_disk(tmp_path / "disk", "8m") if os.geteuid() == 0 else _directory(tmp_path):
        directory = tmp_path / "disk"
        db = directory / "leasestar.db"
        assert main(["seed", "--db", str(db), "--count", "10"]) == 0
        capsys.readouterr()
        before = content(db)
        with read_only(directory):
            code, message = run_cli(capsys, *argv, "--db", str(db))
        assert code == 1
        reason = "on a read-only file system" if os.geteuid() == 0 else "not writable"
        assert message.startswith(f"cannot use database {db}: its directory {directory} is ")
        assert reason in message
        assert message.endswith("even to read it; nothing was written")
        assert content(db) == before


@contextmanager
def _directory(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "disk").mkdir()
    yield tmp_path / "disk"


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_database_locked_past_the_busy_timeout_is_named(
    tmp_path: Path,
    seeded_copy: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    monkeypatch.setattr("leasestar.database.BUSY_TIMEOUT_MS", 50)
    argv = command_line(command, tmp_path, monkeypatch)
    before = content(seeded_copy)
    holder = sqlite3.connect(seeded_copy, isolation_level=None)  # another program
    holder.execute("BEGIN EXCLUSIVE")
    try:
        code, message = run_cli(capsys, *argv, "--db", str(seeded_copy))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 1
    assert message == (
        f"database {seeded_copy} is locked by another program (waited 0.05 s); nothing was "
        "written: run the command again once that program is done"
    )
    assert content(seeded_copy) == before


def _truncated(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def _damaged_pages(db: Path) -> None:
    """Garbage over every page but the first (the schema's root survives, the rest not)."""
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page:] = bytes((n * 131 + 7) % 256 for n in range(len(data) - page))
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncated, _damaged_pages], ids=["truncated", "damaged"])
@pytest.mark.parametrize("command", ["serve", "import", "export"])
def test_a_truncated_or_damaged_database_is_named_with_what_to_do(
    tmp_path: Path, seeded_template: Path, command: str, damage: Callable[[Path], None]
) -> None:
    db = copy_database(seeded_template, tmp_path / "leasestar.db")
    _sqlite_file(db, "PRAGMA journal_mode = DELETE")  # one file, as a copied backup is
    damage(db)
    source = tmp_path / "in.ndjson"
    source.write_bytes(json.dumps({**MINIMAL, "x_id": "ON-DAMAGE"}).encode() + b"\n")
    before = snapshot(tmp_path)
    argv = {
        "serve": ["serve", "--port", str(free_port())],
        "import": ["import", str(source)],
        "export": ["export", str(tmp_path / "out.ndjson")],
    }[command]
    line = refuses(*argv, "--db", str(db))
    assert line.startswith(f"leasestar: database {db} is "), line
    assert ("is truncated (" if damage is _truncated else "is damaged (") in line
    assert RESTORE in line
    after = snapshot(tmp_path)
    assert not (tmp_path / "out.ndjson").exists()
    assert not (tmp_path / "out.ndjson.partial").exists()
    assert after["leasestar.db"] == before["leasestar.db"]


def test_a_port_in_use_is_named_before_anything_is_created(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        line = refuses("serve", "--db", str(db), "--port", str(port))
    assert line == (
        f"leasestar: cannot listen on 127.0.0.1:{port}: address already in use: another "
        "program is listening there; stop it or choose another --port"
    )
    assert not db.exists()
