"""Cursor walks at depth (issue 7): cursors at 10/50/90% of each ordering, made without
walking there, each page checked against SQL, measured in turns. Method: sections.toml."""

from __future__ import annotations

import contextlib
import statistics
import time
import urllib.parse
from dataclasses import dataclass

import databases
import provenance
import report
from cases import Case, Dataset, Settings, served_once
from harness import CLIENT_CORE, CONNECTIONS, SERVER_CORE, say
from provenance import section, table, text
from report import Measurement, list_case

from leasestar.applicants.cursors import CursorCodec
from leasestar.applicants.ordering import order_columns
from leasestar.applicants.query import ApplicantQuery, cursor_state, parse_order_by

DEPTHS = (0.1, 0.5, 0.9)
LIMIT = 100  # the default page size
TARGET = 1.5


# `order-by` (None: the default) and its SQL from the contract (nulls first ascending,
# last descending; the id key in the last key's direction). The nullable keys' cursors
# once made SQLite scan the index from its far end: ~10% of emails are null (90% desc is
# in the block), ~55% of middle names (10%, 50% asc).
DEFAULT = "created_at:desc (default)"
ORDERINGS = {
    None: "created_at DESC, id DESC",
    "email_1:desc": "email_1 DESC, id DESC",
    "middle_name:asc": "middle_name ASC, id ASC",
}


def cursor_cases(dataset: Dataset) -> list[Case]:
    """Per ordering (keys `ORDERING KIND`) the first page and a cursor at each depth, the
    SQL page at its position (cases.check_body checks the served one against it); offset
    90% for contrast."""
    with contextlib.closing(databases.read_only(dataset.db)) as conn:
        key = bytes(conn.execute("SELECT cursor_key FROM sync_state").fetchone()[0])
        # As the server signs for an unscoped token, which the benchmark uses.
        codec = CursorCodec(key).for_scope(None)
        cases = []
        for given, order in ORDERINGS.items():
            name = given or DEFAULT
            order_by = parse_order_by(given) if given else None
            query = ApplicantQuery(limit=LIMIT, **({"order_by": order_by} if order_by else {}))
            pages = [("first", "first page (no cursor)", {"order-by": given} if given else {}, 0)]
            for depth in DEPTHS:
                position = int(dataset.rows * depth)
                say(f"making the cursor at {depth:.0%} of {name} (position {position:,})")
                # The total order's key values of the record before, as SQL stores them.
                after = conn.execute(
                    f"SELECT {', '.join(order_columns(query.order_by))} FROM applicants "
                    f"ORDER BY {order} LIMIT 1 OFFSET ?",
                    (position - 1,),
                ).fetchone()
                cursor = codec.encode(cursor_state(query, position, after))
                kind, label = f"cursor_{round(depth * 100)}", f"cursor at {depth:.0%}"
                pages.append((kind, label, {"cursor": cursor}, position))
            if order_by is None:
                position = int(dataset.rows * DEPTHS[-1])
                label = f"offset={position:,} (offset pagination, for contrast)"
                pages.append(("offset_90", label, {"offset": position}, position))
            for kind, label, parameters, position in pages:
                query_string = "?" + urllib.parse.urlencode(parameters) if parameters else ""
                path = "/v1/applicants" + query_string
                cases.append(Case(f"{name} {kind}", label, path, order=order, offset=position))
    return cases


def latency(m: Measurement, percentile: float) -> float:
    """The median of the slices' latencies at `percentile`, in ms."""
    return statistics.median(m.target.per_slice(percentile))


@dataclass
class Walk:
    rows: int
    group: list[Measurement]
    settings: Settings
    loads: tuple[str, str]  # load average before, after

    def x_first(self, m: Measurement) -> float:
        """Its p50 over its ordering's first page's."""
        ordering = m.key.rpartition(" ")[0]
        first = next(f for f in self.group if f.key == f"{ordering} first")
        return latency(m, 50) / latency(first, 50)

    def ratios(self) -> dict[str, float]:
        """Per ordering: p50 at the deepest cursor over its first page's."""
        deepest = (m for m in self.group if m.key.endswith(" cursor_90"))
        return {m.key.rpartition(" ")[0]: self.x_first(m) for m in deepest}


def walk(dataset: Dataset, base: str, settings: Settings) -> Walk:
    """The cursors made and their pages checked, then every page warmed up (caches, the
    count cache, the OS page cache) and measured in turns."""
    load_before, started = provenance.loadavg(), time.monotonic()
    cases = cursor_cases(dataset)
    problems = [problem for case in cases for problem in served_once(base, dataset, case)[1]]
    if problems:
        raise RuntimeError("cursor pages not as SQL orders them: " + "; ".join(problems))
    group = [list_case(base, dataset, case, in_process=False) for case in cases]
    report.measure(settings, group)
    result = Walk(dataset.rows, group, settings, (load_before, provenance.loadavg()))
    say(
        f"cursor walks took {time.monotonic() - started:.0f} s: p50 at 90% depth "
        f"{max(result.ratios().values()):.2f}x the first page's (needs <= {TARGET}x)"
    )
    return result


def markdown(result: Walk, command: str) -> str:
    pages = []
    for m in result.group:
        fields = {**m.fields(), **{f"p{p}": latency(m, p) for p in (50, 90, 99)}}
        ordering = m.key.rpartition(" ")[0]
        pages.append(
            [text("cursors", "row", **fields, ordering=ordering, x_first=result.x_first(m))]
        )
    by_ordering = ", ".join(f"`{name}` {ratio:.2f}x" for name, ratio in result.ratios().items())
    verdict = report.verdict(max(result.ratios().values()), TARGET, at_most=True)
    errors = sum(m.served.errors for m in result.group if m.served)
    target = text(
        "cursors", "target", target=TARGET, verdict=verdict, by_ordering=by_ordering, errors=errors
    )
    settings, orderings = result.settings, ", ".join(f"`{o or DEFAULT}`" for o in ORDERINGS)
    return section(
        "cursors", table(text("cursors", "columns"), pages), target, command=command,
        rows=result.rows, limit=LIMIT, orderings=orderings, seconds=settings.seconds,
        slices=settings.slices, warmup=settings.warmup, load_before=result.loads[0],
        load_after=result.loads[1], machine=provenance.describe_machine("python", "sqlite", "wrk"),
        server_core=SERVER_CORE, client_core=CLIENT_CORE, connections=CONNECTIONS,
    )  # fmt: skip
