"""Ways to store the bodies, by what a 100-record page costs (issue 15.4): the choice in
leasestar/applicants/bodies.py.

On the bodies of the seeded database (`databases.ensure_database`), each design stores
every body in an in-memory SQLite table (id, created_at, stored body, with an index on
the default order), then reads pages of 100 records from it: 100 random ids, and 100
consecutive ones in the default order. A page's cost is from the statement to the
page's bytes (identity), and to its gzip answer (ISA-L level 1, as served). Designs are
timed in interleaved rounds (the machine is shared), best of the rounds, CPU time of
this process.

- today: bodies as text, `group_concat(body, ',')`;
- zstd with a 64 KiB dictionary trained on the bodies, one frame a body (levels 3, 9),
  decompressed one call a record, or by `multi_decompress_to_buffer`;
- LZ4 (high compression 9) with a 16 KiB dictionary, one block a body;
- raw deflate, one block a body ended by a full flush: a gzip answer is a header, the
  blocks concatenated, the CRC-32s combined (`isal_zlib.crc32_combine`) and a trailer,
  with nothing compressed again; identity inflates them.

    .venv/bin/python benchmarks/stored_bodies.py [--rows 100000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import databases
import lz4.block  # type: ignore[import-untyped]
import zstandard
from isal import isal_zlib

from leasestar.applicants.bodies import BodyDecoder

Rows = list[tuple[Any, ...]]
PAGE = 100
RANDOM = "SELECT {cols} FROM t WHERE id IN (" + ",".join("?" * PAGE) + ")"
CONSECUTIVE = (
    "SELECT {cols} FROM (SELECT * FROM t WHERE (created_at, id) >= (?, ?) "
    f"ORDER BY created_at, id LIMIT {PAGE})"
)
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def gzip(page: bytes) -> bytes:
    compressor = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
    return bytes(compressor.compress(page) + compressor.flush())


@dataclass
class Design:
    name: str
    db: sqlite3.Connection
    stored: float  # mean bytes of a stored body
    encode_us: float  # per body
    columns: str  # what the page statement selects
    identity: Callable[[Rows], bytes]
    gzipped: Callable[[Rows], bytes]


def build(
    name: str,
    records: list[tuple[str, int, bytes]],
    encode: Callable[[bytes], tuple[Any, ...]],
    columns: str,
    identity: Callable[[Rows], bytes],
    gzipped: Callable[[Rows], bytes] | None = None,
    extra: str = "",
) -> Design:
    db = sqlite3.connect(":memory:")
    db.execute("PRAGMA page_size = 16384")
    db.execute(f"CREATE TABLE t (id TEXT PRIMARY KEY, created_at INT, z {extra})")
    db.execute("CREATE INDEX t_order ON t (created_at, id)")
    started = time.process_time()
    encoded = [(i, c, *encode(body)) for i, c, body in records]
    encode_us = (time.process_time() - started) / len(records) * 1e6
    db.executemany(f"INSERT INTO t VALUES ({','.join('?' * len(encoded[0]))})", encoded)
    stored = sum(len(row[2]) + 6 * (len(row) > 3) for row in encoded) / len(encoded)
    return Design(
        name, db, stored, encode_us, columns, identity, gzipped or (lambda r: gzip(identity(r)))
    )


def designs(records: list[tuple[str, int, bytes]]) -> list[Design]:
    chooser = random.Random(1)
    sample = [body for *_, body in chooser.sample(records, min(20_000, len(records)))]
    found = [
        build(
            "today: text, group_concat",
            records,
            lambda body: (body.decode(),),
            "CAST(group_concat(z, ',') AS BLOB)",
            lambda rows: bytes(rows[0][0]),
        )
    ]
    for level in (3, 9):
        trained = zstandard.train_dictionary(65536, sample, level=level)
        compress = zstandard.ZstdCompressor(
            level=level, dict_data=trained, write_checksum=False, write_dict_id=False
        ).compress
        decompressor = zstandard.ZstdDecompressor(dict_data=trained)
        decompress = decompressor.decompress

        def per_record(rows: Rows, decompress: Callable[[bytes], bytes] = decompress) -> bytes:
            return b",".join([decompress(z) for (z,) in rows])

        found.append(
            build(
                f"zstd level {level}, 64 KiB dictionary, a call a record",
                records,
                lambda body, compress=compress: (compress(body),),  # type: ignore[misc]
                "z",
                per_record,
            )
        )
        if level == 9:

            def batch(rows: Rows, decompressor: Any = decompressor) -> bytes:
                out = decompressor.multi_decompress_to_buffer([z for (z,) in rows], threads=1)
                return b"".join([out[i].tobytes() for i in range(len(out))])[:-1]

            found.append(
                build(
                    f"zstd level {level}, 64 KiB dictionary, multi_decompress_to_buffer",
                    records,
                    lambda body, compress=compress: (compress(body + b","),),  # type: ignore[misc]
                    "z",
                    batch,
                )
            )
    lz4_dictionary = zstandard.train_dictionary(65536, sample).as_bytes()[-16384:]

    def lz4_page(rows: Rows) -> bytes:
        decompress = lz4.block.decompress
        return b",".join([decompress(z, dict=lz4_dictionary) for (z,) in rows])

    found.append(
        build(
            "LZ4 HC 9, 16 KiB dictionary",
            records,
            lambda body: (
                lz4.block.compress(
                    body, mode="high_compression", compression=9, dict=lz4_dictionary
                ),
            ),
            "z",
            lz4_page,
        )
    )

    def deflated(body: bytes) -> tuple[bytes, int, int]:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        line = body + b","
        block = compressor.compress(line) + compressor.flush(zlib.Z_FULL_FLUSH)
        return block, zlib.crc32(line), len(line)

    def inflate(rows: Rows) -> bytes:
        return bytes(isal_zlib.decompressobj(-15).decompress(rows[0][0]))[:-1]

    def concatenated(rows: Rows) -> bytes:
        blocks, crcs, lengths = rows[0]
        crc, total = 0, 0
        for part, length in zip(
            map(int, crcs.split(",")), map(int, lengths.split(",")), strict=True
        ):
            crc = isal_zlib.crc32_combine(crc, part, length)
            total += length
        # (The served page has no last comma: its record's CRC without it is one column more.)
        trailer = crc.to_bytes(4, "little") + (total & 0xFFFFFFFF).to_bytes(4, "little")
        return GZIP_HEADER + blocks + b"\x03\x00" + trailer

    found.append(
        build(
            "raw deflate 9, a block a record (gzip by concatenation)",
            records,
            deflated,
            "CAST(group_concat(z, '') AS BLOB), group_concat(crc), group_concat(n)",
            inflate,
            concatenated,
            extra=", crc INT, n INT",
        )
    )
    return found


def cpu_us(produce: Callable[[], object], repeats: int) -> float:
    started = time.process_time()
    for _ in range(repeats):
        produce()
    return (time.process_time() - started) / repeats * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    source = databases.read_only(databases.ensure_database(args.rows))
    decode = BodyDecoder.of(source).decode
    records = [
        (i, c, decode(body))
        for i, c, body in source.execute(
            "SELECT id, created_at, CAST(body AS BLOB) FROM applicants"
        )
    ]
    source.close()
    raw = sum(len(body) for *_, body in records) / len(records)
    ordered = sorted(records, key=lambda r: (r[1], r[0]))
    starts = [(c, i) for i, c, _ in ordered]
    expected = b",".join(body for *_, body in ordered[500 : 500 + PAGE])
    found = designs(records)
    for design in found:
        rows = design.db.execute(CONSECUTIVE.format(cols=design.columns), starts[500]).fetchall()
        if design.identity(rows) != expected:
            raise RuntimeError(f"{design.name}: the page differs from the stored bodies")
    best: dict[tuple[str, str, str], float] = {}
    chooser = random.Random(2)
    ids = [i for i, *_ in records]
    for _ in range(args.rounds):
        pages = {
            "random": (RANDOM, tuple(chooser.sample(ids, PAGE))),
            "consecutive": (CONSECUTIVE, starts[chooser.randrange(len(starts) - PAGE)]),
        }
        for design in found:
            for kind, (template, params) in pages.items():
                sql = template.format(cols=design.columns)

                def fetch(
                    sql: str = sql, params: tuple[Any, ...] = params, db: Any = design.db
                ) -> Rows:
                    return list(db.execute(sql, params).fetchall())

                for answer, produce in (("identity", design.identity), ("gzip", design.gzipped)):
                    key = (design.name, kind, answer)
                    cost = cpu_us(lambda produce=produce: produce(fetch()), 10)  # type: ignore[misc]
                    best[key] = min(best.get(key, float("inf")), cost)
    print(
        "| design | ratio | stored B a body | identity page us (random / consecutive) "
        "| gzip page us (random / consecutive) | encode us a body |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for design in found:

        def at(kind: str, answer: str, name: str = design.name) -> str:
            return f"{best[(name, kind, answer)]:,.0f}"

        print(
            f"| {design.name} | {raw / design.stored:.2f}x | {design.stored:,.0f} | "
            f"{at('random', 'identity')} / {at('consecutive', 'identity')} | "
            f"{at('random', 'gzip')} / {at('consecutive', 'gzip')} | {design.encode_us:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
