"""The whole list as one NDJSON stream, over a real server and real sockets.

Each stream is compared with what the JSON list serves page by page (the list itself is
checked against Python-sorted expectations elsewhere) and with the database read
directly, so a stream that drops, repeats, reorders or leaks a record fails here.
"""

from __future__ import annotations

import gzip
import sqlite3
import subprocess
import sys
from pathlib import Path

import brotli
import httpx
import msgspec
import pytest

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]

from tests.applicants.conftest import SCOPE, Server, client_of
from tests.servers import clean_env

pytestmark = pytest.mark.e2e

NDJSON = {"Accept": "application/x-ndjson"}


class RawPage(msgspec.Struct):
    meta: dict[str, object]
    results: list[msgspec.Raw]


def _paged_results(client: httpx.Client, params: dict[str, str]) -> list[bytes]:
    """Every record of the JSON list, exactly as its pages carry them, by cursor."""
    found: list[bytes] = []
    response = client.get("/v1/applicants", params={**params, "limit": "250"})
    while True:
        assert response.status_code == 200, response.text
        page = msgspec.json.decode(response.content, type=RawPage)
        found.extend(bytes(raw) for raw in page.results)
        cursor = page.meta.get("next")
        if not page.meta["hasMore"] or not isinstance(cursor, str):
            return found
        response = client.get("/v1/applicants", params={"cursor": cursor})


def _split(body: bytes) -> tuple[list[bytes], list[int]]:
    """(record lines, changeSeq position lines) of a stream body."""
    if not body:
        return [], []
    assert body.endswith(b"\n")
    records: list[bytes] = []
    positions: list[int] = []
    for line in body[:-1].split(b"\n"):
        if line.startswith(b'{"changeSeq":'):
            positions.append(msgspec.json.decode(line)["changeSeq"])
        else:
            records.append(line)
    return records, positions


QUERIES = [
    {},
    {"order-by": "last_name:asc,first_name:desc"},
    {"order-by": ""},
    {"property_id": "prop_entrata_01_011"},
    {"updated_at_gte": "2024-01-01", "order-by": "updated_at:asc"},
    {"integration_vendor": "RESMAN", "order-by": "x_id:desc"},
    {"changed_since": "0"},
    {"changed_since": "0", "integration_id": "int_mri_01"},
]


