"""What a report records about its run (machine, versions, commit), its sections rendered
from sections.toml, written into RESULTS.md; the options every script takes."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / "work"
RESULTS_MD = BENCH / "RESULTS.md"
SECTIONS = BENCH / "sections.toml"  # each section's title and texts, with {fields}
NICE = -10


def say(message: str) -> None:
    name = {"run": "bench"}.get(Path(sys.argv[0]).stem, Path(sys.argv[0]).stem)
    print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for package in ("litestar", "msgspec", "uvicorn", "uvloop", "httptools", "aiosqlite"):
        found[package] = "-"
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    out = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split()
    found["wrk"] = out[1] if len(out) > 1 else "?"
    return found


def describe_machine(*packages: str) -> str:
    """The machine in one line, e.g. "Xeon, 2 cores, 8 GiB, kernel 6.1; python 3.11.7"."""
    model = memory = "?"
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(line for line in lines if line.startswith("model name"))
        model = model.split(":", 1)[1].strip()
    with contextlib.suppress(OSError, IndexError, ValueError):
        memory = f"{int(Path('/proc/meminfo').read_text().split()[1]) / 2**20:.0f} GiB"
    text = f"{model}, {os.cpu_count()} cores, {memory}, kernel {platform.release()}"
    if packages:
        found = versions()
        text += "; " + ", ".join(f"{name} {found[name]}" for name in packages)
    return text


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def git_commit() -> str:
    """HEAD's short hash, and whether what is measured has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    dirty = git("status", "--porcelain", "--", "leasestar", "schema.sql", "pyproject.toml")
    changes = " + uncommitted changes" if dirty.strip() else ""
    return git("rev-parse", "--short", "HEAD").strip() + changes


def publish(section: str, path: Path | None = RESULTS_MD) -> None:
    """Print a section; at `path`, replace it between its BEGIN and END lines, every other
    byte kept (or append it)."""
    print(section)
    if path is None:
        return
    lines = section.strip("\n").splitlines()
    begin, end = lines[0], lines[-1]
    if not (begin.startswith("<!-- BEGIN ") and end.startswith("<!-- END ")):
        raise ValueError("a section starts with <!-- BEGIN x --> and ends with <!-- END x -->")
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + "\n".join(lines) + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
    path.write_text(text)
    name = begin.removeprefix("<!-- BEGIN ").removesuffix(" -->")
    print(f"wrote the {name} section of {shown(path)}", file=sys.stderr)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


@functools.cache
def _texts() -> dict[str, dict[str, str]]:
    return tomllib.loads(SECTIONS.read_text())


def text(key: str, part: str, **fields: Any) -> str:
    """A text of sections.toml, `{fields}` filled in, a paragraph (not a table) one line."""
    paragraphs = _texts()[key][part].strip().split("\n\n")
    kept = (p if p.startswith("|") else " ".join(p.split()) for p in paragraphs)
    return "\n\n".join(kept).format(**fields)


def table(header: str, rows: Iterable[Sequence[object]]) -> str:
    """`header` (a table's first two lines: a `columns` text of sections.toml), a line a row."""
    return "\n".join([header, *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)])


def section(key: str, *blocks: str, name: str | None = None, **fields: Any) -> str:
    """Section `name` (default `key`): its title and `intro`, then the non-empty `blocks`."""
    fields = {"when": now(), "commit": git_commit(), "machine": describe_machine(), **fields}
    fields.setdefault("command", command())
    name = name or key
    heading = "## " + text(key, "title", **fields)
    parts = [heading, text(key, "intro", **fields), *(b for b in blocks if b)]
    return f"<!-- BEGIN {name} -->\n" + "\n\n".join(parts) + f"\n<!-- END {name} -->"


@dataclass(frozen=True)
class Outputs:
    """Where a run writes its databases and logs, and the RESULTS.md it writes (None: none)."""

    work: Path = WORK
    results_md: Path | None = RESULTS_MD


OPTIONS: dict[str, dict[str, Any]] = {  # every script's: name -> add_argument's keywords
    "--smoke": {"type": Path, "metavar": "DIR", "help": "a small run, writing below DIR"},
    "--rows": {"type": int, "metavar": "N", "help": "seeded applicants"},
    "--out": {"type": Path, "help": "the RESULTS.md to write into (a directory: its RESULTS.md)"},
    "--no-write": {"action": "store_true", "help": "print the section, leave RESULTS.md as is"},
}


def options(
    parser: argparse.ArgumentParser,
    smoke: dict[str, Any],
    argv: list[str] | None = None,
    *,
    rows: int | list[int] | bool | None = False,
    out: str = "--out",
    nice: bool = True,
    quick: dict[str, Any] | None = None,
) -> tuple[argparse.Namespace, Outputs]:
    """`OPTIONS` added (`--rows` with the default `rows` unless False, `--out` as `out`,
    `--quick` where there are `quick` values) and parsed, `--smoke DIR` putting `smoke`
    over the values given, else `--quick` its values; wrk installed if missing and
    allowed; nice -10 where allowed, so that on a shared machine the measured processes
    (servers and wrk inherit it) keep their cores."""
    for name, keywords in OPTIONS.items():
        several = "+" if isinstance(rows, list) else None
        if name != "--rows":
            parser.add_argument(out if name == "--out" else name, **keywords)
        elif rows is not False:
            parser.add_argument(name, **keywords, default=rows, nargs=several)
    if quick is not None:
        given = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in quick.items())
        parser.add_argument("--quick", action="store_true", help=f"a shorter run: {given}")
    args = parser.parse_args(argv)
    if args.smoke or getattr(args, "quick", False):
        vars(args).update(smoke if args.smoke else quick or {})
    outputs = Outputs(args.smoke.resolve() / "work", below(args.smoke)) if args.smoke else Outputs()
    if given := getattr(args, out.lstrip("-")):
        outputs = Outputs(outputs.work, given if given.suffix == ".md" else below(given))
    if not shutil.which("wrk") and shutil.which("apt-get") and os.geteuid() == 0:
        say("wrk is missing: apt-get update && apt-get install -y wrk")
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False)
    if not shutil.which("wrk"):
        sys.exit("wrk is required: apt-get install -y wrk, brew install wrk, or from its source.")
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE if nice else os.getpriority(os.PRIO_PROCESS, 0))
    return args, Outputs(outputs.work, None if args.no_write else outputs.results_md)


def below(directory: Path) -> Path:
    """DIR/RESULTS.md, a copy of benchmarks/RESULTS.md where there is none yet."""
    directory.mkdir(parents=True, exist_ok=True)
    results_md = directory.resolve() / RESULTS_MD.name
    if not results_md.exists():
        shutil.copyfile(RESULTS_MD, results_md)
    return results_md


def command() -> str:
    return " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
