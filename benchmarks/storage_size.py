"""The database against its own export (issue 15.4): bytes per applicant, per table and
index (`dbstat`), of the seeded databases. Method: sections.toml, RESULTS.md."""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import databases
import harness
import provenance


def measure(db: Path) -> tuple[int, int, list[tuple[str, int]], float]:
    """(file bytes, export bytes, (table or index, bytes of its pages) largest first, the
    mean bytes of a stored body, compressed: leasestar/applicants/bodies.py)."""
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    with tempfile.TemporaryDirectory(dir=db.parent) as scratch:
        out = Path(scratch) / "export.ndjson"
        command = [str(harness.LEASESTAR), "export", "--db", str(db), str(out)]
        subprocess.run(command, check=True, capture_output=True)
        exported = out.stat().st_size
    with contextlib.closing(databases.read_only(db)) as connection:
        sql = "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
        objects = [(str(name), int(size)) for name, size in connection.execute(sql)]
        sql = "SELECT avg(length(CAST(body AS BLOB))) FROM applicants"
        (body,) = connection.execute(sql).fetchone()
    return db.stat().st_size, exported, objects, float(body or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    smoke = {"rows": [2_000, 10_000]}
    args, outputs = provenance.options(
        parser, smoke, argv, rows=[100_000, 1_000_000], out="--results"
    )
    sizes = args.rows
    results = [(n, *measure(databases.ensure_database(n, outputs.work))) for n in sizes]
    rows = [
        ["database file, MB", *(f"{size / 1e6:,.0f}" for _, size, *_ in results)],
        ["export, MB", *(f"{exported / 1e6:,.0f}" for _, _, exported, *_ in results)],
        ["database / export", *(f"{size / exported:.2f}x" for _, size, exported, *_ in results)],
        ["database, B per applicant", *(f"{size / n:,.0f}" for n, size, *_ in results)],
        ["export, B per applicant", *(f"{out / n:,.0f}" for n, _, out, *_ in results)],
        ["stored body (mean), B", *(f"{body:,.0f}" for *_, body in results)],
    ]
    for name, _ in results[-1][3]:
        sizes_of = (dict(found).get(name, 0) / n for n, _, _, found, _ in results)
        rows.append([f"`{name}`, B per applicant", *(f"{value:,.0f}" for value in sizes_of)])
    section = provenance.section(
        "storage-size",
        provenance.table(
            "| | " + " | ".join(f"{n:,} applicants" for n, *_ in results) + " |",
            "|---|" + "---:|" * len(results),
            rows,
        ),
    )
    provenance.publish(section, outputs.results_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
