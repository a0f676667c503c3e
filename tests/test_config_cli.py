"""Settings from `LEASESTAR_*` variables and `leasestar` flags (config.py, cli.py):
every setting reachable both ways and listed in the README, help and version complete,
a bad value one line on stderr and a non-zero exit."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from leasestar import cli, commands
from leasestar.config import ListenAddress, RateLimit, Settings, SettingsError
from leasestar.database import open_for_write

ROOT = Path(__file__).resolve().parent.parent
LEASESTAR = Path(sys.executable).with_name("leasestar")

# Each setting: its variable, its flag, a valid value, what it becomes, its default.
SETTINGS: dict[str, tuple[str, str, str, Any, str]] = {
    "db_path": ("LEASESTAR_DB", "--db", "/tmp/x.db", Path("/tmp/x.db"), "./leasestar.db"),
    "host": ("LEASESTAR_HOST", "--host", "0.0.0.0", "0.0.0.0", "127.0.0.1"),
    "port": ("LEASESTAR_PORT", "--port", "9001", 9001, "8000"),
    "workers": ("LEASESTAR_WORKERS", "--workers", "3", 3, "1"),
    "read_connections": ("LEASESTAR_READ_CONNECTIONS", "--read-connections", "3", 3, "4"),
    "page_cache_mb": ("LEASESTAR_PAGE_CACHE_MB", "--page-cache-mb", "0", 0, "32"),
    "log_format": ("LEASESTAR_LOG_FORMAT", "--log-format", "text", "text", "json"),
    "rate_limit": (
        "LEASESTAR_RATE_LIMIT",
        "--rate-limit",
        "5/second",
        RateLimit(5, "second"),
        "600/minute",
    ),
    "token_concurrency": ("LEASESTAR_TOKEN_CONCURRENCY", "--token-concurrency", "7", 7, "2"),
    "compression": ("LEASESTAR_COMPRESSION", "--compression", "off", False, "on"),
    "head_timeout": ("LEASESTAR_HEAD_TIMEOUT", "--head-timeout", "7", 7, "10"),
    "send_timeout": ("LEASESTAR_SEND_TIMEOUT", "--send-timeout", "45", 45, "30"),
    "keep_alive_timeout": ("LEASESTAR_KEEP_ALIVE_TIMEOUT", "--keep-alive-timeout", "9", 9, "5"),
    "max_connections": ("LEASESTAR_MAX_CONNECTIONS", "--max-connections", "50", 50, "1000"),
    "reserved_connections": (
        "LEASESTAR_RESERVED_CONNECTIONS",
        "--reserved-connections",
        "20",
        20,
        "100",
    ),
    "max_connections_per_address": (
        "LEASESTAR_MAX_CONNECTIONS_PER_ADDRESS",
        "--max-connections-per-address",
        "30",
        30,
        "100",
    ),
    "metrics_address": (
        "LEASESTAR_METRICS_ADDRESS",
        "--metrics-address",
        "127.0.0.1:9464",
        ListenAddress("127.0.0.1", 9464),
        "off",
    ),
}
INVALID = {
    "LEASESTAR_PORT": "http",
    "LEASESTAR_WORKERS": "0",
    "LEASESTAR_READ_CONNECTIONS": "many",
    "LEASESTAR_PAGE_CACHE_MB": "65537",
    "LEASESTAR_LOG_FORMAT": "yaml",
    "LEASESTAR_RATE_LIMIT": "fast",
    "LEASESTAR_TOKEN_CONCURRENCY": "0",
    "LEASESTAR_COMPRESSION": "maybe",
    "LEASESTAR_HEAD_TIMEOUT": "0",
    "LEASESTAR_SEND_TIMEOUT": "3601",
    "LEASESTAR_KEEP_ALIVE_TIMEOUT": "301",
    "LEASESTAR_MAX_CONNECTIONS": "lots",
    "LEASESTAR_RESERVED_CONNECTIONS": "-1",
    "LEASESTAR_MAX_CONNECTIONS_PER_ADDRESS": "0",
    "LEASESTAR_METRICS_ADDRESS": "127.0.0.1",
}


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A private copy of the environment without LEASESTAR_* (serve writes to it)."""
    copy = {k: v for k, v in os.environ.items() if not k.startswith("LEASESTAR_")}
    monkeypatch.setattr(os, "environ", copy)
    return copy


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_every_setting_is_covered_here() -> None:
    assert {field.name for field in dataclasses.fields(Settings)} == set(SETTINGS)


# --- help and version -------------------------------------------------------------------


