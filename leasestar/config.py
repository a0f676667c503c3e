"""Settings: one frozen dataclass, filled from `LEASESTAR_*` environment variables once.

The command line (`leasestar serve --...`) fills the same fields; a flag wins over its
variable. Every setting, its variable and its default are listed in the README.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast, get_args

DEFAULT_DB: Final = "./leasestar.db"
DEFAULT_RATE_LIMIT: Final = "600/minute"
# Requests of one token a worker process serves at once (with the rate limit on); more
# wait their turn. Fewer than the read connections (4), so one token's expensive
# requests leave the others some, and a core (benchmarks/RESULTS.md, "fairness").
DEFAULT_TOKEN_CONCURRENCY: Final = 2
# Connection limits for a server facing the internet alone (issue 18; README, Security):
# a request head must be complete this many seconds after the connection opened or its
# previous response was sent; a client that reads nothing of its response for
# DEFAULT_SEND_TIMEOUT is disconnected; an idle kept-alive connection is closed after
# DEFAULT_KEEP_ALIVE_TIMEOUT; past DEFAULT_MAX_CONNECTIONS open connections a worker
# answers 503.
DEFAULT_HEAD_TIMEOUT: Final = 10
DEFAULT_SEND_TIMEOUT: Final = 30
DEFAULT_KEEP_ALIVE_TIMEOUT: Final = 5
DEFAULT_MAX_CONNECTIONS: Final = 1000
# Of those connections, the last DEFAULT_RESERVED_CONNECTIONS serve only requests that
# carry a bearer token, and one client address holds at most
# DEFAULT_MAX_CONNECTIONS_PER_ADDRESS (issue 29: unauthenticated sockets from a few
# addresses took the whole cap, and every authenticated request was answered 503).
DEFAULT_RESERVED_CONNECTIONS: Final = 100
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: Final = 100
# ~150 pages of 100 whole records (~205 KB each), at a bounded cost of memory per worker:
# the pages clients ask for again (README, "Pages asked for again").
DEFAULT_PAGE_CACHE_MB: Final = 32

LogFormat = Literal["json", "text", "off"]
RateUnit = Literal["second", "minute", "hour", "day"]
_RATE = re.compile(r"([1-9][0-9]{0,8})/(second|minute|hour|day)")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A setting holds a value that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `requests` per `unit` for each token."""

    requests: int
    unit: RateUnit


def parse_rate_limit(text: str, name: str = "LEASESTAR_RATE_LIMIT") -> RateLimit | None:
    """`N/unit` (unit: second, minute, hour, day), or `off`."""
    text = text.strip().lower()
    if text in ("off", "0", "none"):
        return None
    match = _RATE.fullmatch(text)
    if match is None:
        raise SettingsError(
            f"{name} must be N/second, N/minute, N/hour, N/day or off; got {text!r}"
        )
    return RateLimit(int(match[1]), cast(RateUnit, match[2]))


def parse_log_format(text: str, name: str = "LEASESTAR_LOG_FORMAT") -> LogFormat:
    text = text.strip().lower()
    if text not in get_args(LogFormat):
        raise SettingsError(f"{name} must be json, text or off; got {text!r}")
    return cast(LogFormat, text)


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A TCP address to listen on, `host:port` (`[v6]:port` for IPv6)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_ADDRESS = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):([0-9]{1,5})")


def parse_listen_address(
    text: str, name: str = "LEASESTAR_METRICS_ADDRESS"
) -> ListenAddress | None:
    """`HOST:PORT` (port 1 to 65535; `[::1]:PORT` for IPv6), or `off`."""
    text = text.strip()
    if text.lower() in ("", "off", "none"):
        return None
    match = _ADDRESS.fullmatch(text)
    if match is None or not 1 <= int(match[3]) <= 65535:
        raise SettingsError(f"{name} must be HOST:PORT (port 1 to 65535) or off; got {text!r}")
    return ListenAddress(match[1] or match[2], int(match[3]))


# Inclusive bounds of the integer settings, shared by their variables and their flags.
PORT_RANGE: Final = (0, 65535)
WORKERS_RANGE: Final = (1, 64)
READ_CONNECTIONS_RANGE: Final = (1, 32)
HEAD_TIMEOUT_RANGE: Final = (1, 300)  # seconds
SEND_TIMEOUT_RANGE: Final = (1, 3600)  # seconds
KEEP_ALIVE_TIMEOUT_RANGE: Final = (1, 300)  # seconds
MAX_CONNECTIONS_RANGE: Final = (1, 100_000)  # per worker process
RESERVED_CONNECTIONS_RANGE: Final = (0, 100_000)  # per worker process
MAX_CONNECTIONS_PER_ADDRESS_RANGE: Final = (1, 100_000)  # per worker process
TOKEN_CONCURRENCY_RANGE: Final = (1, 10_000)  # per token and worker process
PAGE_CACHE_MB_RANGE: Final = (0, 65_536)  # per worker process


def _int_env(name: str, default: int, bounds: tuple[int, int]) -> int:
    low, high = bounds
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise SettingsError(f"{name} must be an integer between {low} and {high}, got {text!r}")
    return int(text)


