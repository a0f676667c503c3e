"""Import and seed runs: records flow from a source, through a worker process, to the writer.

Past a few thousand records a second process parses (import) or generates (seed) while
this one writes, so the two share two cores.

Batches travel as msgpack (msgspec), not pickle: several times cheaper for lists of
tuples of strings and bytes, and typed on arrival. The worker is spawned, not forked;
like any multiprocessing spawn, a script that calls these functions must guard its
entry point with `if __name__ == "__main__"`. It never outlives the process that
started it, even one killed with SIGKILL. See docs/write-path.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import IO, Any, Final

import msgspec

from leasestar.applicants.ndjson import Outcome, parse_batch, read_lines
from leasestar.applicants.prepared import Generated, Prepared, prepare_generated
from leasestar.applicants.writer import (
    ApplicantWriter,
    ProgressReporter,
    RecordError,
    WriteCounts,
)

# Lines an import parses itself before a worker process takes over (a small file never
# pays for starting one: ~0.2 s).
WORKER_AFTER_LINES: Final = 8192
PROGRESS_EVERY: Final = 4096
# Records a seed generates itself rather than in a worker.
WORKER_MIN_RECORDS: Final = 20_000
WORKER_BATCH: Final = 512
WORKER_IN_FLIGHT: Final = 4
WORKER_POLL_SECONDS: Final = 0.5
WORKER_PIPE_BYTES: Final = 1 << 20  # Linux's default limit for an unprivileged pipe
MAX_REPORTED_ERRORS: Final = 5

# Each message is one tag byte and its payload.
_MESSAGES = msgspec.msgpack.Encoder()
_LINES = msgspec.msgpack.Decoder(list[tuple[int, bytes | None]])
_OUTCOMES = msgspec.msgpack.Decoder(list[Outcome])
_PREPARED = msgspec.msgpack.Decoder(list[Prepared])
_BATCH, _END, _FAILED = b"B", b"E", b"F"


class WorkerFailed(Exception):
    """The worker process failed or stopped; the message is one line."""


class Worker:
    """A spawned process running `target(parent_pid, inbox, results, *args)`.

    The parent feeds `inbox` (a queue: its feeder thread writes, so feeding never
    blocks on a busy worker) and reads `results`, a pipe the worker writes itself: a
    full pipe holds the worker back, which bounds memory, and costs it no extra thread.
    """

    def __init__(
        self,
        target: Callable[..., None],
        *args: Any,
        decoder: msgspec.msgpack.Decoder[Any],
        inbox: bool = False,
    ) -> None:
        # spawn, not fork: the parent may hold SQLite connections and other threads.
        context = multiprocessing.get_context("spawn")
        self._decoder = decoder
        self._inbox: multiprocessing.Queue[bytes | None] | None = context.Queue() if inbox else None
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=target, args=(os.getpid(), self._inbox, sender, *args), daemon=True
        )
        self._process.start()
        sender.close()  # the worker holds the only writing end: its exit is our EOF
        _widen(self._results.fileno())
        if self._inbox is not None:
            _widen(self._inbox._writer.fileno())  # type: ignore[attr-defined]

    def send(self, batch: Any) -> None:
        """Hand the worker a batch (msgpack-encoded here)."""
        assert self._inbox is not None
        self._inbox.put(_MESSAGES.encode(batch))

    def receive(self) -> Any:
        """The next batch, decoded; None once the worker has sent everything."""
        try:
            while not self._results.poll(WORKER_POLL_SECONDS):
                if not self._process.is_alive():
                    raise EOFError
            message = self._results.recv_bytes()
        except EOFError:
            self._process.join(WORKER_POLL_SECONDS)
            raise WorkerFailed(
                f"the worker process stopped (exit code {self._process.exitcode})"
            ) from None
        tag, payload = message[:1], memoryview(message)[1:]
        if tag == _FAILED:
            raise WorkerFailed(f"the worker process failed: {bytes(payload).decode()}")
        if tag == _END:
            return None
        return self._decoder.decode(payload)

    def close(self) -> None:
        """Stop the process now (its work is either all received or no longer wanted)."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._process.close()
        self._results.close()
        if self._inbox is not None:
            self._inbox.cancel_join_thread()  # never wait to feed a process that is gone
            self._inbox.close()


