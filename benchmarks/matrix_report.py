"""The query matrix's report (issue 17): its section of RESULTS.md and its chart."""

from __future__ import annotations

from pathlib import Path

from harness import CLIENT_CORE, SERVER_CORE
from matrix import (
    KINDS,
    SCOPE_TOKENS,
    SLOW_MS,
    TARGET_P50_MS,
    TARGET_P99_MS,
    Combination,
    MatrixResult,
)

BEGIN, END = "<!-- BEGIN matrix -->", "<!-- END matrix -->"
CHART_NAME = "matrix-bench.png"


def _cell(c: Combination) -> str:
    if not c.latencies:
        return "-"
    text = f"{c.p50:.1f} / {c.p99:.1f}"
    return f"**{text}**" if c.p50 > TARGET_P50_MS else text


def markdown(results: list[MatrixResult], command: str, when: str, commit: str) -> str:
    lines = [
        BEGIN,
        "## Query matrix: every ordering against every kind of filter (issue 17)",
        "",
        f"Run {when} on commit `{commit}` with `{command}` (`benchmarks/matrix.py`). "
        "The first page (limit 100) of each ordering (every sortable field both ways, and "
        "multi-key orderings) with: no filter; a date bound (`updated_at` or `last_seen`, "
        "`_gte` or `_lte`, at a random instant of the column's range); a date window (1-30% "
        "of the range); an equality filter (`property_id`, `x_property_id`, `integration_id` "
        "or `integration_vendor` at a random value); an equality filter plus a date bound; "
        f"and a date bound through a token scoped to one and to two integrations (one of "
        f"{SCOPE_TOKENS} tokens each). Values are drawn per request from a fixed seed, so no "
        "cache answers (the equality filter alone has finitely many values, so its count "
        f"may repeat). One keep-alive connection pinned to core {CLIENT_CORE} (`leasestar "
        f"serve` on core {SERVER_CORE}, rate limit off), one request at a time, each timed "
        "to its last byte; rounds ask every combination once, in a shuffled order. p99 is "
        "by nearest rank, so with fewer than 100 requests it is the slowest. A combination "
        f"whose median is over {SLOW_MS:.0f} ms after the first rounds is asked no more. "
        f"Cells: p50 / p99 in ms, **bold** over the {TARGET_P50_MS:.0f} ms median target.",
    ]
    for result in results:
        worst = result.worst
        requests = [len(c.samples) for c in result.combinations]
        over = sum(1 for c in result.combinations if c.latencies and c.p50 > TARGET_P50_MS)
        lines += [
            "",
            f"### {result.rows:,} applicants",
            "",
            f"{len(result.combinations)} combinations, {min(requests)}-{max(requests)} requests "
            f"each ({sum(requests):,} in {result.seconds:.0f} s; {result.dropped} dropped as "
            f"slow; before them, the server's first list request, which waits for its columnar "
            f"copy's first read, took {result.first_seconds:.1f} s). **Worst: "
            f"`order-by={worst.ordering}`, {worst.kind}: p50 "
            f"{worst.p50:.1f} ms, p99 {worst.p99:.1f} ms.** {over} combinations have a median "
            f"over {TARGET_P50_MS:.0f} ms (target: none); p99 over all requests "
            f"{result.p99_all:.1f} ms (target <= {TARGET_P99_MS:.0f} ms). `meta.total` of "
            f"{result.checked} random answers checked against `count(*)`: "
            + (
                f"{len(result.problems)} problems: " + "; ".join(result.problems[:5])
                if result.problems
                else "all exact."
            ),
            "",
            "| order-by | " + " | ".join(KINDS) + " |",
            "|---|" + "---:|" * len(KINDS),
        ]
        by_key = {(c.ordering, c.kind): c for c in result.combinations}
        orderings = dict.fromkeys(c.ordering for c in result.combinations)
        for ordering in orderings:
            cells = " | ".join(_cell(by_key[ordering, kind]) for kind in KINDS)
            lines.append(f"| `{ordering}` | {cells} |")
        slowest = sorted((s for c in result.combinations for s in c.samples), key=lambda s: -s.ms)[
            :5
        ]
        lines += ["", "Slowest requests:", ""]
        lines += [f"- {s.ms:,.1f} ms: {s.request.shown()}" for s in slowest]
    lines += ["", f"![p50 of each combination]({CHART_NAME})", "", END]
    return "\n".join(lines)


def chart(results: list[MatrixResult], title: str, path: Path) -> None:
    """p50 of every combination as a heat map, one panel per database size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    orderings = list(dict.fromkeys(c.ordering for c in results[0].combinations))
    figure, axes = plt.subplots(
        1, len(results), figsize=(6.5 * len(results), 0.32 * len(orderings) + 2.5), squeeze=False
    )
    norm = LogNorm(vmin=0.5, vmax=max(1000.0, max(c.p50 for r in results for c in r.combinations)))
    image = None
    for index, (axis, result) in enumerate(zip(axes[0], results, strict=True)):
        by_key = {(c.ordering, c.kind): c.p50 for c in result.combinations}
        grid = [[by_key[o, k] for k in KINDS] for o in orderings]
        image = axis.imshow(grid, cmap="RdYlGn_r", norm=norm, aspect="auto")
        for y, row in enumerate(grid):
            for x, value in enumerate(row):
                axis.text(
                    x,
                    y,
                    f"{value:.0f}" if value >= 10 else f"{value:.1f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                )
        axis.set_xticks(range(len(KINDS)), KINDS, rotation=30, ha="right", fontsize=7)
        # The orderings are the same in every panel: named once, on the left.
        axis.set_yticks(range(len(orderings)), orderings if index == 0 else [], fontsize=7)
        axis.set_title(f"{result.rows:,} applicants: p50 ms (first page)", fontsize=9)
    if image is not None:
        figure.colorbar(image, ax=axes[0].tolist(), label="p50, ms (log)", shrink=0.6)
    figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