def auto_workers() -> int:
    """`--workers auto`: one worker per core the machine reports (`os.cpu_count()`)."""
    return max(1, min(os.cpu_count() or 1, WORKERS_RANGE[1]))


def parse_workers(text: str, name: str = "LEASESTAR_WORKERS") -> int:
    """A number of worker processes within WORKERS_RANGE, or `auto`."""
    text = text.strip().lower()
    if text == "auto":
        return auto_workers()
    low, high = WORKERS_RANGE
    if not text.isdigit() or not low <= int(text) <= high:
        raise SettingsError(
            f"{name} must be an integer between {low} and {high} or auto, got {text!r}"
        )
    return int(text)


def parse_token_concurrency(text: str, name: str = "LEASESTAR_TOKEN_CONCURRENCY") -> int | None:
    """A number of requests within TOKEN_CONCURRENCY_RANGE, or `off`."""
    text = text.strip().lower()
    if text in ("off", "none"):
        return None
    low, high = TOKEN_CONCURRENCY_RANGE
    if not text.isdigit() or not low <= int(text) <= high:
        raise SettingsError(
            f"{name} must be an integer between {low} and {high} or off, got {text!r}"
        )
    return int(text)


def _bool_env(name: str, default: bool) -> bool:
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text not in _TRUE + _FALSE:
        raise SettingsError(f"{name} must be on or off, got {text!r}")
    return text in _TRUE


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the server needs to know, with the defaults a newcomer gets."""

    db_path: Path = Path(DEFAULT_DB)
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    read_connections: int = 4
    # Pages asked for again, kept per worker while the data has not changed
    # (`applicants/caches.py`): served without reading or decompressing anything.
    page_cache_mb: int = DEFAULT_PAGE_CACHE_MB
    log_format: LogFormat = "json"
    # Off for an app built in code (tests, embedding); `from_env`, which `leasestar
    # serve` uses, turns it on with DEFAULT_RATE_LIMIT unless told otherwise.
    rate_limit: RateLimit | None = None
    # A token's requests in progress per worker process, while the rate limit is on.
    token_concurrency: int | None = DEFAULT_TOKEN_CONCURRENCY
    compression: bool = True
    head_timeout: int = DEFAULT_HEAD_TIMEOUT
    send_timeout: int = DEFAULT_SEND_TIMEOUT
    keep_alive_timeout: int = DEFAULT_KEEP_ALIVE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # At most half of max_connections is reserved, whatever this says
    # (`protocol.reserved_share`), so a small cap still serves the unauthenticated.
    reserved_connections: int = DEFAULT_RESERVED_CONNECTIONS
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    # Where `/metrics` is served; None: nowhere. Never on the API's own listener.
    metrics_address: ListenAddress | None = None

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            db_path=Path(os.environ.get("LEASESTAR_DB") or DEFAULT_DB),
            host=os.environ.get("LEASESTAR_HOST") or "127.0.0.1",
            port=_int_env("LEASESTAR_PORT", 8000, PORT_RANGE),
            workers=parse_workers(os.environ.get("LEASESTAR_WORKERS") or "1"),
            read_connections=_int_env("LEASESTAR_READ_CONNECTIONS", 4, READ_CONNECTIONS_RANGE),
            page_cache_mb=_int_env(
                "LEASESTAR_PAGE_CACHE_MB", DEFAULT_PAGE_CACHE_MB, PAGE_CACHE_MB_RANGE
            ),
            log_format=parse_log_format(os.environ.get("LEASESTAR_LOG_FORMAT") or "json"),
            rate_limit=parse_rate_limit(
                os.environ.get("LEASESTAR_RATE_LIMIT") or DEFAULT_RATE_LIMIT
            ),
            token_concurrency=parse_token_concurrency(
                os.environ.get("LEASESTAR_TOKEN_CONCURRENCY") or str(DEFAULT_TOKEN_CONCURRENCY)
            ),
            compression=_bool_env("LEASESTAR_COMPRESSION", True),
            head_timeout=_int_env(
                "LEASESTAR_HEAD_TIMEOUT", DEFAULT_HEAD_TIMEOUT, HEAD_TIMEOUT_RANGE
            ),
            send_timeout=_int_env(
                "LEASESTAR_SEND_TIMEOUT", DEFAULT_SEND_TIMEOUT, SEND_TIMEOUT_RANGE
            ),
            keep_alive_timeout=_int_env(
                "LEASESTAR_KEEP_ALIVE_TIMEOUT", DEFAULT_KEEP_ALIVE_TIMEOUT, KEEP_ALIVE_TIMEOUT_RANGE
            ),
            max_connections=_int_env(
                "LEASESTAR_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS_RANGE
            ),
            reserved_connections=_int_env(
                "LEASESTAR_RESERVED_CONNECTIONS",
                DEFAULT_RESERVED_CONNECTIONS,
                RESERVED_CONNECTIONS_RANGE,
            ),
            max_connections_per_address=_int_env(
                "LEASESTAR_MAX_CONNECTIONS_PER_ADDRESS",
                DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
                MAX_CONNECTIONS_PER_ADDRESS_RANGE,
            ),
            metrics_address=parse_listen_address(
                os.environ.get("LEASESTAR_METRICS_ADDRESS") or "off"
            ),
        )
