"""What each compressor costs on the pages clients read (issue 15): microseconds per
100-record page and the size ratio, for the codecs leasestar could answer with.

Pages are 200 distinct 100-record windows of the default-order list of the benchmark
database, built as the list route builds them (the stored bodies joined); each codec
compresses all of them, best of five passes, on the server core. Writes the `codecs`
section of benchmarks/RESULTS.md; `leasestar/compression.py` chose from it.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable

import brotli
import databases
import harness
import provenance
from isal import isal_zlib

from leasestar.applicants.bodies import BodyDecoder

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]

PAGES = 200
PAGE_ROWS = 100


def _gzip(module: object, level: int) -> Callable[[bytes], bytes]:
    def compress(data: bytes) -> bytes:
        compressor = module.compressobj(level, zlib.DEFLATED, 31)  # type: ignore[attr-defined]
        return bytes(compressor.compress(data) + compressor.flush())

    return compress


CODECS: dict[str, Callable[[bytes], bytes]] = {
    "gzip, zlib level 6 (Litestar's default gzip)": _gzip(zlib, 6),
    "gzip, zlib level 1": _gzip(zlib, 1),
    "gzip, ISA-L level 1 (chosen)": _gzip(isal_zlib, 1),
    "gzip, ISA-L level 2": _gzip(isal_zlib, 2),
    "br, quality 0 (chosen)": lambda data: bytes(brotli.compress(data, quality=0)),
    "br, quality 1": lambda data: bytes(brotli.compress(data, quality=1)),
    "br, quality 4 (before)": lambda data: bytes(brotli.compress(data, quality=4)),
    "zstd, level 1 (chosen)": lambda data: bytes(zstd.compress(data, level=1)),
    "zstd, level 3": lambda data: bytes(zstd.compress(data, level=3)),
}


def _pages(rows: int) -> list[bytes]:
    db = databases.ensure_database(rows)
    with databases.read_only(db) as connection:
        decode = BodyDecoder.of(connection).decode
        bodies = [
            decode(row[0])
            for row in connection.execute(
                "SELECT CAST(body AS BLOB) FROM applicants ORDER BY created_at DESC, id DESC"
            )
        ]
    chooser = random.Random(15)
    starts = [chooser.randrange(0, len(bodies) - PAGE_ROWS) for _ in range(PAGES)]
    return [
        b'{"meta":{},"results":[' + b",".join(bodies[s : s + PAGE_ROWS]) + b"]}" for s in starts
    ]


def main() -> None:
    rows = 100_000
    pages = _pages(rows)
    size = sum(map(len, pages))
    lines = [
        "<!-- BEGIN codecs -->",
        "## Compressing a page: codecs by cost (issue 15)",
        "",
        f"`python benchmarks/codecs.py` at {provenance.git_commit()}: {PAGES} distinct "
        f"{PAGE_ROWS}-record pages of the default order ({size / PAGES / 1024:,.0f} KiB "
        f"each on average) of {rows:,} seeded applicants, best of 5, one core; "
        f"{provenance.describe_machine('isal', 'brotli')}.",
        "",
        "| codec | us per page | size ratio |",
        "|---|---:|---:|",
    ]
    with harness.on_server_core():
        for name, compress in CODECS.items():
            best = float("inf")
            compressed = 0
            for _ in range(5):
                started = time.perf_counter()
                compressed = sum(len(compress(page)) for page in pages)
                best = min(best, time.perf_counter() - started)
            lines.append(f"| {name} | {best / PAGES * 1e6:,.0f} | {size / compressed:.2f}x |")
            harness.say(lines[-1])
    lines.append("<!-- END codecs -->")
    provenance.write_section("\n".join(lines))


if __name__ == "__main__":
    main()
