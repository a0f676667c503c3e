"""What the columnar copy holds (`columnar_copy.py`, `copy_file.py`): which columns, of
which types, and how a text column's values are numbered (`Codes`: each distinct value a
code) and sorted (`Order`, `CodeOrder`: NULL first, then by code point, as SQLite's BINARY).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from leasestar.applicants.resource import APPLICANTS

Array = npt.NDArray[Any]
KeyValue = int | str | None  # None: SQL NULL, in a nullable coded column

# The columns copied (`resource.APPLICANTS`): instants and sequences as they are, text
# columns as codes (each distinct value numbered as first seen), those kept for orders
# alone so that the copy can find where a page's matches lie in them (docs/list-planning.md,
# "Seeking to where the matches are"). NULL is the code that sorts first, as in SQLite.
INSTANT_COLUMNS: Final = APPLICANTS.copy_instants
CODED_COLUMNS: Final = APPLICANTS.copy_codes
COLUMNS: Final = APPLICANTS.copy_columns
COLUMN_TYPES: Final = {
    column: np.int32 if column in CODED_COLUMNS else np.int64 for column in COLUMNS
}
# The (group, instant) pairs whose rows the file holds grouped (`copy_file.grouped`).
GROUPINGS: Final = APPLICANTS.copy_groupings
MISSING: Final = -1  # the code of a value no row holds


class Order:
    """A column's sort keys: its values as they are (instants)."""

    keys_are_values = True  # whether a column's values are its sort keys

    def keys(self, values: Array) -> Array:
        return values

    def value(self, key: Any) -> KeyValue:
        return int(key)

    def stored(self, key: Any) -> Any:
        """What the copy holds for a sort key."""
        return key


INSTANT_ORDER: Final = Order()


class CodeOrder(Order):
    """A coded column's sort keys: each code's rank among the values, sorted."""

    def __init__(self, codes: dict[str | None, int]) -> None:
        self.codes = codes
        # A snapshot (a read may number new values meanwhile), NULL first as in SQLite.
        self.ordered = sorted(codes, key=lambda value: (value is not None, value or ""))
        self.ranks = np.zeros(len(self.ordered), np.int32)
        for rank, value in enumerate(self.ordered):
            self.ranks[codes[value]] = rank
        # Codes numbered in sorted order (the file's, `copy_file.py`) and none added since.
        self.keys_are_values = bool(np.array_equal(self.ranks, np.arange(len(self.ranks))))

    def keys(self, values: Array) -> Array:
        return self.ranks[values]

    def value(self, key: Any) -> KeyValue:
        return self.ordered[int(key)]

    def stored(self, key: Any) -> Any:
        return self.codes[self.ordered[int(key)]]


class Codes:
    """Each distinct value of a text column numbered as first seen."""

    def __init__(self) -> None:
        self._codes: dict[str | None, int] = {}
        self._order = CodeOrder({})

    def code(self, value: str | None) -> int:
        """The value's code, numbered now if it is new."""
        return self._codes.setdefault(value, len(self._codes))

    def order(self) -> CodeOrder:
        """The values' order, sorted again once values have been added since."""
        if len(self._order.ordered) != len(self._codes):
            self._order = CodeOrder(self._codes)
        return self._order

    def of(self, value: str) -> int:
        return self._codes.get(value, MISSING)

    @classmethod
    def numbered(cls, values: list[str | None]) -> Codes:
        """The codes of a table that lists each value at its code."""
        codes = cls()
        codes._codes = {value: code for code, value in enumerate(values)}
        return codes


def dtype_of(column: str) -> type:
    return COLUMN_TYPES[column]


def grown(array: Array, size: int) -> Array:
    grown = np.zeros(size, array.dtype)
    grown[: len(array)] = array
    return grown
