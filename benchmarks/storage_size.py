"""The database against its own export (issue 15.4): bytes per applicant, per table and index.

For each size (the seeded databases of `make bench`, `benchmarks/work/applicants-N.db`):
the file's bytes, the NDJSON export's bytes (`leasestar export` of the same database),
and SQLite's own account of every table and index (the `dbstat` virtual table: pages
in use times the page size), each per applicant. Writes the `storage-size` section of
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/storage_size.py [--rows 100000 1000000]
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import databases
import provenance

LEASESTAR = Path(sys.executable).with_name("leasestar")


def export_bytes(db: Path) -> int:
    """The size of `leasestar export` of the database (written to a scratch file)."""
    with tempfile.TemporaryDirectory(dir=db.parent) as scratch:
        out = Path(scratch) / "export.ndjson"
        subprocess.run(
            [str(LEASESTAR), "export", "--db", str(db), str(out)],
            check=True,
            capture_output=True,
        )
        return out.stat().st_size


def objects(db: Path) -> list[tuple[str, int]]:
    """(table or index, bytes of its pages), largest first."""
    connection = databases.read_only(db)
    try:
        rows = connection.execute(
            "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
        ).fetchall()
    finally:
        connection.close()
    return [(str(name), int(size)) for name, size in rows]


def stored_body(db: Path) -> float:
    """The mean bytes of a stored body (compressed: leasestar/applicants/bodies.py)."""
    connection = databases.read_only(db)
    try:
        (mean,) = connection.execute(
            "SELECT avg(length(CAST(body AS BLOB))) FROM applicants"
        ).fetchone()
    finally:
        connection.close()
    return float(mean or 0)


Result = tuple[int, int, int, list[tuple[str, int]], float]


def section(results: list[Result], when: str) -> str:
    rows = [
        ["database file, MB", *(f"{size / 1e6:,.0f}" for _, size, *_ in results)],
        ["export, MB", *(f"{exported / 1e6:,.0f}" for _, _, exported, *_ in results)],
        ["database / export", *(f"{size / exported:.2f}x" for _, size, exported, *_ in results)],
        ["database, B per applicant", *(f"{size / rows:,.0f}" for rows, size, *_ in results)],
        ["export, B per applicant", *(f"{out / rows:,.0f}" for rows, _, out, *_ in results)],
        ["stored body (mean), B", *(f"{body:,.0f}" for *_, body in results)],
    ]
    for name, _ in results[-1][3]:
        sizes = (dict(found).get(name, 0) / rows for rows, _, _, found, _ in results)
        rows.append([f"`{name}`, B per applicant", *(f"{value:,.0f}" for value in sizes)])
    return provenance.section(
        "storage-size",
        provenance.table(
            "| | " + " | ".join(f"{rows:,} applicants" for rows, *_ in results) + " |",
            "|---|" + "---:|" * len(results),
            rows,
        ),
        commit=provenance.git_commit(),
        when=when,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--results", type=Path, default=provenance.RESULTS_MD)
    args = parser.parse_args(argv)
    results: list[Result] = []
    for rows in args.rows:
        db = databases.ensure_database(rows)
        connection = sqlite3.connect(db)
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            connection.close()
        results.append((rows, db.stat().st_size, export_bytes(db), objects(db), stored_body(db)))
    text = section(results, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(text)
    provenance.write_section(text, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
