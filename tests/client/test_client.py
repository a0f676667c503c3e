"""leasestar.client against a real server (`leasestar serve` on a free port).

Expected values are read from the database file with plain sqlite3, never from the
client or the server code: the ids a walk must find, the sequence a sync must reach.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from leasestar.applicants.pipeline import write_records
from leasestar.client import (
    Applicant,
    AsyncClient,
    Client,
    InvalidRequest,
    NotFound,
    RateLimited,
    Unauthorized,
)
from leasestar.database import open_for_write
from leasestar.seed.generator import synthetic_applicants
from tests.json_body import register_json_body
from tests.test_hardening import (
    ROOT,
    Server,
    copy_database,
    leasestar_command,
    new_token,
    serve,
)

pytestmark = pytest.mark.e2e
SERVICE_FIELDS = ("id", "created_at", "updated_at", "last_seen")


def ids_where(db: Path, where: str = "1", *params: object) -> list[str]:
    connection = sqlite3.connect(db)
    try:
        rows = connection.execute(f"SELECT id FROM applicants WHERE {where}", params)
        return sorted(row[0] for row in rows)
    finally:
        connection.close()


def ids_ordered(db: Path, order: str) -> list[str]:
    """Every id in this SQL order (BINARY: code point order, the API's; nulls first)."""
    connection = sqlite3.connect(db)
    try:
        return [row[0] for row in connection.execute(f"SELECT id FROM applicants ORDER BY {order}")]
    finally:
        connection.close()


def max_change_seq(db: Path) -> int:
    connection = sqlite3.connect(db)
    try:
        return int(connection.execute("SELECT max(change_seq) FROM applicants").fetchone()[0])
    finally:
        connection.close()


def source_lines(db: Path, where: str, first_name: str) -> list[bytes]:
    """Import lines that rewrite the matching records with a new first name (the upsert
    key kept, the service fields left to the import)."""
    connection = sqlite3.connect(db)
    register_json_body(connection)
    try:
        bodies = [
            row[0]
            for row in connection.execute(f"SELECT json_body(body) FROM applicants WHERE {where}")
        ]
    finally:
        connection.close()
    lines = []
    for body in bodies:
        record = json.loads(body)
        for field in SERVICE_FIELDS:
            del record[field]
        record["first_name"] = first_name
        lines.append(json.dumps(record).encode())
    return lines


def new_lines(count: int, prefix: str) -> list[bytes]:
    return [
        json.dumps(
            {
                "x_id": f"{prefix}-{n}",
                "x_property_id": "NEW-P001",
                "property_id": "prop_new_001",
                "integration_id": "int_entrata_01",
                "integration_vendor": "ENTRATA",
                "phone_1": "(512) 555-0100",
                "phone_1_type": "MOBILE",
            }
        ).encode()
        for n in range(count)
    ]


def run_import(db: Path, lines: list[bytes]) -> None:
    """`leasestar import` in its own process: the writer a deployment runs."""
    source = db.with_name("import.ndjson")
    source.write_bytes(b"\n".join(lines) + b"\n")
    result = subprocess.run(
        [*leasestar_command(), "import", "--db", str(db), str(source)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture
def served(tmp_path: Path, seeded_template: Path) -> Iterator[tuple[Server, Path, str]]:
    """A server of its own per test (the tests write), its database and a token."""
    db = copy_database(seeded_template, tmp_path / "leasestar.db")
    token = new_token(db, "client")
    with serve(db, "--log-format", "json", "--rate-limit", "off", metrics=True) as server:
        yield server, db, token


RECORD_ROUTE = "/v1/applicants/{id}"
LIST_ROUTE = "/v1/applicants"


def statuses(server: Server, route: str) -> Counter[int]:
    """How many answers of each status the server gave on `route`, from its /metrics."""
    assert server.metrics_url is not None
    text = httpx.get(server.metrics_url, timeout=10).text
    counts: Counter[int] = Counter()
    for line in text.splitlines():
        match = re.fullmatch(r"leasestar_http_requests_total\{(.*)\} ([0-9.e+]+)", line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
        if labels["route"] == route and labels["method"] == "GET":
            counts[int(labels["status"])] += int(float(match[2]))
    return counts


def test_a_list_walks_every_match_by_cursor(served: tuple[Server, Path, str]) -> None:
    server, db, token = served
    with Client(server.base_url, token) as client:
        walked = [a.id for a in client.applicants.list(limit=7, order_by="last_name,first_name")]
        assert sorted(walked) == ids_where(db)
        assert len(walked) == len(set(walked))
        prop = ids_where(db)[0]
        property_id = client.applicants.get(prop).property_id
        mine = [a.id for a in client.applicants.list(property_id=property_id, limit=2)]
        assert sorted(mine) == ids_where(db, "property_id = ?", property_id)
        pages = list(client.applicants.pages(limit=100))
        assert [len(page.results) for page in pages] == [100, 100, 100]
        assert pages[-1].meta.has_more is False


def test_get_revalidates_with_the_etag(served: tuple[Server, Path, str]) -> None:
    server, db, token = served
    applicant_id = ids_where(db)[5]
    with Client(server.base_url, token) as client:
        first = client.applicants.get(applicant_id)
        again = client.applicants.get(applicant_id)
    assert first == again
    assert first.id == applicant_id
    assert statuses(server, RECORD_ROUTE) == {200: 1, 304: 1}


def test_errors_are_typed(served: tuple[Server, Path, str]) -> None:
    server, _, token = served
    with Client(server.base_url, token) as client:
        with pytest.raises(InvalidRequest) as invalid:
            next(client.applicants.list(limit=0))
        assert (invalid.value.status, invalid.value.code) == (400, "invalid_request")
        assert invalid.value.details.parameter == "limit"
        assert invalid.value.details.value == "0"
        assert invalid.value.request_id
        with pytest.raises(NotFound) as missing:
            client.applicants.get("no-such-applicant")
        assert missing.value.code == "not_found"
    with Client(server.base_url, "not-a-token") as stranger, pytest.raises(Unauthorized):
        stranger.applicants.get("anything")


def test_a_walk_while_an_import_lands(served: tuple[Server, Path, str]) -> None:
    """Records that exist throughout the walk come exactly once, though the import
    rewrites some of them (the default order, created_at, is kept by a rewrite) and
    adds others between two pages."""
    server, db, token = served
    before = ids_where(db)
    with Client(server.base_url, token) as client:
        walk = client.applicants.list(limit=20)
        seen = [next(walk).id for _ in range(50)]
        run_import(db, source_lines(db, "rowid % 3 = 0", "Rewritten") + new_lines(40, "mid"))
        seen += [applicant.id for applicant in walk]
    counts = Counter(seen)
    assert all(counts[applicant_id] == 1 for applicant_id in before)
    assert max(counts.values()) == 1
    assert len(ids_where(db)) == len(before) + 40


SYNC_AND_DIE = """
import signal, os, sys
from leasestar.client import Client
base_url, token, state = sys.argv[1:4]
with Client(base_url, token) as client:
    feed = client.applicants.changes(since=0, limit=20)
    with open(state, "a") as out:
        for taken, applicant in enumerate(feed, 1):
            out.write(f"{feed.change_seq} {applicant.id}\\n")
            out.flush()
            if taken == 75:  # mid-page: stopped without warning
                os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_sync_resumes_after_the_client_is_stopped(
    served: tuple[Server, Path, str], tmp_path: Path
) -> None:
    server, db, token = served
    state = tmp_path / "sync.state"
    stopped = subprocess.run(
        [sys.executable, "-c", SYNC_AND_DIE, server.base_url, token, str(state)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert stopped.returncode == -signal.SIGKILL, stopped.stderr
    taken = [line.split() for line in state.read_text().splitlines()]
    assert len(taken) == 75
    kept = int(taken[-1][0])  # what the stopped client last stored
    assert 0 < kept < max_change_seq(db)
    # Writes land while it is stopped: rewrites of records already taken, new records.
    rewritten = ids_where(db, "rowid <= 30")
    run_import(db, source_lines(db, "rowid <= 30", "Resumed") + new_lines(25, "late"))
    with Client(server.base_url, token) as client:
        feed = client.applicants.changes(since=kept, limit=20)
        resumed = {applicant.id: applicant for applicant in feed}
        # Nothing is lost: every record is in the first run or the resumed one, and the
        # resumed one has every rewrite, as it is now.
        assert {applicant_id for _, applicant_id in taken} | resumed.keys() == set(ids_where(db))
        assert all(resumed[applicant_id].first_name == "Resumed" for applicant_id in rewritten)
        # Records taken after the last kept sequence (the part page) come again.
        assert {applicant_id for seq, applicant_id in taken if int(seq) == kept} <= set(resumed)
        assert feed.change_seq == max_change_seq(db)
        # Caught up: from the sequence handed back there is nothing new.
        idle = client.applicants.changes(since=feed.change_seq)
        assert list(idle) == []
        assert idle.change_seq == feed.change_seq


@pytest.fixture
def big_served(tmp_path: Path) -> Iterator[tuple[Server, Path, str]]:
    """2,500 applicants: a streamed sync marks its sequence after each 1,000."""
    db = tmp_path / "leasestar.db"
    connection = open_for_write(db)
    try:
        write_records(connection, synthetic_applicants(2500, seed=11))
    finally:
        connection.close()
    token = new_token(db, "streams")
    with serve(db, "--rate-limit", "off") as server:
        yield server, db, token


def seq_at(db: Path, position: int) -> int:
    """The change sequence of the `position`-th record (1-based) in change order."""
    connection = sqlite3.connect(db)
    try:
        return int(
            connection.execute(
                "SELECT change_seq FROM applicants ORDER BY change_seq LIMIT 1 OFFSET ?",
                (position - 1,),
            ).fetchone()[0]
        )
    finally:
        connection.close()


def test_a_streamed_sync_cut_short_resumes_from_its_last_mark(
    big_served: tuple[Server, Path, str],
) -> None:
    server, db, token = big_served
    in_change_order = ids_ordered(db, "change_seq")
    with Client(server.base_url, token) as client:
        feed = client.applicants.changes(stream=True, limit=50)  # no page size in a stream
        taken = []
        for applicant in feed:
            taken.append(applicant.id)
            if len(taken) == 1500:
                break  # the consumer stops: the stream is cut
        assert taken == in_change_order[:1500]
        assert feed.change_seq == seq_at(db, 1000)  # the last mark it received
        rest = client.applicants.changes(since=feed.change_seq, stream=True)
        resumed = [applicant.id for applicant in rest]
        assert resumed == in_change_order[1000:]
        assert rest.change_seq == max_change_seq(db)
        # A streamed list: every match, in the order asked, in one answer.
        streamed = [a.id for a in client.applicants.stream(order_by="last_name,first_name")]
        assert streamed == ids_ordered(db, "last_name, first_name, id")
        with pytest.raises(InvalidRequest) as refused:
            next(client.applicants.stream(limit=5))  # type: ignore[call-arg]
        assert refused.value.details.parameter == "limit"


def test_a_long_poll_answers_with_the_write_it_waited_for(
    served: tuple[Server, Path, str],
) -> None:
    server, db, token = served
    since = max_change_seq(db)
    with Client(server.base_url, token) as client:
        idle = client.applicants.changes(since=since, wait=1)
        assert list(idle) == []
        assert idle.change_seq == since
        # The import lands before or during the poll: either way the poll returns it.
        writer = threading.Thread(target=run_import, args=(db, new_lines(3, "polled")))
        writer.start()
        try:
            feed = client.applicants.changes(since=since, wait=30)
            polled = [applicant.x_id for applicant in feed]
        finally:
            writer.join(timeout=120)
    assert sorted(polled) == [f"polled-{n}" for n in range(3)]
    assert feed.change_seq == max_change_seq(db)


async def test_the_async_client(served: tuple[Server, Path, str]) -> None:
    server, db, token = served
    async with AsyncClient(server.base_url, token) as client:
        walked = [applicant.id async for applicant in client.applicants.list(limit=50)]
        assert sorted(walked) == ids_where(db)
        one = await client.applicants.get(walked[0])
        assert one.id == walked[0]
        assert await client.applicants.get(walked[0]) == one
        feed = client.applicants.changes(limit=120)
        synced = [applicant.id async for applicant in feed]
        assert sorted(synced) == ids_where(db)
        assert feed.change_seq == max_change_seq(db)
        streamed = [applicant.id async for applicant in client.applicants.stream()]
        assert sorted(streamed) == ids_where(db)
        streamed_sync = client.applicants.changes(since=0, stream=True)
        assert [a.id async for a in streamed_sync] == ids_ordered(db, "change_seq")
        assert streamed_sync.change_seq == max_change_seq(db)
        with pytest.raises(InvalidRequest) as invalid:
            await client.applicants.list(order_by="nope").__anext__()
        assert invalid.value.details.parameter == "order-by"
    assert statuses(server, RECORD_ROUTE) == {200: 1, 304: 1}


def test_fields_narrow_the_records_the_client_decodes(served: tuple[Server, Path, str]) -> None:
    server, db, token = served
    fields = ("pets", "last_name", "id", "created_at")  # kept in the record's order
    in_order = ["id", "created_at", "last_name", "pets"]
    with Client(server.base_url, token) as client:
        whole = {applicant.id: applicant for applicant in client.applicants.list(limit=250)}
        narrowed = list(client.applicants.list(fields=fields, limit=40))
        assert sorted(record.id for record in narrowed) == ids_where(db)
        for record in narrowed:
            members = msgspec.structs.asdict(record)
            assert list(members) == in_order
            assert members == {name: getattr(whole[record.id], name) for name in in_order}
        pages = list(client.applicants.pages(fields=["id"], limit=100))
        assert [len(page.results) for page in pages] == [100, 100, 100]
        first = narrowed[0].id
        one = client.applicants.get(first, fields=["last_name", "updated_at"])
        assert msgspec.structs.asdict(one) == {
            "updated_at": whole[first].updated_at,
            "last_name": whole[first].last_name,
        }
        streamed = [record.id for record in client.applicants.stream(fields=["id"])]
        assert sorted(streamed) == ids_where(db)
        with pytest.raises(InvalidRequest) as refused:
            next(client.applicants.list(fields=["nickname"]))
        assert refused.value.details.parameter == "fields"


async def test_the_async_client_narrows_too(served: tuple[Server, Path, str]) -> None:
    server, db, token = served
    async with AsyncClient(server.base_url, token) as client:
        walked = [r.id async for r in client.applicants.list(fields=["id"], limit=70)]
        assert sorted(walked) == ids_where(db)
        one = await client.applicants.get(walked[0], fields=["email_1"])
        assert list(msgspec.structs.asdict(one)) == ["email_1"]
        streamed = [r.id async for r in client.applicants.stream(fields=["id", "zip"])]
        assert sorted(streamed) == ids_where(db)


def test_a_429_is_waited_out(tmp_path: Path, seeded_template: Path) -> None:
    db = copy_database(seeded_template, tmp_path / "leasestar.db")
    token = new_token(db, "limited")
    with serve(db, "--log-format", "json", "--rate-limit", "4/second", metrics=True) as server:
        with Client(server.base_url, token) as client:
            walked = [applicant.id for applicant in client.applicants.list(limit=25)]
        assert sorted(walked) == ids_where(db)
        assert statuses(server, LIST_ROUTE)[429] > 0
        with Client(server.base_url, token, max_retries=0) as impatient:
            refused = None
            for _ in range(10):  # 4 a second: some of 10 in a row are refused
                try:
                    impatient.applicants.get(walked[0])
                except RateLimited as error:
                    refused = error
                    break
        assert refused is not None
        assert (refused.status, refused.code) == (429, "rate_limited")
        assert refused.retry_after is not None
        assert refused.retry_after > 0


def test_the_record_structs_decode_what_is_served(served: tuple[Server, Path, str]) -> None:
    server, db, token = served
    with Client(server.base_url, token) as client:
        applicant = client.applicants.get(ids_where(db)[0])
    connection = sqlite3.connect(db)
    register_json_body(connection)
    try:
        (body,) = connection.execute(
            "SELECT json_body(body) FROM applicants WHERE id = ?", (applicant.id,)
        ).fetchone()
    finally:
        connection.close()
    # Every field, as stored; instants as the datetimes their text names.
    assert msgspec.json.decode(body, type=Applicant) == applicant
    assert list(msgspec.structs.asdict(applicant)) == list(json.loads(body))


def test_the_readme_example_runs(
    served: tuple[Server, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's example, pasted: only the URL, token and id filled in."""
    server, db, token = served
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### The Python client") :]
    example = section[section.index("```python\n") + 10 :]
    example = example[: example.index("```")]
    example = (
        example.replace("http://127.0.0.1:8000", server.base_url)
        .replace("lst_...", token)
        .replace("app_...", ids_where(db)[0])
    )
    exec(compile(example, "README.md", "exec"), {})  # our own README, with our values
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "invalid_request limit 0"
    assert printed[-2] == f"store {max_change_seq(db)}"
    assert sum(line.startswith("upsert ") for line in printed) == len(ids_where(db))
    on_property = ids_where(db, "property_id = ?", "prop_mri_02_018")
    assert on_property
    assert sorted(line.split()[0] for line in printed[: len(on_property)]) == on_property
