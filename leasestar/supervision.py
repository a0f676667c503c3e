"""The server's worker processes kept alive, and a worker's death named in one line.

A worker can die of a signal no Python code can catch: SIGBUS, when a file SQLite has
mapped (the database's `-shm`, its WAL index) is cut short under it (database.py,
`ReadPool`), or SIGKILL from the kernel's out-of-memory killer. Every worker therefore
runs under a parent that says which signal killed it and starts another, which opens the
database afresh (a new worker rebuilds the WAL index from the WAL):

- `--workers 2` or more: uvicorn's own supervisor (`Multiprocess`), which spawns the
  workers and restarts dead ones, made to name the signal (its line, `Child process
  [PID] died`, does not);
- `--workers 1`: a fork of this process serves, and this process only waits for it.
  The parent and its worker hold 77 MB together (proportional set size at 1,000 rows,
  against 59 MB for the one process before; a spawned worker would cost a second
  interpreter importing everything again: +60 MB, and 0.7 s more to start). uvicorn has
  no forking supervisor, so this is the few lines of one.

The parent forwards SIGTERM and SIGINT to the worker as SIGTERM (uvicorn's supervisor
does the same): the worker drains its requests and exits 0, and the parent exits with
its status. A worker that exits by itself ends the parent with its status; one killed
by a signal the parent did not send is named and replaced. Every worker is killed with
its parent (`PR_SET_PDEATHSIG`; a spawned one asks for it when it makes the app, told
by SUPERVISOR_VARIABLE), so a `kill -9` of the server leaves no worker serving.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from logging.handlers import QueueListener
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from uvicorn.supervisors import Multiprocess

_CAUSES: Final = {
    signal.SIGBUS: " (a file it had mapped was cut short: the database's -shm, SQLite's WAL "
    "index, or the database itself)",
    signal.SIGKILL: " (by the system's out-of-memory killer, or by its supervisor when it "
    "stopped answering the supervisor's health check)",
}
_PR_SET_PDEATHSIG: Final = 1
# Set by the parent for the workers uvicorn spawns: the pid they die with.
SUPERVISOR_VARIABLE: Final = "LEASESTAR_SUPERVISOR_PID"
_FORWARDED: Final = (signal.SIGTERM, signal.SIGINT)
# A worker dying this soon after its start is replaced after a pause, doubled each time
# from the first to the most (uvicorn's supervisor looks twice a second).
QUICK_DEATH_SECONDS: Final = 10.0
FIRST_PAUSE_SECONDS: Final = 0.5
MOST_PAUSE_SECONDS: Final = 10.0
logger = logging.getLogger("uvicorn.error")  # the supervisor's lines, as uvicorn's own


def name_death(pid: int, signum: int) -> None:
    """The one line for a worker killed by `signum`, about to be replaced."""
    logger.error(
        "worker process [%d] was killed by %s%s; starting another",
        pid,
        signal.Signals(signum).name,
        _CAUSES.get(signal.Signals(signum), ""),
    )


def naming_supervisor(supervisor: type[Multiprocess]) -> type[Multiprocess]:
    """uvicorn's supervisor, naming the signal that killed a worker it starts again; its
    workers die with it (`die_with_supervisor`)."""
    os.environ[SUPERVISOR_VARIABLE] = str(os.getpid())

    class NamingSupervisor(supervisor):  # type: ignore[valid-type,misc]
        def keep_subprocess_alive(self) -> None:
            # Named once uvicorn has replaced it, from its exit status then: a check
            # before would miss a worker that dies while uvicorn pings the others (up to
            # its health check's timeout each), and one it kills for not answering.
            before = list(self.processes)
            super().keep_subprocess_alive()
            # (Not strict: a pass that changed how many workers there are names none
            # rather than stopping the supervisor.)
            for old, new in zip(before, self.processes, strict=False):
                code = old.process.exitcode
                if new is not old and code is not None and code < 0:
                    name_death(old.pid, -code)

    return NamingSupervisor


def serve_in_fork(serve: Callable[[], int]) -> int:
    """Run `serve` (one worker's whole life: its exit status) in a forked process, again
    whenever a signal kills it; the status it exited with.

    Call it with no other thread running: a fork copies only the calling thread, and a
    lock another thread held (SQLite's, the allocator's) would stay held in the worker.
    A worker dying again within QUICK_DEATH_SECONDS of its start is replaced after a
    pause that doubles each time (a worker that cannot start would be forked in a loop).
    """
    parent = os.getpid()
    worker = 0  # the live worker's pid; 0 once reaped (a pid may be reused)
    stopping = threading.Event()  # (set by the handler: is_set takes no lock)

    def forward(signum: int, frame: object) -> None:
        stopping.set()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGTERM)

    inherited = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    pause = 0.0
    try:
        while True:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # (else the worker would write the parent's buffers too)
            # Blocked across the fork: the parent's handler must not run in the worker,
            # where it would swallow the signal; the worker takes it once its own are set.
            signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
            worker = os.fork()
            if worker == 0:
                status = 1
                try:
                    status = _worker_life(serve, parent, inherited)
                finally:
                    os._exit(status)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
            if stopping.is_set():  # (a signal before the worker was known)
                os.kill(worker, signal.SIGTERM)
            started = time.monotonic()
            _, status = os.waitpid(worker, 0)  # (retried across the handler: PEP 475)
            dead, worker = worker, 0
            if os.WIFEXITED(status):
                return os.WEXITSTATUS(status)
            killed_by = os.WTERMSIG(status)
            if stopping.is_set():
                return 128 + killed_by
            name_death(dead, killed_by)
            quick = time.monotonic() - started < QUICK_DEATH_SECONDS
            pause = min(max(2 * pause, FIRST_PAUSE_SECONDS), MOST_PAUSE_SECONDS) if quick else 0.0
            resume = time.monotonic() + pause
            while not stopping.is_set() and time.monotonic() < resume:
                time.sleep(0.05)
            if stopping.is_set():
                return 0
    finally:
        for signum, handler in inherited.items():
            signal.signal(signum, handler)


def _worker_life(
    serve: Callable[[], int], parent: int, inherited: dict[signal.Signals, Any]
) -> int:
    """The worker's exit status. Its handlers are the process's own again, and the
    signals the parent forwards unblocked; nothing raised here reaches the parent's code
    (the caller `os._exit`s)."""
    status = 1
    try:
        for signum, handler in inherited.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        _die_with(parent)
        status = serve()
    except SystemExit as done:  # (SIGTERM, once drained or before uvicorn listens)
        status = _exit_status(done)
    except KeyboardInterrupt:  # (SIGINT, re-raised by uvicorn once drained)
        status = 128 + signal.SIGINT
    except BaseException:  # a fault of ours: its trace, as the CLI would have shown it
        traceback.print_exc()
    finally:
        # `os._exit` runs no atexit handler: Litestar's log listener, a thread writing
        # the app's records from a queue, is stopped here, so its last lines are written.
        with contextlib.suppress(BaseException):
            _stop_log_listeners()
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
    return status


def _exit_status(done: SystemExit) -> int:
    if done.code is None:
        return 0
    if isinstance(done.code, int):
        return done.code
    print(done.code, file=sys.stderr)
    return 1


def _stop_log_listeners() -> None:
    """Stop every queue listener a logging handler of this process feeds (each writes
    what is queued, then ends)."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for each in loggers:
        for handler in getattr(each, "handlers", ()):
            listener = getattr(handler, "listener", None)
            if isinstance(listener, QueueListener) and listener._thread is not None:
                listener.stop()


def die_with_supervisor() -> None:
    """In a worker uvicorn spawned: be killed with the supervisor that did (a worker
    outliving it would go on answering on the port, replaced by nobody)."""
    supervisor = os.environ.pop(SUPERVISOR_VARIABLE, None)
    if supervisor is not None:
        _die_with(int(supervisor))


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux's prctl; elsewhere
    a worker may outlive a killed parent)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # (the parent died before the call)
        os._exit(1)
