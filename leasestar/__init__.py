"""leasestar: a read API for property-management applicant records over embedded SQLite."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("leasestar")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