def test_top_level_help_and_version_from_the_console_script() -> None:
    shown = subprocess.run(
        [LEASESTAR, "--help"], capture_output=True, text=True, check=True, timeout=60
    )
    for command in ("serve", "seed", "import", "export", "token", "replicate"):
        assert re.search(rf"^\s+{command}\s+\S", shown.stdout, re.MULTILINE), command
    assert "--version" in shown.stdout
    printed = subprocess.run(
        [LEASESTAR, "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    # The first line is leasestar's; the second litestream's, or how to install it.
    first, second = printed.stdout.splitlines()
    assert first == f"leasestar {version('leasestar')}"
    assert second.startswith("litestream ")


def test_serve_help_names_every_setting_its_variable_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = " ".join(_help(capsys, "serve").split())  # unwrap argparse's line breaks
    for variable, flag, _, _, default in SETTINGS.values():
        assert flag in shown, flag
        assert f"env {variable}" in shown, variable
        assert f"default {default}" in shown, (variable, default)
    assert "--no-compression" in shown
    assert "--demo-token" in shown


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("seed",), ("--count", "--seed", "--db")),
        (("import",), ("FILE", "--db")),
        (("export",), ("FILE", "--db")),
        (("token",), ("create", "list", "revoke")),
        (("token", "create"), ("--name", "--integration", "--db")),
        (("token", "list"), ("--db",)),
        (("token", "revoke"), ("NAME", "--db")),
    ],
)
def test_each_command_has_complete_help(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    shown = " ".join(_help(capsys, *argv).split())
    assert shown.startswith(f"usage: leasestar {' '.join(argv)}")
    for word in expected:
        assert word in shown, word
    if "--db" in expected:
        assert "env LEASESTAR_DB, default ./leasestar.db" in shown


# --- where each setting comes from ------------------------------------------------------


def test_defaults_without_any_variable() -> None:
    assert Settings.from_env() == Settings(
        db_path=Path("./leasestar.db"),
        host="127.0.0.1",
        port=8000,
        workers=1,
        read_connections=4,
        page_cache_mb=32,
        log_format="json",
        rate_limit=RateLimit(600, "minute"),
        compression=True,
        head_timeout=10,
        send_timeout=30,
        keep_alive_timeout=5,
        max_connections=1000,
        reserved_connections=100,
        max_connections_per_address=100,
        metrics_address=None,
    )


def test_every_variable_is_read(environment: dict[str, str]) -> None:
    for variable, _, text, _, _ in SETTINGS.values():
        environment[variable] = text
    settings = Settings.from_env()
    for field, (*_, expected, _) in SETTINGS.items():
        assert getattr(settings, field) == expected, field


@pytest.mark.parametrize("text", ["off", "0", "none", "OFF"])
def test_rate_limit_can_be_turned_off(environment: dict[str, str], text: str) -> None:
    environment["LEASESTAR_RATE_LIMIT"] = text
    assert Settings.from_env().rate_limit is None


def test_a_flag_wins_over_its_variable(environment: dict[str, str]) -> None:
    environment.update(LEASESTAR_PORT="9000", LEASESTAR_LOG_FORMAT="off", LEASESTAR_DB="env.db")
    parser = cli.build_parser(Settings.from_env())
    from_env = parser.parse_args(["serve"])
    assert (from_env.port, from_env.log_format, from_env.db) == (9000, "off", "env.db")
    flagged = parser.parse_args(
        ["serve", "--port", "9100", "--log-format", "text", "--db", "flag.db"]
    )
    assert (flagged.port, flagged.log_format, flagged.db) == (9100, "text", "flag.db")


def test_serve_hands_every_flag_to_the_server(
    tmp_path: Path, environment: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers are separate processes: the settings reach them through the environment."""
    calls: list[tuple[Any, list[ListenAddress]]] = []

    def run_server(config: Any, listeners: list[ListenAddress], **options: bool) -> int:
        calls.append((config, list(listeners)))
        return 0

    monkeypatch.setattr(commands, "run_server", run_server)
    # Nothing listens here, so whether the port is free is not the question (test_faults).
    monkeypatch.setattr(commands, "_check_port", lambda host, port: None)
    database = tmp_path / "served.db"
    open_for_write(database).close()  # existing: no demo seeding
    argv = ["serve", "--db", str(database)]
    for field, (_, flag, text, _, _) in SETTINGS.items():
        if field == "compression":
            argv.append("--no-compression")
        elif field != "db_path":
            argv += [flag, text]
    assert cli.main(argv) == 0
    ((config, listeners),) = calls
    assert (config.host, config.port, config.workers) == ("0.0.0.0", 9001, 3)
    assert config.factory is True
    assert config.timeout_keep_alive == 9
    assert config.http == "leasestar.protocol:GuardedHttpToolsProtocol"
    assert listeners == [ListenAddress("0.0.0.0", 9001), ListenAddress("127.0.0.1", 9464)]
    served = Settings.from_env()  # what create_app_from_env builds in each worker
    assert served.db_path == database
    assert served.read_connections == 3
    assert served.page_cache_mb == 0
    assert served.log_format == "text"
    assert served.rate_limit == RateLimit(5, "second")
    assert served.compression is False
    assert (served.head_timeout, served.keep_alive_timeout, served.max_connections) == (7, 9, 50)
    assert served.send_timeout == 45
    assert (served.reserved_connections, served.max_connections_per_address) == (20, 30)
    assert served.metrics_address == ListenAddress("127.0.0.1", 9464)


def test_the_metrics_address_needs_its_own_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "served.db"
    open_for_write(database).close()
    argv = ["serve", "--db", str(database), "--port", "9300", "--metrics-address", "[::1]:9300"]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "leasestar: --metrics-address needs a port other than the API's (9300)"
    ]


def test_workers_auto_is_one_per_core_from_the_flag_and_the_variable(
    tmp_path: Path, environment: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = min(os.cpu_count() or 1, 64)
    environment["LEASESTAR_WORKERS"] = "AUTO"
    assert Settings.from_env().workers == cores
    del environment["LEASESTAR_WORKERS"]
    calls: list[Any] = []
    monkeypatch.setattr(
        commands, "run_server", lambda config, listeners, **options: calls.append(config) or 0
    )
    # Nothing listens here, so whether the port is free is not the question (test_faults).
    monkeypatch.setattr(commands, "_check_port", lambda host, port: None)
    database = tmp_path / "served.db"
    open_for_write(database).close()
    assert cli.main(["serve", "--db", str(database), "--workers", "auto"]) == 0
    assert [config.workers for config in calls] == [cores]


# --- invalid values ---------------------------------------------------------------------


@pytest.mark.parametrize(("variable", "value"), INVALID.items())
def test_an_invalid_variable_is_one_line_and_a_non_zero_exit(
    environment: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
) -> None:
    environment[variable] = value
    status = cli.main(["token", "list", "--db", "unused.db"])
    out, err = capsys.readouterr()
    assert status != 0
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"leasestar: {variable} must be"), line
    assert repr(value) in line


def test_an_invalid_variable_through_the_console_script(tmp_path: Path) -> None:
    environment = {**os.environ, "LEASESTAR_LOG_FORMAT": "xml"}
    result = subprocess.run(
        [LEASESTAR, "seed", "--count", "1", "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "leasestar: LEASESTAR_LOG_FORMAT must be json, text or off; got 'xml'"
    ]
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--port", "70000", "must be an integer between 0 and 65535"),
        ("--workers", "0", "must be an integer between 1 and 64"),
        ("--read-connections", "100", "must be an integer between 1 and 32"),
        ("--log-format", "xml", "must be json, text or off"),
        ("--rate-limit", "lots", "must be N/second, N/minute, N/hour, N/day or off"),
    ],
)
def test_an_invalid_flag_names_itself(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", flag, value])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"leasestar serve: error: argument {flag}")
    assert message in error


# The integer settings' inclusive bounds, as the README states them.
INTEGER_BOUNDS = {
    ("LEASESTAR_PORT", "--port"): (0, 65535),
    ("LEASESTAR_WORKERS", "--workers"): (1, 64),
    ("LEASESTAR_READ_CONNECTIONS", "--read-connections"): (1, 32),
    ("LEASESTAR_PAGE_CACHE_MB", "--page-cache-mb"): (0, 65536),
}


@pytest.mark.parametrize(("names", "bounds"), INTEGER_BOUNDS.items())
def test_a_flag_and_its_variable_accept_the_same_integers(
    environment: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    names: tuple[str, str],
    bounds: tuple[int, int],
) -> None:
    """Found by review: `--read-connections 100` was accepted by the flag, handed to the
    server through its variable, and refused there with a traceback."""
    variable, flag = names
    low, high = bounds
    for value in (low - 1, low, high, high + 1):
        inside = low <= value <= high
        environment[variable] = str(value)
        if inside:
            Settings.from_env()
        else:
            with pytest.raises(SettingsError, match=f"between {low} and {high}"):
                Settings.from_env()
        del environment[variable]
        if value < 0:
            continue  # argparse reads "-1" as an option, not a value
        parser = cli.build_parser(Settings())
        if inside:
            parser.parse_args(["serve", flag, str(value)])
        else:
            with pytest.raises(SystemExit):
                parser.parse_args(["serve", flag, str(value)])
            assert f"must be an integer between {low} and {high}" in capsys.readouterr().err


# --- the README ---------------------------------------------------------------------------


def test_the_readme_lists_every_setting_with_its_flag_and_default() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for variable, flag, _, _, default in SETTINGS.values():
        row = next(
            (line for line in readme.splitlines() if line.startswith(f"| `{variable}`")), None
        )
        assert row is not None, variable
        assert f"`{default}`" in row, (variable, default)
        assert f"`{flag}" in row, (variable, flag)
