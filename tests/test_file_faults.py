"""The files beside the database, damaged under a running server (issue 29, point 6 and
the `-shm` of point 7), each fault made for real against a real `leasestar serve`:

- the rate-limit file (`DB-ratelimit`) cut, overwritten, deleted, made immutable or
  replaced by a directory: every request is still answered 200, the process lives, one
  line says what happened, and the count goes on (in the file again, or in the worker's
  memory while the file cannot be used). It was SIGBUS, nothing logged;
- the database's `-shm` (SQLite's WAL index) deleted: the server opens its connections
  again within a second, one line, and answers with the writes made since (it answered
  from the old index: stale, then wrong pages once the WAL restarted);
- the `-shm` cut short: SQLite's mapping of it kills a worker with SIGBUS, which nothing
  in Python can catch; the worker's parent (with `--workers 1` too) names the signal in
  one line per worker killed and starts others, which answer with the current data.

Every wait has a deadline; nothing is timed but the one-second checks, waited out.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from pathlib import Path

import httpx
import pytest

from leasestar.applicants.pipeline import write_records
from leasestar.database import DatabaseError, open_for_write
from leasestar.rate_limit import WindowCounter
from leasestar.seed.generator import synthetic_applicants
from tests.servers import children
from tests.test_hardening import Server, copy_database, new_token, query_one, serve

LIST = "/v1/applicants"
BUDGET = 100  # under 512: counted one request at a time, exactly
CHECK_WAIT = 1.2  # past the once-a-second checks (of the rate-limit file and the -shm)
FILE_SIZE = 24 + 4096 * 32  # the rate-limit file: its magic and 4,096 slots
LINES_WITHIN = 15.0  # seconds for an expected log line to be written, on a loaded machine


@pytest.fixture
def db(seeded_template: Path, tmp_path: Path) -> Path:
    return copy_database(seeded_template, tmp_path / "leasestar.db")


@pytest.fixture
def token(db: Path) -> str:
    return new_token(db, "files")


def remaining(response: httpx.Response) -> int:
    """`r` of the answer's `RateLimit` field: what is left of the token's budget."""
    assert response.status_code == 200, response.text
    fields = dict(part.split("=") for part in response.headers["ratelimit"].split(";")[1:])
    return int(fields["r"])


def get(server: Server, token: str, path: str = LIST) -> httpx.Response:
    return httpx.get(
        f"{server.base_url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def log_records(server: Server) -> list[dict[str, object]]:
    """The server's log lines that are not access lines (`--log-format json`)."""
    records = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    return [record for record in records if "request_id" not in record]


def lines_saying(server: Server, phrase: str, at_least: int = 0) -> list[str]:
    """The log lines with `phrase`, once there are `at_least` of them (or after
    LINES_WITHIN): a worker's records reach its stderr through Litestar's queue listener,
    a thread of their own, so a line may come a moment after the answer."""
    deadline = time.monotonic() + LINES_WITHIN
    while True:
        lines = [str(r["message"]) for r in log_records(server) if phrase in str(r["message"])]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def limited(db: Path, *flags: str) -> AbstractContextManager[Server]:
    return serve(db, "--rate-limit", f"{BUDGET}/minute", "--log-format", "json", *flags)


# --- the rate-limit file ---------------------------------------------------------------


def _cut_to_nothing(path: Path) -> None:
    os.truncate(path, 0)


def _cut_in_half(path: Path) -> None:
    os.truncate(path, FILE_SIZE // 2)


def _overwrite(path: Path) -> None:
    with path.open("r+b") as file:
        file.write(b"SQLite format 3\x00")


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_cut_to_nothing, f"cut to 0 of its {FILE_SIZE:,} bytes"),
        (_cut_in_half, f"cut to {FILE_SIZE // 2:,} of its {FILE_SIZE:,} bytes"),
        (_overwrite, "overwritten"),
    ],
)
def test_a_damaged_rate_limit_file_is_cleared_and_counting_goes_on(
    db: Path, token: str, damage: Callable[[Path], None], said: str
) -> None:
    path = db.with_name(db.name + "-ratelimit")
    with limited(db, "--workers", "2") as server:
        assert [remaining(get(server, token)) for _ in range(3)] == [99, 98, 97]
        damage(path)
        after = []
        deadline = time.monotonic() + 30
        while not lines_saying(server, "rate-limit file") and time.monotonic() < deadline:
            after.append(remaining(get(server, token)))  # (asserts 200)
            time.sleep(0.1)
        after += [remaining(get(server, token)) for _ in range(3)]
        assert server.process.poll() is None
        lines = lines_saying(server, "rate-limit file")
        assert lines == [
            f"rate-limit file {path} was {said} while serving: cleared it, every token's "
            "window starts again"
        ], [str(record["message"]) for record in log_records(server)]
        # The window started again once cleared (before, r only fell), and is counted
        # exactly from there. Two workers: one may still be starting when the file is
        # cut, and finds it so first (rate_limit.py, `_publish_new`).
        restart = after.index(BUDGET - 1)
        assert after[restart:] == list(range(BUDGET - 1, BUDGET - 1 - len(after[restart:]), -1))
    assert path.stat().st_size == FILE_SIZE
    assert path.read_bytes()[:24] == b"leasestar rate limit v1\n"


