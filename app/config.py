"""Settings: one frozen dataclass, filled from `LEASESTAR_*` environment variables once."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_DB: Final = "./leasestar.db"


class SettingsError(ValueError):
    """An environment variable holds a value that cannot be used."""


def _int_env(name: str, default: int, low: int, high: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise SettingsError(f"{name} must be an integer between {low} and {high}, got {text!r}")
    return int(text)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the server needs to know, with the defaults a newcomer gets."""

    db_path: Path = Path(DEFAULT_DB)
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    read_connections: int = 2

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            db_path=Path(os.environ.get("LEASESTAR_DB") or DEFAULT_DB),
            host=os.environ.get("LEASESTAR_HOST") or "127.0.0.1",
            port=_int_env("LEASESTAR_PORT", 8000, 0, 65535),
            workers=_int_env("LEASESTAR_WORKERS", 1, 1, 64),
            read_connections=_int_env("LEASESTAR_READ_CONNECTIONS", 2, 1, 32),
        )
