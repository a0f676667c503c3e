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
from provenance import section, table, text

CHART_NAME = "matrix-bench.png"


def _cell(c: Combination) -> str:
    if not c.latencies:
        return "-"
    text = f"{c.p50:.1f} / {c.p99:.1f}"
    return f"**{text}**" if c.p50 > TARGET_P50_MS else text


def _database(result: MatrixResult) -> str:
    """One database's combinations, its worst and its slowest requests, as markdown."""
    worst = result.worst
    requests = [len(c.samples) for c in result.combinations]
    problems = (
        f"{len(result.problems)} problems: " + "; ".join(result.problems[:5])
        if result.problems
        else "all exact."
    )
    size = text(
        "matrix",
        "size",
        combinations=len(result.combinations),
        fewest=min(requests),
        most=max(requests),
        requests=sum(requests),
        seconds=result.seconds,
        dropped=result.dropped,
        first_seconds=result.first_seconds,
        worst_ordering=worst.ordering,
        worst_kind=worst.kind,
        worst_p50=worst.p50,
        worst_p99=worst.p99,
        over=sum(1 for c in result.combinations if c.latencies and c.p50 > TARGET_P50_MS),
        target_p50=TARGET_P50_MS,
        p99_all=result.p99_all,
        target_p99=TARGET_P99_MS,
        checked=result.checked,
        problems=problems,
    )
    by_key = {(c.ordering, c.kind): c for c in result.combinations}
    orderings = dict.fromkeys(c.ordering for c in result.combinations)
    grid = table(
        "| order-by | " + " | ".join(KINDS) + " |",
        "|---|" + "---:|" * len(KINDS),
        ([f"`{o}`", *(_cell(by_key[o, kind]) for kind in KINDS)] for o in orderings),
    )
    samples = (s for c in result.combinations for s in c.samples)
    slowest = sorted(samples, key=lambda s: -s.ms)[:5]
    listed = "\n".join(f"- {s.ms:,.1f} ms: {s.request.shown()}" for s in slowest)
    return "\n\n".join([f"### {result.rows:,} applicants", size, grid, "Slowest requests:", listed])


def markdown(results: list[MatrixResult], command: str, when: str, commit: str) -> str:
    return section(
        "matrix",
        *(_database(result) for result in results),
        f"![p50 of each combination]({CHART_NAME})",
        when=when,
        commit=commit,
        command=command,
        scope_tokens=SCOPE_TOKENS,
        client_core=CLIENT_CORE,
        server_core=SERVER_CORE,
        slow_ms=SLOW_MS,
        target_p50=TARGET_P50_MS,
    )


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