def test_a_deleted_rate_limit_file_is_made_again_and_shared_by_both_servers(
    db: Path, token: str
) -> None:
    path = db.with_name(db.name + "-ratelimit")
    with limited(db) as first, limited(db) as second:
        assert remaining(get(first, token)) == 99
        assert remaining(get(second, token)) == 98  # one budget for both servers
        path.unlink()
        time.sleep(CHECK_WAIT)
        assert remaining(get(first, token)) == 99  # a new file: a new window
        assert path.stat().st_size == FILE_SIZE
        time.sleep(CHECK_WAIT)
        assert remaining(get(second, token)) == 98  # it follows the path: shared again
        assert remaining(get(first, token)) == 97
        assert first.process.poll() is None
        assert second.process.poll() is None
        deadline = time.monotonic() + LINES_WITHIN
        said = []
        while not said and time.monotonic() < deadline:  # (either server may say it)
            said = lines_saying(first, "rate-limit file") + lines_saying(second, "rate-limit file")
    assert said == [
        f"rate-limit file {path} was deleted while serving: counting in a new one (every "
        "token's window starts again)"
    ]


def _chattr(flag: str, path: Path) -> bool:
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    done = subprocess.run([chattr, flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


def test_an_immutable_rate_limit_file_is_counted_in_memory_until_it_can_be_written(
    db: Path, token: str
) -> None:
    """`chattr +i` needs root (CAP_LINUX_IMMUTABLE) and a file system that has it."""
    path = db.with_name(db.name + "-ratelimit")
    with limited(db, "--workers", "1") as server:
        assert [remaining(get(server, token)) for _ in range(3)] == [99, 98, 97]
        if not _chattr("+i", path):
            pytest.skip("chattr +i is not available here (not root, or not supported)")
        try:
            # The file reads but cannot be written: counted in the worker's memory.
            assert [remaining(get(server, token)) for _ in range(3)] == [99, 98, 97]
            assert lines_saying(server, "rate-limit file", 1) == [
                f"cannot write the rate-limit file {path}: Operation not permitted: this "
                "worker process counts the rate limit in its own memory until the file can "
                "be used (every token's window starts again, and each worker process has a "
                "budget of its own meanwhile)"
            ]
        finally:
            assert _chattr("-i", path)
        time.sleep(CHECK_WAIT)
        assert remaining(get(server, token)) == 96  # the file's window, as it was left
        assert server.process.poll() is None
        assert lines_saying(server, "can be used again", 1) == [
            f"rate-limit file {path} can be used again: counting in it (one budget per token "
            "for every worker process)"
        ]


def test_a_rate_limit_file_that_cannot_be_opened_is_counted_in_memory(db: Path, token: str) -> None:
    """An open that fails for any user (root reads a file whatever its mode): a
    directory in the file's place."""
    path = db.with_name(db.name + "-ratelimit")
    with limited(db) as server:
        assert [remaining(get(server, token)) for _ in range(2)] == [99, 98]
        path.unlink()
        path.mkdir()
        time.sleep(CHECK_WAIT)
        assert [remaining(get(server, token)) for _ in range(2)] == [99, 98]  # in memory
        path.rmdir()
        time.sleep(CHECK_WAIT)
        assert remaining(get(server, token)) == 99  # a new file at the path
        assert server.process.poll() is None
        lines = lines_saying(server, "rate-limit file", 2)
    assert lines == [
        f"cannot use the rate-limit file {path}: Is a directory: this worker process counts "
        "the rate limit in its own memory until the file can be used (every token's window "
        "starts again, and each worker process has a budget of its own meanwhile)",
        f"rate-limit file {path} can be used again: counting in it (one budget per token "
        "for every worker process)",
    ]


# --- the database's -shm (SQLite's WAL index) ----------------------------------------


def total(server: Server, token: str) -> int:
    response = get(server, token, f"{LIST}?limit=1")
    assert response.status_code == 200, response.text
    value: int = response.json()["meta"]["total"]
    return value


def write_and_restart_the_wal(db: Path, seed: int) -> int:
    """Write new applicants, checkpoint the WAL to its end and write more (the WAL starts
    again from its first frame): the applicants the database then holds."""
    connection = open_for_write(db)
    try:
        write_records(connection, synthetic_applicants(20, seed=seed))
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        write_records(connection, synthetic_applicants(20, seed=seed + 1))
    finally:
        connection.close()
    count: int = query_one(db, "SELECT count(*) FROM applicants")
    return count


def wait_for_total(server: Server, token: str, expected: int) -> list[int]:
    """Every total answered until it is `expected` (each request answered 200)."""
    seen = [total(server, token)]
    deadline = time.monotonic() + 30
    while seen[-1] != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        seen.append(total(server, token))
    return seen


def test_a_deleted_wal_index_is_followed_and_the_writes_since_are_answered(
    db: Path, token: str
) -> None:
    shm = Path(f"{db}-shm")
    with serve(db, "--rate-limit", "off", "--log-format", "json") as server:
        before = total(server, token)
        assert before == query_one(db, "SELECT count(*) FROM applicants")
        shm.unlink()
        expected = write_and_restart_the_wal(db, seed=1000)
        assert expected == before + 40
        seen = wait_for_total(server, token, expected)
        assert seen[-1] == expected, seen
        assert total(server, token) == expected
        assert server.process.poll() is None
        assert lines_saying(server, "WAL index", 1) == [
            f"the database's WAL index {shm} was deleted or replaced while serving: this "
            "server process opened its connections to the database again (reads in the "
            "second before may have missed the latest writes)"
        ]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_cut_wal_index_kills_a_worker_the_supervisor_names_it_and_starts_another(
    db: Path, token: str, workers: str
) -> None:
    """SIGBUS in SQLite's own mapping of the -shm: not catchable, so not survivable by
    the worker; its parent (uvicorn's supervisor for `--workers 2`, a fork's for one:
    leasestar/supervision.py) says so and serves on. Every worker replaced is named,
    and the answers then hold the writes made since.

    A worker usually dies at its next read of the index, a request's or its own
    background read (the webhook deliverer looks for subscriptions twice a second). One
    full run in six under load saw none die in 30 s: the file had been made long again
    (zero-filled, which SQLite takes for an index to rebuild) before either read it. So
    the test waits for a death or 20 answers, whichever comes first, and holds the
    server to naming exactly the workers that were replaced. (A CI run under load once
    saw two replaced and one named: the supervisor looked for dead workers before
    uvicorn's pass, which pings each for up to 5 s, and one died meanwhile. They are now
    named after that pass, from the exit status of each worker it replaced.)"""
    shm = Path(f"{db}-shm")
    with serve(db, "--rate-limit", "off", "--log-format", "json", "--workers", workers) as server:
        before = total(server, token)
        serving = set(children(server.process.pid))
        os.truncate(shm, 0)
        answers, deadline = 0, time.monotonic() + 30
        while (
            not lines_saying(server, "was killed by SIGBUS")
            and answers < 20
            and time.monotonic() < deadline
        ):
            with suppress(httpx.TransportError):  # (cut: a worker died under the request)
                total(server, token)
                answers += 1
            time.sleep(0.1)
        expected = write_and_restart_the_wal(db, seed=2000)
        assert expected == before + 40
        answered = None
        deadline = time.monotonic() + 60
        while answered != expected and time.monotonic() < deadline:
            try:
                answered = total(server, token)
            except httpx.TransportError:  # a worker killed while answering
                time.sleep(0.2)
        assert answered == expected
        assert server.process.poll() is None
        replaced = serving - set(children(server.process.pid))
        killed = lines_saying(server, "was killed by", len(replaced))
        # A line for each worker replaced, naming it and its signal: SIGBUS for the fault,
        # or SIGKILL where uvicorn's supervisor killed a worker that did not answer its
        # health check in time (under load).
        named = {int(line.split("[", 1)[1].split("]", 1)[0]) for line in killed}
        assert len(named) == len(killed), killed  # one line per worker
        assert named == replaced, (killed, replaced)
        for line in killed:
            assert "was killed by SIGKILL" in line or line.endswith(
                "was killed by SIGBUS (a file it had mapped was cut short: the database's "
                "-shm, SQLite's WAL index, or the database itself); starting another"
            )


def test_the_wal_index_check_leaves_an_untouched_database_alone(db: Path, token: str) -> None:
    """Reads over several checks with no fault: no line, and no reopening."""
    with serve(db, "--rate-limit", "off", "--log-format", "json") as server:
        for _ in range(3):
            assert total(server, token) == query_one(db, "SELECT count(*) FROM applicants")
            time.sleep(CHECK_WAIT)
        assert lines_saying(server, "WAL index") == []
    assert query_one(db, "PRAGMA quick_check") == "ok"


def test_a_worker_starting_on_a_damaged_file_clears_it_where_the_start_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker the supervisor starts again while serving opens the file as it is now:
    damaged since the server's start, it is ours to clear (one line). `leasestar serve`'s
    own first look refuses it: it may be another program's file."""
    path = tmp_path / "db-ratelimit"
    WindowCounter(path).close()
    os.truncate(path, 1000)
    with pytest.raises(DatabaseError, match="is not a leasestar rate-limit file"):
        WindowCounter(path)
    assert path.stat().st_size == 1000  # refused untouched
    with caplog.at_level(logging.WARNING, logger="leasestar.rate_limit"):
        counter = WindowCounter(path, fallback=True)
    try:
        assert counter.count("token", 5, 60)[0] == 1
    finally:
        counter.close()
    assert [record.getMessage() for record in caplog.records] == [
        f"rate-limit file {path} was cut to 1,000 of its {FILE_SIZE:,} bytes while serving: "
        "cleared it, every token's window starts again"
    ]
    assert path.stat().st_size == FILE_SIZE
