"""The benchmarks' databases: `WORK/applicants-N.db`, seeded once with `leasestar seed
--count N --seed 0` and reused while schema and generator match; tokens, copies, readers.
`python benchmarks/databases.py`: their size against their export (issue 15.4)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import provenance
from harness import LEASESTAR, say
from provenance import ROOT, WORK, shown

from leasestar.applicants import copy_file
from leasestar.applicants.records import Applicant
from leasestar.database import PAGE_SIZE, READ_PRAGMAS
from leasestar.seed.generator import synthetic_applicants


def read_only(path: Path) -> sqlite3.Connection:
    """Read-only, set up as the server's (a floor must not lack the server's page cache)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    for pragma in READ_PRAGMAS:
        connection.execute(pragma)
    return connection


def data_fingerprint() -> str:
    """The schema, the page size and the generator's output (not its source: a faster
    generator making the same records costs no reseed of a million rows)."""
    digest = hashlib.sha256((ROOT / "schema.sql").read_bytes())
    digest.update(b"page size %d" % PAGE_SIZE)  # a new database's: the file's layout
    for record in synthetic_applicants(200, 0):
        digest.update(msgspec.json.encode(record))
    return digest.hexdigest()[:16]


def _seeding_elsewhere(partial: Path) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(partial).encode() in cmdline.read_bytes().split(b"\0"):
                return True
    return False


def ensure_database(rows: int, work: Path = WORK) -> Path:
    """`work/applicants-N.db`, seeded unless it holds N rows of the current fingerprint."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"applicants-{rows}.db"
    stamp, partial = (path.with_name(path.name + suffix) for suffix in (".fingerprint", ".partial"))
    fingerprint = data_fingerprint()
    while not path.exists() and _seeding_elsewhere(partial):
        say(f"{partial.name} is being seeded by another run; waiting for it")
        time.sleep(15)
    if path.exists():
        found, built_from = -1, stamp.read_text().strip() if stamp.exists() else ""
        with contextlib.suppress(sqlite3.Error), contextlib.closing(read_only(path)) as db:
            found = int(db.execute("SELECT count(*) FROM applicants").fetchone()[0])
        if found == rows and built_from == fingerprint:
            say(f"reusing {shown(path)} ({rows:,} applicants)")
            return path
        say(f"{path.name}: {found:,} rows, schema/generator {built_from or '?'}: rebuilding it")
    stamp.unlink(missing_ok=True)
    remove_database(path)
    remove_database(partial)
    say(f"seeding {rows:,} applicants into {shown(path)} (leasestar seed)")
    started = time.monotonic()
    subprocess.run(
        [str(LEASESTAR), "seed", "--db", str(partial), "--count", str(rows), "--seed", "0"],
        check=True,
        stdout=sys.stderr.fileno(),  # its summary with the progress: stdout is for reports
    )
    partial.rename(path)
    # The columnar copy's file the seed wrote beside it (named after the database), if it
    # could: without it the first server would build it at its start.
    if copy_file.path_of(partial).exists():
        copy_file.path_of(partial).rename(copy_file.path_of(path))
    remove_database(partial)  # what the seed left beside it under that name
    stamp.write_text(fingerprint + "\n")
    say(f"seeded {rows:,} in {time.monotonic() - started:.0f} s")
    return path


def remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-webhooks.lock", "-columns", "-columns.lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def workspace(rows: int, work: Path, name: str) -> tuple[Path, Path, str]:
    """`work/NAME/`, a copy of the N-row database in it (`bench.db`) and a token for it."""
    here = work / name
    here.mkdir(parents=True, exist_ok=True)
    say(f"copying applicants-{rows}.db into {shown(here)}")
    db = here / "bench.db"
    remove_database(db)
    with (
        contextlib.closing(read_only(ensure_database(rows, work))) as source,
        contextlib.closing(sqlite3.connect(db)) as copy,
    ):
        source.backup(copy)
    return here, db, create_token(db, name)


def change_seq(db: Path | sqlite3.Connection) -> int:
    """The last committed change's sequence (a connection kept open where it is polled)."""
    if isinstance(db, sqlite3.Connection):
        return int(db.execute("SELECT change_seq FROM sync_state").fetchone()[0])
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        return change_seq(connection)


