"""The replica's follower: `litestream restore -f` supervised, its changes applied.

Runs in the `leasestar serve --replica-of` process beside uvicorn, in three threads:

- the refresher looks at the follower's `-txid` file every 25 ms and, when it moved,
  applies the change to the served database (`apply.apply_changes`). A small change is
  applied at the server's own priority: it is on the path of the replica's lag, and at
  1,000,000 applicants a 100-row import costs ~0.2 s of CPU, which 10 nice levels down
  stretched to 0.5-1.1 s of waiting for the core on a loaded machine (docs/replicas.md);
- the background thread, BACKGROUND_NICENESS levels below the server, applies a large
  change (LARGE_CHANGE_ROWS writes or more) and checkpoints the served database after
  each change, on a connection of its own, so the next change need not wait for it;
- the watcher lists the store every second (`litestream ltx`) and restarts the
  follower, from an empty directory, when it exited, stalled while the store moved on,
  or is ahead of the store (the store went back, or holds another primary now).

A follower is always started from nothing: litestream refuses to resume a follow whose
last transaction is past the store's latest snapshot, and a follower killed while it
wrote leaves half a transaction in its file. The served database is never touched by
any of that: it changes only by whole applied transactions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Final

from leasestar.applicants.writer import BULK_MIN_ROWS as LARGE_CHANGE_ROWS
from leasestar.replica.apply import (
    FollowerGone,
    OtherPrimary,
    SchemaDiffers,
    StoreBehind,
    apply_changes,
    checkpoint,
    copy_whole,
    identity_of,
    make_readable,
    open_served,
    pending_writes,
)
from leasestar.replica.layout import FOLLOWED_NAME, ReplicaError, ReplicaLayout, ReplicaMarker
from leasestar.replica.litestream import (
    BACKGROUND_NICENESS,
    check_url,
    follow_command,
    in_background,
    list_store,
    replica_config,
    shipped_at,
)
from leasestar.replica.status import ReplicaStatus

logger = logging.getLogger("leasestar.replica")

# A stat and a read of a 17-byte file: every 25 ms costs nothing measurable and takes
# ~40 ms off the lag at the median against every 100 ms.
REFRESH_POLL_SECONDS: Final = 0.025
STORE_POLL_SECONDS: Final = 1.0
# A follower that has not applied anything for this long while the store held more is
# restarted (litestream's follow loop can stop applying without exiting).
STALL_SECONDS: Final = 60.0
RESTART_BACKOFF_SECONDS: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
REFUSED_RETRY_SECONDS: Final = 60.0
# At start, a replica that already has a database waits this long for the store's copy
# to compare it with, then serves what it has.
START_WAIT_SECONDS: Final = 60.0


class Follower:
    """Keeps one replica database in step with its store."""

    def __init__(self, database: Path, url: str, binary: Path) -> None:
        self.layout = ReplicaLayout(database)
        self.url = check_url(url)
        self._binary = binary
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock_file: IO[bytes] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._followed: Path | None = None
        self._readable = False
        self._number = 0
        self._started_at = 0.0
        self._failures = 0
        self._refused_at: float | None = None
        self._applying = False  # the refresher is writing a change (outside the lock)
        self._follower_txid = 0
        self._behind_store_since: float | None = None  # the follower's, monotonic
        self._progress: tuple[int, ...] = ()  # what showed the follower working last
        # The server's priority, taken on its thread: a follower restarted by the (lowered)
        # watcher still runs BACKGROUND_NICENESS below it, not twice that.
        self._niceness = _niceness()
        self._served: sqlite3.Connection | None = None
        self._checkpointer: sqlite3.Connection | None = None
        # Its one thread lowers its own priority as it starts (on the first change).
        self._background = ThreadPoolExecutor(
            1, thread_name_prefix="replica-background", initializer=_lower_this_thread
        )
        self._identity = ""
        self.status = ReplicaStatus(of=self.url)

    # --- start and stop ------------------------------------------------------------------

    def prepare(self) -> None:
        """Make the served database ready: restore it if there is none, else check that
        the store holds the same primary. Raises ReplicaError with a one-line reason."""
        database = self.layout.database
        marker = self.layout.marker()
        if marker is None and database.exists():
            raise ReplicaError(
                f"{database} is not a replica (it has no {self.layout.marker_path.name}): "
                "give a replica a --db of its own"
            )
        if marker is not None and marker.of != self.url:
            raise ReplicaError(
                f"{database} is a replica of {marker.of}, not {self.url}; "
                f"to follow another store, remove {database} and {self.layout.directory}"
            )
        self._lock_file = self.layout.lock()
        replica_config(self.layout.config_path, self.url)
        for old in self.layout.follow_directories():
            self._number = max(self._number, int(old.name.rpartition("-")[2] or 0))
            shutil.rmtree(old, ignore_errors=True)
        clean = self.layout.clean_path.exists()
        self.layout.clean_path.unlink(missing_ok=True)
        if marker is None or not database.exists():
            self._restore_new(marker)
        else:
            self._identity = marker.primary
            if not clean:
                self._verify()
            self._open_served()
            self._check_store_on_start()
        self.status.write(self.layout.status_path)

    def _restore_new(self, marker: ReplicaMarker | None) -> None:
        print(f"restoring {self.layout.database} from {self.url}", file=sys.stderr, flush=True)
        self._start_follower()
        followed = self._wait_for_restore(None)
        if followed is None:
            reason = self._follower_error()
            self._stop_follower()
            if marker is None:
                shutil.rmtree(self.layout.directory, ignore_errors=True)
            raise ReplicaError(f"cannot restore from {self.url}: {reason}")
        make_readable(followed)
        self._readable = True
        self._identity = copy_whole(followed, self.layout.database, self._alive)
        if marker is not None and marker.primary != self._identity:
            self.layout.database.unlink()
            raise ReplicaError(
                f"{self.url} holds another primary's database than {self.layout.database} "
                "copied: refused"
            )
        self.layout.write_marker(ReplicaMarker(of=self.url, primary=self._identity))
        self._open_served()

    def _open_served(self) -> None:
        self._served = open_served(self.layout.database)
        self._checkpointer = open_served(self.layout.database)

    def _verify(self) -> None:
        """After a stop that was not clean (a crash, a kill): check the served file."""
        print(f"checking {self.layout.database} after an unclean stop", file=sys.stderr)
        connection = sqlite3.connect(self.layout.database, isolation_level=None)
        try:
            (result,) = connection.execute("PRAGMA quick_check").fetchone()
        finally:
            connection.close()
        if result != "ok":
            raise ReplicaError(
                f"{self.layout.database} is damaged ({result}): remove it and "
                f"{self.layout.directory} to restore it from {self.url}"
            )

    def _check_store_on_start(self) -> None:
        """Refuse a store that holds another primary; serve anyway if it does not answer."""
        self._start_follower()
        followed = self._wait_for_restore(START_WAIT_SECONDS)
        if followed is None:
            reason = (
                f"still restoring after {START_WAIT_SECONDS:.0f} s"
                if self._alive()
                else self._follower_error()
            )
            print(
                f"leasestar: {self.url} did not give a copy to compare ({reason}); "
                "serving the last state and retrying",
                file=sys.stderr,
            )
            return
        make_readable(followed)
        self._readable = True
        source = sqlite3.connect(f"{followed.resolve().as_uri()}?mode=ro", uri=True)
        try:
            identity = identity_of(source)
        finally:
            source.close()
        if identity != self._identity:
            self._stop_follower()
            raise ReplicaError(
                f"{self.url} holds another primary's database than {self.layout.database} "
                "copies: refused"
            )

    def start(self) -> None:
        """Follow in the background until `stop`."""
        for target, name in ((self._refresh_loop, "refresher"), (self._watch_loop, "watcher")):
            thread = threading.Thread(target=target, name=f"replica-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._background.shutdown(wait=True)
        with self._lock:
            self._stop_follower()
            for connection in (self._served, self._checkpointer):
                if connection is not None:
                    connection.close()
            self._served = self._checkpointer = None
        if self.layout.marker_path.exists():
            self.layout.clean_path.touch()
        if self._lock_file is not None:
            self._lock_file.close()

    # --- the litestream process ----------------------------------------------------------

    def _start_follower(self) -> None:
        self._number += 1
        directory = self.layout.follow_directory(self._number)
        directory.mkdir(parents=True)
        self._followed = directory / FOLLOWED_NAME
        self._readable = False
        self._follower_txid = 0
        self._behind_store_since, self._progress = None, ()
        self._started_at = time.monotonic()
        command = follow_command(self._binary, self.layout.config_path, self._followed)
        with (directory / "litestream.log").open("wb") as log:
            self._process = subprocess.Popen(  # noqa: S603 - an argument list, no shell
                in_background(command, self._niceness + BACKGROUND_NICENESS - _niceness()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _stop_follower(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._followed is not None:
            shutil.rmtree(self._followed.parent, ignore_errors=True)
            self._followed = None

    def _restart_follower(self, why: str) -> None:
        logger.warning("restarting the litestream follower: %s", why)
        self._stop_follower()
        self._start_follower()

    def _follower_progress(self) -> tuple[int, ...]:
        """What shows the follower working: its `-txid`, and the size and time of the file
        it writes (a first restore goes to `<file>.tmp`, renamed when done: 1,000,000
        applicants took over 60 s on a loaded machine, and were restarted as stalled)."""
        marks = [self._follower_txid]
        if self._followed is not None:
            for path in (self._followed.with_name(self._followed.name + ".tmp"), self._followed):
                try:
                    status = path.stat()
                except OSError:
                    marks += [0, 0]
                else:
                    marks += [status.st_size, status.st_mtime_ns]
        return tuple(marks)

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _follower_error(self) -> str:
        """The last line litestream logged, for a one-line message."""
        if self._followed is None:
            return "the follower stopped"
        log = self._followed.parent / "litestream.log"
        with contextlib.suppress(OSError):
            lines = log.read_text(errors="replace").strip().splitlines()
            if lines:
                return lines[-1].removeprefix("Error: ").removeprefix("error: ").strip()
        return "the follower stopped"

    def _wait_for_restore(self, timeout: float | None) -> Path | None:
        """The followed file once restored; None if the follower exits first (or at the
        timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            followed = self._followed
            if followed is not None and _read_txid(followed) is not None:
                return followed
            if not self._alive():
                return None
            time.sleep(REFRESH_POLL_SECONDS)
        return None

    # --- the refresher -------------------------------------------------------------------

    def _refresh_loop(self) -> None:
        while not self._stop.wait(REFRESH_POLL_SECONDS):
            try:
                self.refresh()
            except Exception:  # the follower must outlive any one fault; it is logged
                logger.exception("replica refresh failed")

    def refresh(self) -> None:
        """Apply what the follower wrote since the last look, if anything.

        The apply runs outside the lock, so that `/health` goes on reporting the store
        while a large change is written; meanwhile the watcher leaves the follower alone
        (it is blocked on the file's lock, not stalled). A large change is written by the
        background thread, this one waiting for it.
        """
        with self._lock:
            followed, served = self._followed, self._served
            if followed is None or served is None or self._refused_at is not None:
                return
            txid = _read_txid(followed)
            if txid is None:
                return
            if txid != self._follower_txid:
                self._follower_txid, self._behind_store_since = txid, None
            if txid == self.status.served_txid and self._readable:
                return
            if not self._readable:
                make_readable(followed)
                self._readable = True
            self._applying = True
        started = time.perf_counter()
        try:
            apply = functools.partial(apply_changes, served, followed, self._identity, self._alive)
            if pending_writes(served, followed) >= LARGE_CHANGE_ROWS:
                applied = self._background.submit(apply).result()
            else:
                applied = apply()
        except FollowerGone:
            with self._lock:
                self._restart_follower("it stopped while its file was read")
            return
        except OtherPrimary as refused:
            with self._lock:
                self._refuse(str(refused))
            return
        except StoreBehind:
            with self._lock:
                self._note("the store holds an older state than the one served")
            return
        except SchemaDiffers:
            with self._lock:
                self._refuse("the primary's schema differs from this replica's: upgrade")
            return
        finally:
            self._applying = False
        with self._lock:
            self._failures, self._behind_store_since = 0, None
            status = self.status
            status.served_txid, status.change_seq = txid, applied.change_seq
            status.apply_seconds = round(time.perf_counter() - started, 3)
            if status.store_txid <= txid:
                # The follower read it from the store, which the watcher may not have
                # listed since: the store holds at least what is served.
                status.store_txid, status.behind_since = txid, None
            status.write(self.layout.status_path)
        if self._checkpointer is not None and not self._stop.is_set():
            self._background.submit(self._checkpoint, self._checkpointer, applied.rows)

    @staticmethod
    def _checkpoint(connection: sqlite3.Connection, rows: int) -> None:
        try:
            checkpoint(connection, rows)
        except sqlite3.Error:  # the next change's checkpoint copies what this one left
            logger.exception("replica checkpoint failed")

    def _refuse(self, reason: str) -> None:
        logger.error("replica of %s: %s; serving the last state", self.url, reason)
        self._refused_at = time.monotonic()
        self._stop_follower()
        self.status.store, self.status.detail = "refused", reason
        self.status.write(self.layout.status_path)

    def _note(self, detail: str) -> None:
        if self.status.detail != detail:
            self.status.detail = detail
            self.status.write(self.layout.status_path)

    # --- the watcher ---------------------------------------------------------------------

    def _watch_loop(self) -> None:
        _lower_this_thread()
        while not self._stop.wait(STORE_POLL_SECONDS):
            try:
                self.watch()
            except Exception:
                logger.exception("replica store check failed")

    def watch(self) -> None:
        """List the store, record what it holds, and restart the follower if it needs it."""
        try:
            listing = list_store(self._binary, self.layout.config_path)
        except OSError as error:
            with self._lock:
                if self.status.store != "refused":
                    self.status.store, self.status.detail = "unreachable", str(error)
                self.status.write(self.layout.status_path)
            return
        now = time.time()
        with self._lock:
            status = self.status
            status.store_txid, status.store_checked_at = listing.max_txid, now
            status.data_shipped_at = shipped_at(listing, status.served_txid)
            if status.store_txid > status.served_txid:
                status.behind_since = status.behind_since or now
            else:
                status.behind_since = None
            if status.store != "refused":
                empty = listing.max_txid == 0
                status.store = "empty" if empty else "ok"
                status.detail = "the store holds no backup" if empty else ""
            self._supervise(listing.max_txid)
            status.write(self.layout.status_path)

    def _supervise(self, store_txid: int) -> None:
        if self._applying:
            return
        now = time.monotonic()
        if self._refused_at is not None:
            if now - self._refused_at < REFUSED_RETRY_SECONDS or store_txid == 0:
                return
            self._refused_at = None  # the store changed since: look again
            self.status.store, self.status.detail = "ok", ""
            self._restart_follower("retrying a refused store")
            return
        if store_txid == 0:
            return  # nothing to follow; keep serving
        backoff = RESTART_BACKOFF_SECONDS[min(self._failures, len(RESTART_BACKOFF_SECONDS) - 1)]
        if not self._alive():
            if now - self._started_at >= backoff:
                self._failures += 1
                self._restart_follower(f"it exited ({self._follower_error()})")
        elif self._follower_txid > store_txid:
            self._restart_follower("the store went back (replaced or restored)")
        elif store_txid > self._follower_txid:
            progress = self._follower_progress()
            if progress != self._progress or self._behind_store_since is None:
                self._progress, self._behind_store_since = progress, now
            if now - self._behind_store_since > STALL_SECONDS:
                self._restart_follower(f"no progress for {STALL_SECONDS:.0f} s")


def _lower_this_thread() -> None:
    """Run the calling thread BACKGROUND_NICENESS levels below the server's (Linux sets a
    priority per thread): applying a large change then takes the CPU the requests leave.
    Measured in benchmarks/RESULTS.md, "Edge replicas"."""
    with contextlib.suppress(OSError, AttributeError):
        thread = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + BACKGROUND_NICENESS
        )


def _niceness() -> int:
    """The calling thread's nice value (Linux keeps one per thread; 0 elsewhere)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (OSError, AttributeError):
        return 0


def _read_txid(followed: Path) -> int | None:
    """The last transaction the follower applied (its `-txid` file), None before any."""
    try:
        text = followed.with_name(followed.name + "-txid").read_text().strip()
    except OSError:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None
