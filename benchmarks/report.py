"""One measured case (its served figures, its floors, what its req/s is compared against and
the ratio it needs), a group of them measured in interleaved slices, and their tables."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import floors
import harness
from cases import SETTLE_SECONDS, Case, Dataset, Settings, served_once
from harness import Measured, WrkTarget, say
from provenance import table, text


@dataclass(eq=False)
class Measurement:
    """A case under wrk, its floors, and what its figures are compared against."""

    label: str
    target: WrkTarget
    rows: int = 0
    case: Case | None = None  # a list case: its body checked, its bytes shown...
    dataset: Dataset | None = None  # ...from this database...
    base: str = ""  # ...served at this base URL
    in_process: bool = False  # measured against its page made in-process (floors.py)
    http_floor: WrkTarget | None = None  # ...and the same bytes from a bare app
    against: Measurement | None = None  # its req/s ratio to this case's (None: to its composite)
    need: float | None = None  # issue 4's or 15's target for that ratio
    wire_at_most: float | None = None  # ...and for its bytes on the wire over `against`'s
    body_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    served: Measured | None = None
    http: Measured | None = None
    floor: floors.InProcessFloor | None = None

    @property
    def key(self) -> str:
        return self.case.key if self.case else self.label

    @property
    def inprocess_rps(self) -> float | None:
        return self.floor.rate if self.floor else None

    @property
    def composite(self) -> float | None:
        if self.http is None or not self.http.rps or not self.inprocess_rps:
            return None
        return 1 / (1 / self.http.rps + 1 / self.inprocess_rps)

    @property
    def x_composite(self) -> float | None:
        composite = self.composite
        return self.served.rps / composite if self.served and composite else None

    @property
    def ratio(self) -> float | None:
        if self.against is None:
            return self.x_composite
        reference = self.against.served
        return (
            self.served.rps / reference.rps if self.served and reference and reference.rps else None
        )

    @property
    def wire_ratio(self) -> float | None:
        mine, other = self.served, self.against.served if self.against else None
        return mine.wire_bytes / other.wire_bytes if mine and other else None

    def fields(self) -> dict[str, str]:
        """Its figures as sections.toml's row templates show them ("-": none)."""
        assert self.served is not None
        http = self.http.rps if self.http else None
        against = "composite floor" if self.composite else ""
        against = self.against.label if self.against else against
        return {
            **figures(self.served), "rows": f"{self.rows:,}", "label": self.label,
            "body": f"{self.body_bytes:,}", "in_process": fmt(self.inprocess_rps),
            "http_floor": fmt(http), "composite": fmt(self.composite),
            "x_composite": fmt(self.x_composite, 2), "ratio": fmt(self.ratio, 2, "x"),
            "against": against, "offset": f"{self.case.offset:,}" if self.case else "-",
        }  # fmt: skip

    def line(self) -> str:
        f, variant = self.fields(), self.floor.variant if self.floor else "-"
        return (
            f"{f['rows']:>9} {self.label:<38} {f['rps']:>7} req/s  p50 {f['p50']:>7} ms  "
            f"p99 {f['p99']:>7} ms  {f['wire']:>9} B/resp | HTTP floor {f['http_floor']} | "
            f"in-process {f['in_process']} ({variant}) | {f['ratio']}"
        )


def list_case(
    base: str, dataset: Dataset, case: Case, floor_base: str = "", in_process: bool = True
) -> Measurement:
    """A list case of `dataset`, with its floors (the HTTP one when a floor app serves)."""
    url = base + case.path + (dataset.ids[0] if case.by_id else "")
    ids = dataset.ids_file if case.by_id else None
    target = WrkTarget(f"{dataset.rows} {case.key}", url, dataset.tokens[case.scoped], ids)
    http = WrkTarget(f"HTTP floor {case.key}", f"{floor_base}/floor/{case.key}")
    http_floor = http if floor_base else None
    return Measurement(
        case.label, target, dataset.rows, case, dataset, base, in_process, http_floor
    )


def measure(settings: Settings, group: list[Measurement]) -> None:
    """The group's cases, then their HTTP floors, in interleaved slices (reversed every
    other round), the in-process floors' turn after each round; list bodies checked first."""
    try:
        for m in group:
            if m.case is not None and m.dataset is not None:
                body, m.notes = served_once(m.base, m.dataset, m.case)
                m.body_bytes = len(body)
                if m.in_process:
                    ids = m.dataset.ids
                    m.floor = floors.InProcessFloor(m.dataset.db, m.case, body, ids)
        targets = [m.target for m in group] + [m.http_floor for m in group if m.http_floor]
        in_process = [m.floor for m in group if m.floor]

        def floors_turn(_: int) -> None:
            for floor in in_process:
                floor.run(settings.inprocess_seconds / settings.slices)

        harness.interleave(
            targets, settings.slices, settings.slice_seconds, settings.warmup,
            settle=SETTLE_SECONDS, after_round=floors_turn,
        )  # fmt: skip
    finally:
        for m in group:
            if m.floor:
                m.floor.close()
    for m in group:
        m.served = m.target.measured()
        m.http = m.http_floor.measured() if m.http_floor else m.http
        say(m.line())


def fmt(value: float | None, digits: int = 0, suffix: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"


def verdict(measured: float, need: float, at_most: bool = False) -> str:
    if (measured <= need) if at_most else (measured >= need):
        return "PASS"
    if measured <= 0:
        return "MISS (nothing served)"
    return f"MISS ({abs(need - measured) / need:.0%} {'over' if at_most else 'short'})"


def targets(group: Iterable[Measurement]) -> list[list[str]]:
    """(target, measured, needs, verdict) of each case with a target in this run."""
    found = []
    for m in group:
        if m.need is not None and m.ratio is not None:
            what = f"{m.label} vs its composite floor"
            if m.against and m.against.rows != m.rows:
                what = f"{m.label} at {m.rows:,} rows vs at {m.against.rows:,} (interleaved)"
            elif m.against:
                what = f"{m.label} vs {m.against.label}"
            found.append([what, f"{m.ratio:.2f}x", f">= {m.need:.2f}x", verdict(m.ratio, m.need)])
        if m.wire_at_most is not None and m.wire_ratio is not None:
            what, need = f"{m.label}: bytes on the wire vs identity", m.wire_at_most
            wire = [f"{m.wire_ratio:.2f}x", f"<= {need:.2f}x", verdict(m.wire_ratio, need, True)]
            found.append([what, *wire])
    return found


def table_rows(key: str, part: str, group: Iterable[Measurement], **fields: str) -> list[list[str]]:
    """Each measured case's row of a table, by the template `part` of section `key`."""
    return [[text(key, part, **m.fields(), **fields)] for m in group if m.served]


def figures(m: Measured) -> dict[str, str]:
    return {
        "rps": f"{m.rps:,.0f}", "p50": f"{m.p50_ms:.2f}", "p99": f"{m.p99_ms:.2f}",
        "wire": f"{m.wire_bytes:,.0f}",
    }  # fmt: skip


def against_table(group: list[Measurement]) -> str:
    """The clients section's table: each case, its ratio and what it is taken against,
    then the HTTP floors and the composite floors."""
    floor_rows = [
        [text("clients", "row", **figures(m.http), label=f"HTTP floor of {m.case.key}", ratio="-",
              against="")]
        for m in group
        if m.http is not None and m.case is not None
    ]  # fmt: skip
    composites = [
        [f"composite floor of {m.label}", fmt(m.composite), *[""] * 5] for m in group if m.composite
    ]
    return table(
        text("clients", "columns"), table_rows("clients", "row", group) + floor_rows + composites
    )
