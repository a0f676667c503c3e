"""Every core, one set of rules (issue 11, part 2): a real `leasestar serve --workers N`.

Each request here is sent on a connection whose worker process is known: the test finds
the server side of its socket in /proc/net/tcp and the worker holding it in
/proc/<pid>/fd. So "the next request on the other worker" is a fact, not a hope, and
the rate limit, revocations, cursors, ETags and totals are checked across workers
request by request. A burst over many fresh connections checks the budget as clients
meet it.
"""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from leasestar.applicants.pipeline import write_records
from leasestar.database import open_for_write
from leasestar.rate_limit import WindowCounter, counter_path
from leasestar.seed.generator import synthetic_applicants
from leasestar.tokens import revoke_token
from tests.servers import children
from tests.test_hardening import Server, copy_database, new_token, query_one, serve
from tests.test_rate_limit import remaining

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc"),
]

WORKERS = 2
BUDGET = 30  # requests a minute per token
LIST = "/v1/applicants"
# A worker still starting up accepts nothing yet: look for each for up to this long.
FIND_WORKERS_SECONDS = 90.0


def descendants(pid: int) -> list[int]:
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def server_socket_inode(server_port: int, client_port: int) -> int | None:
    """The inode of the server's end of the loopback connection from `client_port`."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if (local_port, remote_port) == (server_port, client_port):
                return int(fields[9])
    return None


def process_holding(inode: int, pids: list[int]) -> int | None:
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") == target:
                    return pid
            except OSError:
                continue
    return None


class WorkerConnection:
    """A kept-alive connection and the worker process that accepted it."""

    def __init__(self, server: Server) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        self.get("/health")  # answered, so accepted: its socket now has an owner
        assert self.connection.sock is not None
        client_port = self.connection.sock.getsockname()[1]
        inode = server_socket_inode(server.port, client_port)
        assert inode is not None
        self.worker = process_holding(inode, descendants(server.process.pid))

    def get(self, target: str, token: str | None = None, **headers: str) -> httpx.Response:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self.connection.request("GET", target, headers=headers)
        answer = self.connection.getresponse()
        body = answer.read()
        return httpx.Response(answer.status, headers=answer.getheaders(), content=body)

    def close(self) -> None:
        self.connection.close()


def one_connection_per_worker(server: Server, workers: int) -> list[WorkerConnection]:
    """New connections until each of `workers` worker processes holds one (bounded)."""
    found: dict[int, WorkerConnection] = {}
    deadline = time.monotonic() + FIND_WORKERS_SECONDS
    while time.monotonic() < deadline:
        connection = WorkerConnection(server)
        if connection.worker is not None and connection.worker not in found:
            found[connection.worker] = connection
            if len(found) == workers:
                return list(found.values())
        else:
            connection.close()
            time.sleep(0.01)
    for connection in found.values():
        connection.close()
    raise AssertionError(f"in {FIND_WORKERS_SECONDS} s connections reached {len(found)} workers")


@pytest.fixture(scope="module")
def workers_db(tmp_path_factory: pytest.TempPathFactory, seeded_template: Path) -> Path:
    return copy_database(seeded_template, tmp_path_factory.mktemp("workers") / "workers.db")


@pytest.fixture(scope="module")
def server(workers_db: Path) -> Iterator[Server]:
    flags = ("--workers", str(WORKERS), "--rate-limit", f"{BUDGET}/minute", "--log-format", "off")
    with serve(workers_db, *flags) as running:
        yield running


@pytest.fixture
def pair(server: Server) -> Iterator[list[WorkerConnection]]:
    connections = one_connection_per_worker(server, WORKERS)
    yield connections
    for connection in connections:
        connection.close()


def test_one_budget_per_token_whichever_worker_answers(
    pair: list[WorkerConnection], workers_db: Path
) -> None:
    token = new_token(workers_db, "alternating")
    answers = [pair[n % WORKERS].get(f"{LIST}?limit=1", token) for n in range(2 * BUDGET)]
    statuses = [answer.status_code for answer in answers]
    assert statuses == [200] * BUDGET + [429] * BUDGET
    left = [remaining(answer) for answer in answers]
    assert left == [*range(BUDGET - 1, -1, -1)] + [0] * BUDGET


def test_a_burst_on_fresh_connections_gets_exactly_the_budget(
    server: Server, workers_db: Path
) -> None:
    token = new_token(workers_db, "burst")

    def fresh_request(_: int) -> int:
        headers = {"Authorization": f"Bearer {token}", "Connection": "close"}
        return httpx.get(
            f"{server.base_url}{LIST}?limit=1", headers=headers, timeout=30
        ).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(fresh_request, range(3 * BUDGET)))
    assert statuses.count(200) == BUDGET
    assert statuses.count(429) == 2 * BUDGET


def test_a_revoked_token_is_refused_by_every_worker_on_its_next_request(
    pair: list[WorkerConnection], workers_db: Path
) -> None:
    token = new_token(workers_db, "revoked-soon")
    assert [c.get(f"{LIST}?limit=1", token).status_code for c in pair] == [200] * WORKERS
    connection = open_for_write(workers_db)
    try:
        revoke_token(connection, "revoked-soon")
    finally:
        connection.close()
    assert [c.get(f"{LIST}?limit=1", token).status_code for c in pair] == [401] * WORKERS


def test_cursors_etags_and_totals_agree_across_workers(
    pair: list[WorkerConnection], workers_db: Path
) -> None:
    token = new_token(workers_db, "agreeing")
    first, second = pair
    page = first.get(f"{LIST}?limit=7&order-by=last_name", token)
    cursor = page.json()["meta"]["next"]
    after_first = first.get(f"{LIST}?cursor={cursor}", token)
    after_second = second.get(f"{LIST}?cursor={cursor}", token)
    assert (after_first.status_code, after_second.status_code) == (200, 200)
    assert after_first.content == after_second.content
    etag = page.headers["etag"]
    revalidated = second.get(f"{LIST}?limit=7&order-by=last_name", token, **{"If-None-Match": etag})
    assert revalidated.status_code == 304
    # A write by another program: each worker's next total counts it.
    connection = open_for_write(workers_db)
    try:
        write_records(connection, synthetic_applicants(5, seed=404))
    finally:
        connection.close()
    expected = query_one(workers_db, "SELECT count(*) FROM applicants")
    totals = [c.get(f"{LIST}?limit=1", token).json()["meta"]["total"] for c in pair]
    assert totals == [expected] * WORKERS
    stale = second.get(f"{LIST}?limit=7&order-by=last_name", token, **{"If-None-Match": etag})
    assert stale.status_code == 200


def test_the_counts_live_in_a_file_beside_the_database(
    pair: list[WorkerConnection], workers_db: Path
) -> None:
    token = new_token(workers_db, "spent")
    for n in range(BUDGET):
        assert pair[n % WORKERS].get(f"{LIST}?limit=1", token).status_code == 200
    # A third process opening the file finds the token's budget spent.
    counter = WindowCounter(counter_path(workers_db))
    try:
        requests, _ = counter.count("spent", BUDGET, 60)  # a token is counted by its name
    finally:
        counter.close()
    assert requests == BUDGET + 1
    assert [c.get(f"{LIST}?limit=1", token).status_code for c in pair] == [429] * WORKERS


@pytest.mark.skipif(
    (os.cpu_count() or 1) > 8, reason="--workers auto would start a worker per core, over 8 here"
)
def test_workers_auto_runs_one_per_core_with_one_budget(
    tmp_path: Path, seeded_template: Path
) -> None:
    cores = os.cpu_count() or 1
    db = copy_database(seeded_template, tmp_path / "auto.db")
    token = new_token(db, "auto")
    with serve(db, "--workers", "auto", "--rate-limit", "10/minute", "--log-format", "off") as s:
        connections = one_connection_per_worker(s, cores)
        try:
            statuses = [
                connections[n % cores].get(f"{LIST}?limit=1", token).status_code for n in range(20)
            ]
        finally:
            for connection in connections:
                connection.close()
    assert statuses == [200] * 10 + [429] * 10