def first_ids(db: Path, count: int, file: Path | None = None) -> list[str]:
    """The first `count` ids of the table (written one a line to `file`, for wrk.lua)."""
    with contextlib.closing(read_only(db)) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM applicants LIMIT ?", (count,))]
    if file is not None:
        file.write_text("\n".join(ids) + "\n")
    return ids


def create_token(db: Path, purpose: str, *integrations: str) -> str:
    name = f"bench-{purpose}-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
    command = [str(LEASESTAR), "token", "create", "--db", str(db), "--name", name]
    for integration in integrations:
        command += ["--integration", integration]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"leasestar token create --name {name}: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def ndjson(count: int, seed: int, changed: str = "") -> bytes:
    """`count` generated records, one a line; `changed`: their `notes` set to it and their
    `x_id`, so that importing them rewrites every row."""
    encode = msgspec.json.Encoder().encode

    def line(record: Applicant) -> bytes:
        if changed:
            record = msgspec.structs.replace(record, notes=f"{changed} {record.x_id}")
        return encode(record) + b"\n"

    return b"".join(line(record) for record in synthetic_applicants(count, seed=seed))


def import_files(here: Path, count: int, seed: int, *changes: str) -> list[Path]:
    """Files A, B, ... of `ndjson(count, seed, change)`, one per change, for `leasestar import`."""
    files = [here / f"import-{count}-{chr(ord('a') + n)}.ndjson" for n in range(len(changes))]
    say(f"writing {len(files)} import files of {count:,} applicants")
    for file, changed in zip(files, changes, strict=True):
        file.write_bytes(ndjson(count, seed, changed))
    return files


def storage_size(db: Path) -> tuple[int, int, dict[str, int], float]:
    """(file bytes, export bytes, table or index -> bytes of its pages, largest first, the
    mean bytes of a stored body, compressed: leasestar/applicants/bodies.py)."""
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    with tempfile.TemporaryDirectory(dir=db.parent) as scratch:
        out = Path(scratch) / "export.ndjson"
        command = [str(LEASESTAR), "export", "--db", str(db), str(out)]
        subprocess.run(command, check=True, capture_output=True)
        exported = out.stat().st_size
    with contextlib.closing(read_only(db)) as connection:
        sql = "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
        objects = {str(name): int(size) for name, size in connection.execute(sql)}
        sql = "SELECT avg(length(CAST(body AS BLOB))) FROM applicants"
        (body,) = connection.execute(sql).fetchone()
    return db.stat().st_size, exported, objects, float(body or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description="the databases against their export")
    smoke = {"rows": [2_000, 10_000]}
    args, outputs = provenance.options(parser, smoke, rows=[100_000, 1_000_000], out="--results")
    found = [(n, *storage_size(ensure_database(n, outputs.work))) for n in args.rows]
    rows = [
        ["database file, MB", *(f"{size / 1e6:,.0f}" for _, size, *_ in found)],
        ["export, MB", *(f"{exported / 1e6:,.0f}" for _, _, exported, *_ in found)],
        ["database / export", *(f"{size / exported:.2f}x" for _, size, exported, *_ in found)],
        ["database, B per applicant", *(f"{size / n:,.0f}" for n, size, *_ in found)],
        ["export, B per applicant", *(f"{out / n:,.0f}" for n, _, out, *_ in found)],
        ["stored body (mean), B", *(f"{body:,.0f}" for *_, body in found)],
    ]
    for name in found[-1][3]:
        per_row = (objects.get(name, 0) / n for n, _, _, objects, _ in found)
        rows.append([f"`{name}`, B per applicant", *(f"{value:,.0f}" for value in per_row)])
    header = "| | " + " | ".join(f"{n:,} applicants" for n, *_ in found) + " |"
    table = provenance.table(header + "\n|---|" + "---:|" * len(found), rows)
    provenance.publish(provenance.section("storage-size", table), outputs.results_md)


if __name__ == "__main__":
    main()