def _widen(pipe: int) -> None:
    """Let a pipe hold a whole batch (Linux): one write and one read, not sixteen each."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, WORKER_PIPE_BYTES)


def run_worker(parent: int, results: Connection, work: Callable[[], None]) -> None:
    """Common to workers: the parent handles ^C; any failure goes back as one line.

    A watchdog thread ends the process as soon as the parent is gone (killed, say),
    whatever the work is blocked on, so a worker never outlives its import.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:  # `parent` is the pid it had before starting us: no race
        while os.getppid() == parent:
            time.sleep(WORKER_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    try:
        work()
    except BaseException as error:  # reported to the parent, never printed here
        with contextlib.suppress(OSError):
            results.send_bytes(_FAILED + f"{type(error).__name__}: {error}".encode())


def send_batch(results: Connection, batch: Any) -> None:
    """From a worker: one batch of results to the parent."""
    results.send_bytes(_BATCH + _MESSAGES.encode(batch))


@dataclass(slots=True)
class ImportReport:
    """What an import did, or why it refused the file."""

    counts: WriteCounts = field(default_factory=WriteCounts)
    lines: int = 0
    errors: list[str] = field(default_factory=list)
    bad_lines: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


class ImportRefused(Exception):
    """The file was refused whole; nothing was written. The report says why."""

    def __init__(self, report: ImportReport) -> None:
        super().__init__("; ".join(report.errors))
        self.report = report


def import_ndjson(
    connection: sqlite3.Connection,
    stream: IO[bytes],
    progress: ProgressReporter | None = None,
    *,
    seen_at: int | None = None,
    bulk_min_rows: int | None = None,
    worker_after_lines: int | None = None,
) -> ImportReport:
    """Upsert every line of an NDJSON stream in one transaction, or refuse the file whole.

    Raises ImportRefused (with the first few line errors) and writes nothing when any
    line is bad or the file holds no records. `seen_at` (UTC microseconds) is the
    instant the records are seen, by default now. Past `worker_after_lines` lines
    (default WORKER_AFTER_LINES; 0 = never) the lines are parsed in a worker process.
    """
    report = ImportReport()
    writer = ApplicantWriter(connection, seen_at, progress=progress, bulk_min_rows=bulk_min_rows)
    after = WORKER_AFTER_LINES if worker_after_lines is None else worker_after_lines
    try:
        with writer:
            outcomes = _parsed_lines(stream, report, progress, after)
            try:
                for number, outcome in outcomes:
                    if isinstance(outcome, str):
                        _record_error(report, number, outcome)
                    elif report.ok:
                        try:
                            writer.write(outcome)
                        except RecordError as error:
                            _record_error(report, number, str(error))
            finally:
                outcomes.close()  # stops the worker, if any, whatever happened
            if report.ok and writer.counts.seen == 0:
                report.errors.append(
                    f"line {max(report.lines, 1)}: (file): no applicant records "
                    "(the file is empty or blank)"
                )
            if not report.ok:
                raise ImportRefused(report)
    finally:
        report.counts = writer.counts
    return report


def _parsed_lines(
    stream: IO[bytes],
    report: ImportReport,
    progress: ProgressReporter | None,
    worker_after_lines: int,
) -> Generator[Outcome, None, None]:
    """Every non-blank line, parsed, in order: inline at first, then in a worker process.

    A small file never pays for a process; a large one is parsed on one core while the
    writes run on the other. At most WORKER_IN_FLIGHT batches are in the worker's hands,
    so memory stays flat.
    """
    worker: Worker | None = None
    batch: list[tuple[int, bytes | None]] = []
    in_flight = 0
    try:
        for number, line, position in read_lines(stream):
            report.lines = number
            if progress is not None and number % PROGRESS_EVERY == 0:
                progress.advance(number, position)
            if line is not None and line.isspace():
                continue  # a blank line separates nothing; tolerated
            if worker is None:
                if not worker_after_lines or number <= worker_after_lines:
                    yield from parse_batch([(number, line)])
                    continue
                worker = Worker(_parse_worker, decoder=_OUTCOMES, inbox=True)
            batch.append((number, line))
            if len(batch) == WORKER_BATCH:
                worker.send(batch)
                batch, in_flight = [], in_flight + 1
                if in_flight == WORKER_IN_FLIGHT:
                    yield from worker.receive()
                    in_flight -= 1
        if worker is not None:
            if batch:
                worker.send(batch)
                in_flight += 1
            for _ in range(in_flight):
                yield from worker.receive()
    finally:
        if worker is not None:
            worker.close()


def _record_error(report: ImportReport, number: int, message: str) -> None:
    report.bad_lines += 1
    if len(report.errors) < MAX_REPORTED_ERRORS:
        report.errors.append(f"line {number}: {_one_line(message)}")


# Control characters (a key may hold a newline or an escape sequence) and the Unicode
# line separators: written escaped, so one error is one line and cannot drive a terminal.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MAX_MESSAGE_CHARS: Final = 300


def _one_line(message: str) -> str:
    """The message on one line, escaped and cut to a readable length."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    return _UNPRINTABLE.sub(lambda match: repr(match[0])[1:-1], message)


# What a generator yields: a record, or (from a trusted generator, seed's) a record
# already in stored form: its canonical encoding, byte for byte what
# `applicant_encoder` writes for it, and the fields `_fields` would take from it. The
# second is written as it is, without building and validating Structs that would
# only be encoded again; the generator's tests hold it to that encoding.


def _parse_worker(
    parent: int, inbox: multiprocessing.Queue[bytes | None], results: Connection
) -> None:
    def work() -> None:
        while (message := inbox.get()) is not None:
            send_batch(results, parse_batch(_LINES.decode(message)))

    run_worker(parent, results, work)


def write_records(
    connection: sqlite3.Connection,
    records: Iterable[Generated],
    progress: ProgressReporter | None = None,
) -> WriteCounts:
    """Upsert records (valid Structs, or trusted encodings: `Generated`) in one transaction."""
    writer = ApplicantWriter(connection, progress=progress)
    with writer:
        for done, record in enumerate(records, 1):
            writer.write(prepare_generated(record))
            if progress is not None and done % PROGRESS_EVERY == 0:
                progress.advance(done)
    return writer.counts


def write_generated(
    connection: sqlite3.Connection,
    produce: Callable[..., Iterable[Generated]],
    *args: Any,
    progress: ProgressReporter | None = None,
    in_worker: bool = True,
) -> WriteCounts:
    """Upsert the records `produce(*args)` yields, in one transaction; used by `seed`.

    With `in_worker`, a worker process runs `produce` (a module-level function) and
    prepares the records (encoding, content hash) while this process writes them.
    """
    if not in_worker:
        return write_records(connection, produce(*args), progress)
    writer = ApplicantWriter(connection, progress=progress)
    worker = Worker(_produce_worker, produce, args, decoder=_PREPARED)
    try:
        with writer:
            done = 0
            while (batch := worker.receive()) is not None:
                for record in batch:
                    writer.write(record)
                done += len(batch)
                if progress is not None:
                    progress.advance(done)
    finally:
        worker.close()
    return writer.counts


def _produce_worker(
    parent: int,
    inbox: None,
    results: Connection,
    produce: Callable[..., Iterable[Generated]],
    args: tuple[Any, ...],
) -> None:
    def work() -> None:
        # The whole of `prepare` (the content hash too) runs here, as in an import's
        # worker: the writer's share of a row is then little more than its INSERT.
        batch = []
        for record in produce(*args):
            batch.append(prepare_generated(record))
            if len(batch) == WORKER_BATCH:
                send_batch(results, batch)
                batch = []
        if batch:
            send_batch(results, batch)
        results.send_bytes(_END)

    run_worker(parent, results, work)
