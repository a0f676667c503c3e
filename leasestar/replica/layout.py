"""The files of a replica, beside its database, and how a database knows it is one.

A replica's database `edge.db` has a directory `edge.db-replica/` beside it:

- `replica.json`: the store URL it follows and the identity of the primary database it
  copies. Its presence is what makes `edge.db` a replica: writing commands refuse it.
- `follow-N/edge.db`: the file `litestream restore -f` writes; nobody serves it. A new
  directory for every follower started, so a follower that outlived its server can only
  write into a deleted directory.
- `status.json`: what the follower last saw (the served transaction, the store's), read
  by `/health` and `/metrics` in every worker process.
- `litestream.yml`: the store's settings for `litestream` (it may hold a password).
- `lock`: held by the one `leasestar serve` that follows into this database.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import msgspec

FOLLOWED_NAME: Final = "edge.db"


class ReplicaError(Exception):
    """A replica cannot be started or used as asked; the message is one line."""


class ReplicaMarker(msgspec.Struct, frozen=True):
    """`replica.json`: the store followed and the primary it holds."""

    of: str
    primary: str  # `apply.primary_identity` of the primary's database


@dataclass(frozen=True, slots=True)
class ReplicaLayout:
    """The paths beside one replica database."""

    database: Path

    @property
    def directory(self) -> Path:
        return self.database.with_name(self.database.name + "-replica")

    @property
    def marker_path(self) -> Path:
        return self.directory / "replica.json"

    @property
    def status_path(self) -> Path:
        return self.directory / "status.json"

    @property
    def config_path(self) -> Path:
        return self.directory / "litestream.yml"

    @property
    def clean_path(self) -> Path:
        """Present while no server follows into the database: the last one stopped cleanly."""
        return self.directory / "stopped-cleanly"

    def follow_directory(self, number: int) -> Path:
        return self.directory / f"follow-{number}"

    def follow_directories(self) -> list[Path]:
        return sorted(self.directory.glob("follow-*"))

    def marker(self) -> ReplicaMarker | None:
        """The marker, or None when the database is not a replica."""
        try:
            return msgspec.json.decode(self.marker_path.read_bytes(), type=ReplicaMarker)
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError) as error:
            raise ReplicaError(f"cannot read {self.marker_path}: {error}") from None

    def write_marker(self, marker: ReplicaMarker) -> None:
        write_atomically(self.marker_path, msgspec.json.encode(marker))

    def lock(self) -> IO[bytes]:
        """Hold the follower's lock (released when the returned file is closed)."""
        self.directory.mkdir(exist_ok=True)
        handle = (self.directory / "lock").open("wb")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise ReplicaError(
                f"another leasestar serve already follows into {self.database}"
            ) from None
        return handle


def write_atomically(path: Path, content: bytes) -> None:
    """Replace `path` with `content` so that a reader sees the old file or the new one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(content)
    os.replace(partial, path)


def replica_of(database: Path) -> str | None:
    """The store URL a database follows, or None for a primary."""
    marker = ReplicaLayout(database).marker()
    return None if marker is None else marker.of


def refuse_writes(database: Path) -> None:
    """Raise when `database` is a replica: only its primary may be written."""
    url = replica_of(database)
    if url is not None:
        raise ReplicaError(
            f"{database} is a replica of {url}: it is read-only; write on the primary"
        )
