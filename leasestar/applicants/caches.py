"""Bounded maps the reader keeps: its caches of counts, checkpoints and choices, and the
pages asked for again.

A page asked for again (a dashboard's first page, a client polling the same list) is
served from memory while the data has not changed: the data version, the change
sequence of the last write, moves on every write, so a page kept with the version it was
read at is exactly what a read at that version returns. A page is kept only from its
second request within the last SEEN_QUERIES distinct ones: keeping every page would write
~200 KB of memory a page for the pages nobody asks for twice (random offsets, cursor
walks), and writing memory that has gone cold costs more than it saves (measured:
benchmarks/RESULTS.md, "Pages asked for again").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Distinct queries remembered to know a second request (two generations of this many).
SEEN_QUERIES: Final = 2048


class LRU(Generic[K, V]):
    """A bounded map that forgets the entry written longest ago first: at most `size`
    entries, or entries weighing at most `size` in all when `weigh` says what each weighs."""

    def __init__(self, size: int, weigh: Callable[[V], int] | None = None) -> None:
        self._size = size
        self._weigh = weigh
        self._weight = 0
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        self.drop(key)
        self._entries[key] = value
        self._weight += self._weight_of(value)
        while self._weight > self._size and len(self._entries) > 1:
            self._weight -= self._weight_of(self._entries.popitem(last=False)[1])

    def drop(self, key: K) -> None:
        if key in self._entries:
            self._weight -= self._weight_of(self._entries.pop(key))

    def _weight_of(self, value: V) -> int:
        return 1 if self._weigh is None else self._weigh(value)

    @property
    def weight(self) -> int:
        """What the entries weigh in all (their number without `weigh`)."""
        return self._weight


class RecentPages(Generic[K, V]):
    """Pages by query, each with the data version it was read at, within `size` bytes as
    `weigh` counts them (0: none kept)."""

    def __init__(self, size: int, weigh: Callable[[V], int]) -> None:
        self._pages: LRU[K, tuple[int, V]] = LRU(size, weigh=lambda entry: weigh(entry[1]))
        self._size = size
        self._weigh = weigh
        self._seen: set[K] = set()
        self._seen_before: set[K] = set()

    def asked_before(self, query: K) -> bool:
        """Whether `query` was asked for among the last distinct ones (and now it is)."""
        if self._size <= 0:
            return False
        if query in self._seen or query in self._seen_before:
            return True
        self._seen.add(query)
        if len(self._seen) >= SEEN_QUERIES:
            self._seen_before, self._seen = self._seen, set()
        return False

    def get(self, query: K, version: int) -> V | None:
        """The page kept for `query`, if it was read at `version`."""
        entry = self._pages.get(query)
        return entry[1] if entry is not None and entry[0] == version else None

    def put(self, query: K, version: int, page: V) -> None:
        """Keep `page`, read at `version`, unless it alone weighs more than the budget."""
        if self._weigh(page) <= self._size:
            self._pages.put(query, (version, page))

    @property
    def weight(self) -> int:
        return self._pages.weight