@pytest.mark.parametrize("params", QUERIES, ids=lambda p: "&".join(p))
@pytest.mark.parametrize("scoped", [False, True], ids=["all", "scoped"])
def test_a_stream_is_the_json_lists_results_line_by_line(
    live_server: Server, params: dict[str, str], scoped: bool
) -> None:
    with client_of(live_server, live_server.scoped_token if scoped else None) as client:
        expected = _paged_results(client, params)
        response = client.get("/v1/applicants", params=params, headers=NDJSON)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    records, positions = _split(response.content)
    assert records == expected
    assert expected or scoped  # unscoped, every query above matches something
    if "changed_since" in params:
        # After each batch and at the end: the change sequence of the last record sent.
        # (an empty sync stream still says where it stands: one line, changed_since)
        assert len(positions) == max(1, -(-len(records) // 1000))
        assert positions == sorted(positions)
    else:
        assert positions == []


def test_a_scoped_stream_holds_exactly_the_scopes_records(live_server: Server) -> None:
    with sqlite3.connect(live_server.path) as connection:
        wanted = {row[0] for row in connection.execute(
            "SELECT id FROM applicants WHERE integration_id = ?", (SCOPE,)
        )}  # fmt: skip
    with client_of(live_server, live_server.scoped_token) as client:
        response = client.get("/v1/applicants", headers=NDJSON)
    records, _ = _split(response.content)
    streamed = [msgspec.json.decode(line) for line in records]
    assert {record["id"] for record in streamed} == wanted
    assert len(streamed) == len(wanted)
    assert {record["integration_id"] for record in streamed} == {SCOPE}


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_a_compressed_stream_decodes_to_the_same_bytes(live_server: Server, encoding: str) -> None:
    with client_of(live_server) as client:
        plain = client.get("/v1/applicants", headers=NDJSON).content
        with client.stream(
            "GET", "/v1/applicants", headers={**NDJSON, "Accept-Encoding": encoding}
        ) as compressed:
            sent = b"".join(compressed.iter_raw())  # the body as sent, not decoded
    assert compressed.headers["content-encoding"] == encoding
    assert len(sent) < len(plain) * 0.3
    decoded = {
        "gzip": gzip.decompress,
        "br": brotli.decompress,
        "zstd": zstd.decompress,
    }[encoding](sent)
    assert decoded == plain


@pytest.mark.parametrize(
    ("name", "value"), [("limit", "10"), ("offset", "5"), ("cursor", "abc"), ("wait", "5")]
)
def test_paging_parameters_are_refused_with_a_stream(
    live_server: Server, name: str, value: str
) -> None:
    with client_of(live_server) as client:
        response = client.get(
            "/v1/applicants", params={name: value, "changed_since": "0"}, headers=NDJSON
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"] == {"parameter": name, "value": value}
    assert name in error["message"]


def test_json_is_served_when_the_client_prefers_it(live_server: Server) -> None:
    with client_of(live_server) as client:
        for accept in ("application/json", "application/json, application/x-ndjson;q=0.5", "*/*"):
            response = client.get("/v1/applicants", headers={"Accept": accept})
            assert response.headers["content-type"] == "application/json", accept
        response = client.get(
            "/v1/applicants", headers={"Accept": "application/json;q=0.1, application/x-ndjson"}
        )
        assert response.headers["content-type"] == "application/x-ndjson"


def _sequences(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as connection:
        return dict(connection.execute("SELECT id, change_seq FROM applicants"))


@pytest.mark.parametrize("encoding", ["identity", "gzip", "br"])
def test_a_cut_sync_stream_resumes_from_its_last_position(
    live_server: Server, encoding: str
) -> None:
    sequences = _sequences(live_server.path)
    received = b""
    with (
        client_of(live_server) as client,
        client.stream(
            "GET",
            "/v1/applicants",
            params={"changed_since": "0"},
            headers={**NDJSON, "Accept-Encoding": encoding},
        ) as response,
    ):
        assert response.headers.get("content-encoding", "identity") == encoding
        for chunk in response.iter_bytes(4096):
            received += chunk
            if received.count(b"\n") >= 1_500:
                break  # the client goes away in the middle of the second batch
    # What a client keeps of a cut stream: its complete lines, up to the last position.
    complete = received[: received.rindex(b"\n") + 1]
    records, positions = _split(complete)
    assert positions, "the first batch ends with a position line"
    position = positions[-1]
    kept = {msgspec.json.decode(line)["id"] for line in records[:1000]}
    assert all(sequences[record_id] <= position for record_id in kept)
    with client_of(live_server) as client:
        resumed = client.get(
            "/v1/applicants", params={"changed_since": str(position)}, headers=NDJSON
        )
    rest, rest_positions = _split(resumed.content)
    rest_ids = [msgspec.json.decode(line)["id"] for line in rest]
    # Exactly what the client lacked: the records written after its position, once each.
    assert sorted(rest_ids) == sorted(i for i, seq in sequences.items() if seq > position)
    assert kept | set(rest_ids) == set(sequences)
    assert not kept & set(rest_ids)
    assert rest_positions[-1] == max(sequences.values())


def test_a_stream_reads_one_snapshot_while_an_import_commits(
    live_server: Server, tmp_path: Path
) -> None:
    """The import commits while the stream is open, and the stream serves only the
    records as they were when it started: no mix of before and after."""
    with client_of(live_server) as client:
        before = client.get("/v1/applicants", params={"order-by": ""}, headers=NDJSON).content
    # Every record again, with new names: an import that rewrites all of them.
    changed = tmp_path / "changed.ndjson"
    lines = []
    for line in before.splitlines():
        record = msgspec.json.decode(line)
        record["first_name"] = "Renamed"
        lines.append(msgspec.json.encode(record))
    changed.write_bytes(b"\n".join(lines) + b"\n")
    received = b""
    with (
        client_of(live_server) as client,
        client.stream("GET", "/v1/applicants", params={"order-by": ""}, headers=NDJSON) as stream,
    ):
        chunks = stream.iter_bytes(65_536)
        received += next(chunks)  # the stream has begun: its snapshot is taken
        importer = subprocess.run(
            [
                sys.executable,
                "-m",
                "leasestar",
                "import",
                "--db",
                str(live_server.path),
                str(changed),
            ],
            capture_output=True,
            timeout=120,
            env=clean_env(),
            check=False,
        )
        for chunk in chunks:
            received += chunk
    assert importer.returncode == 0, importer.stderr
    assert received == before
    with client_of(live_server) as client:
        after = client.get("/v1/applicants", params={"order-by": ""}, headers=NDJSON).content
    assert after != before
    assert all(msgspec.json.decode(line)["first_name"] == "Renamed" for line in after.splitlines())
