"""What each `leasestar` command does, once its arguments are parsed (`cli.py`).

Every command takes the parsed arguments and returns the exit status; a failure it can
name raises CommandError (or another one-line error `cli.main` reports). What only one
command needs is imported by it: `leasestar serve` starts its workers sooner without the
import pipeline, the export's encoder or the rate limiter's middleware loaded first.
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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from leasestar.config import ListenAddress
from leasestar.database import open_for_write, read_uri
from leasestar.log_lines import install_formatter
from leasestar.replica.layout import refuse_writes, replica_of
from leasestar.supervision import naming_supervisor, serve_in_fork
from leasestar.tokens import create_token, list_tokens, revoke_token
from leasestar.webhooks.retries import RetryPolicy, RetrySettingsError

if TYPE_CHECKING:
    import uvicorn  # imported when serving: the other commands do without it

DEMO_RECORDS: Final = 1000


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


def db_path(args: argparse.Namespace) -> Path:
    return Path(args.db)


def seed_database(path: Path, count: int, seed: int) -> int:
    """Add `count` deterministic synthetic applicants; returns how many rows were written."""
    from leasestar.applicants.pipeline import WORKER_MIN_RECORDS, WorkerFailed, write_generated
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
    finally:
        connection.close()  # its page cache freed before the copy is built
    write_columnar_copy(path)
    return counts.inserted + counts.updated


def write_columnar_copy(path: Path) -> None:
    """After a write: the columnar copy's file beside the database brought up to date when
    a start would otherwise build it or it is due (`ColumnarCopy.write_file`), so the next
    start maps it. What was written is committed either way: a file that cannot be
    written is one line, and a server builds it at its start."""
    from leasestar.allocator import release_freed_memory
    from leasestar.applicants.columnar_copy import ColumnarCopy  # numpy, for writes alone

    # What the write freed (its rows, the writer's page cache) handed back first: the
    # build's peak then adds to what the process still holds, not to what it once did.
    release_freed_memory()
    progress = Progress("columnar copy")
    progress.phase("writing it beside the database, if a start would otherwise build it")
    try:
        ColumnarCopy(path).write_file(only_if_due=True)
    except (OSError, sqlite3.Error) as error:
        cause = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        print(
            f"note: the columnar copy beside {path} was not written ({cause}); "
            "a server builds it when it starts",
            file=sys.stderr,
        )
    finally:
        progress.finish()


def open_to_read(path: Path) -> sqlite3.Connection:
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


def serve(args: argparse.Namespace) -> int:
    _check_port(args.host, args.port)
    metrics: ListenAddress | None = args.metrics_address
    if metrics is not None:
        if metrics.port == args.port:
            raise CommandError(f"--metrics-address needs a port other than the API's ({args.port})")
        _check_port(metrics.host, metrics.port)
    path = db_path(args)
    try:
        RetryPolicy.from_env()  # refused here in one line, not by each worker with a trace
    except RetrySettingsError as error:
        raise CommandError(str(error)) from None
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
        from leasestar.rate_limit import WindowCounter, counter_path

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
        return _run_server(args, path, threads_running=True)
    finally:
        follower.stop()


def _run_server(args: argparse.Namespace, path: Path, *, threads_running: bool = False) -> int:
    import uvicorn

    # The app factory and the connection protocol (leasestar/protocol.py) read their
    # settings from the environment, so worker processes (--workers > 1) get the same ones.
    metrics_address: ListenAddress | None = args.metrics_address
    os.environ.update(
        LEASESTAR_DB=str(path),
        LEASESTAR_READ_CONNECTIONS=str(args.read_connections),
        LEASESTAR_PAGE_CACHE_MB=str(args.page_cache_mb),
        LEASESTAR_LOG_FORMAT=args.log_format,
        LEASESTAR_RATE_LIMIT=args.rate_limit,
        LEASESTAR_TOKEN_CONCURRENCY=args.token_concurrency,
        LEASESTAR_COMPRESSION="on" if args.compression else "off",
        LEASESTAR_HEAD_TIMEOUT=str(args.head_timeout),
        LEASESTAR_SEND_TIMEOUT=str(args.send_timeout),
        LEASESTAR_KEEP_ALIVE_TIMEOUT=str(args.keep_alive_timeout),
        LEASESTAR_MAX_CONNECTIONS=str(args.max_connections),
        LEASESTAR_RESERVED_CONNECTIONS=str(args.reserved_connections),
        LEASESTAR_MAX_CONNECTIONS_PER_ADDRESS=str(args.max_connections_per_address),
        LEASESTAR_METRICS_ADDRESS=str(metrics_address or "off"),
    )
    config = uvicorn.Config(
        "leasestar.main:create_app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level="info",
        access_log=False,  # ours, without the Authorization header (leasestar/observability.py)
        timeout_graceful_shutdown=30,
        # Byte, time, connection and body limits on every connection (leasestar/protocol.py).
        http="leasestar.protocol:GuardedHttpToolsProtocol",
        ws="none",
        timeout_keep_alive=args.keep_alive_timeout,
        # No `Server: uvicorn` on every answer: it tells a scanner what runs here, and
        # every field of an answer costs uvicorn ~1 us to check and write.
        server_header=False,
    )
    install_formatter(args.log_format)  # the supervisor's lines, with --workers > 1
    listeners = [ListenAddress(args.host, args.port)]
    if metrics_address is not None:
        # One more listener for the same app, which serves /metrics there and only there.
        listeners.append(metrics_address)
    # On SIGTERM uvicorn drains the requests in flight, then raises the signal again, so
    # the process would end killed by it even after a clean drain. This handler is the
    # one uvicorn restores before raising it: a drained server exits 0, as it does with
    # --workers > 1 (and a SIGTERM that comes before uvicorn listens exits 0 at once).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    return run_server(config, listeners, threads_running=threads_running)


def run_server(
    config: uvicorn.Config, listeners: Sequence[ListenAddress], *, threads_running: bool = False
) -> int:
    """Serve `config`'s app on every listener, in `config.workers` worker processes under a
    parent that replaces one a signal kills (leasestar/supervision.py); the exit status.
    With `threads_running` (a replica's follower) no worker is forked from this process."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    sockets = [_listen(address) for address in listeners]
    if config.workers > 1 or threads_running:
        naming_supervisor(Multiprocess)(config, sockets=sockets).run()
        return 0

    def serve_one() -> int:
        server = uvicorn.Server(config)
        server.run(sockets=sockets)
        return 0 if server.started else 1

    return serve_in_fork(serve_one)


def _listen(address: ListenAddress) -> socket.socket:
    """A listening socket for uvicorn (as `uvicorn.Config.bind_socket` makes one), shared
    with the worker processes; a busy or invalid address is one line and exit 1."""
    try:
        family = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
    except OSError as error:
        raise CommandError(f"cannot listen on {address}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


def seed(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise CommandError("--count must be at least 1")
    refuse_writes(db_path(args))
    written = seed_database(db_path(args), args.count, args.seed)
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


def import_file(args: argparse.Namespace) -> int:
    from leasestar.applicants.pipeline import ImportRefused, WorkerFailed, import_ndjson

    refuse_writes(db_path(args))
    connection = open_for_write(db_path(args))
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
        connection.close()  # its page cache freed before the copy is built
    write_columnar_copy(db_path(args))
    counts = report.counts
    print(
        f"imported {counts.seen} applicants: {counts.inserted} new, {counts.updated} updated, "
        f"{counts.unchanged} unchanged"
    )
    return 0


def export(args: argparse.Namespace) -> int:
    from leasestar.applicants.ndjson import export_ndjson

    path = db_path(args)
    if not path.exists():
        raise CommandError(f"database does not exist: {path}")
    connection = open_to_read(path)
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


def token_create(args: argparse.Namespace) -> int:
    refuse_writes(db_path(args))
    connection = open_for_write(db_path(args))
    try:
        token = create_token(
            connection,
            args.name,
            tuple(args.integration or ()),
            tuple(getattr(args, "permission", None) or ()),
        )
    finally:
        connection.close()
    scope = ", ".join(sorted(set(args.integration))) if args.integration else "all integrations"
    print(f"token {args.name!r} ({scope}); it is shown once, store it now:")
    print(token)
    return 0


def token_list(args: argparse.Namespace) -> int:
    connection = open_to_read(db_path(args))
    try:
        tokens = list_tokens(connection)
    finally:
        connection.close()
    print(f"{'NAME':<24} {'CREATED':<25} {'REVOKED':<25} INTEGRATIONS")
    for info in tokens:
        scope = ",".join(info.integrations) if info.integrations is not None else "*"
        print(f"{info.name:<24} {info.created_at:<25} {info.revoked_at or '-':<25} {scope}")
    return 0


def token_revoke(args: argparse.Namespace) -> int:
    refuse_writes(db_path(args))
    connection = open_for_write(db_path(args))
    try:
        revoke_token(connection, args.name)
    finally:
        connection.close()
    print(f"revoked token {args.name!r}")
    return 0


def replicate(args: argparse.Namespace) -> int:
    from leasestar.replica.litestream import (  # only replication needs them
        check_url,
        replicate_command,
        require_litestream,
        write_config,
    )

    path = db_path(args)
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
