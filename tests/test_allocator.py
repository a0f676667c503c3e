"""A worker's allocator keeps a page's buffers (leasestar/allocator.py), read back from
glibc's own accounting (`mallinfo2`) in a fresh interpreter."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's"
)

# One 1 MiB block allocated and freed: is it mapped on its own (glibc's `hblks`, blocks
# served by mmap, grows while it lives), and how much free memory stays at the top of the
# heap once it is freed (`keepcost`)?
_PROBE = """
import ctypes, ctypes.util, sys

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
if sys.argv[1] == "keep":
    from leasestar.allocator import keep_freed_memory
    assert keep_freed_memory()
elif sys.argv[1] == "worker":
    from leasestar.main import create_app_from_env
    create_app_from_env()
mapped_before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)
mapped_while = libc.mallinfo2().hblks
libc.free(block)
print(mapped_while - mapped_before, libc.mallinfo2().keepcost)
"""


def _probe(mode: str, db: Path | None = None) -> tuple[int, int]:
    environment = {**os.environ, "LEASESTAR_DB": str(db)} if db else None
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env=environment,
    )
    mapped, kept = done.stdout.split()
    return int(mapped), int(kept)


def test_a_worker_keeps_a_page_sized_block_in_its_heap() -> None:
    mapped, kept = _probe("keep")
    assert mapped == 0
    assert kept >= 1 << 20


def test_without_it_glibc_maps_the_block_and_keeps_nothing_of_it() -> None:
    # The control: what a worker did before, so the test above can tell the difference.
    mapped, kept = _probe("default")
    assert mapped == 1
    assert kept < 1 << 20


def test_every_server_worker_sets_it(tmp_path: Path) -> None:
    # `create_app_from_env` is what uvicorn calls in each worker (commands.py).
    mapped, kept = _probe("worker", tmp_path / "applicants.db")
    assert mapped == 0
    assert kept >= 1 << 20
