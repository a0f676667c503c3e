"""The C allocator: told to keep the memory a page's buffers were just given back, and
to hand back what a build of the columnar copy freed.

A page of 250 records allocates buffers of ~0.5 MB several times over (the joined
bodies, the encoded answer). glibc's malloc serves a block of 128 KiB or more with its
own mmap and hands the top of its heap back to the kernel once 128 KiB of it is free,
so each such request faulted in fresh zeroed pages: 5-6 `brk` calls a request (strace:
560 over 100 requests of `limit=250`). glibc raises both thresholds by itself only once
a larger mapped block is freed, which the columnar copy built in the heap used to do at
start; mapped from its file it does not, and `limit=250` served 0.74x of before
(benchmarks/RESULTS.md, "Before and after the planner, ..."). Set once per worker: blocks
up to MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of its free top stays.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Final

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
# The most glibc's own dynamic threshold reaches on 64 bits is 32 MiB; a page's largest
# buffer is ~1 MB, and 16 concurrent ones fit under the trim threshold.
MMAP_THRESHOLD: Final = 4 * 1024 * 1024
TRIM_THRESHOLD: Final = 16 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Set the thresholds in this process; False where the C library has no `mallopt`
    (musl, macOS: their allocators have no such thresholds to raise)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # (mallopt answers 1 on success; setting a threshold stops glibc adjusting it.)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def release_freed_memory() -> None:
    """Hand what a build freed back to the system: glibc keeps a thread's freed memory
    in that thread's arena (the worker that built the copy of 1,000,000 rows held 138 MB
    of its own afterwards, the one that mapped it 61 MB). Nothing where there is no
    `malloc_trim`."""
    malloc_trim = _libc_function("malloc_trim")
    if malloc_trim is not None:
        malloc_trim(0)


def _libc_function(name: str) -> Any:  # a ctypes function, or None
    """The C library's function `name`, None where the library or the function is missing."""
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        function = getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None
    return function
