"""One job per run directory: a lock file that names its holder and proves it is alive.

``<run_dir>/.fleet-lock`` holds one JSON object: the holder's ``host``, ``pid``, the start time
of that process (``proc_start``, so that a reused pid is not taken for the holder), ``since``
(Unix seconds), the batch ``job`` id if any, the ``command`` and a random ``token``. It is
created with ``O_EXCL``, so of two jobs that start at once exactly one gets it. While the job
runs, a thread touches the file every `HEARTBEAT_S` seconds; that works across the nodes of a
shared file system, where a pid cannot be checked.

A lock is *stale*, and is taken over with a note, when its holder is on this host and its
process is gone, or when its heartbeat is older than `stale_after_s` (a holder on another
host that died). A live holder stops the newcomer at once with one line naming it -- except
a holder of the *same* batch job on another host (a requeued job whose first copy may still be
shutting down): then the newcomer waits up to `stale_after_s` for its heartbeat to stop.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import UserError

LOCK_NAME = ".fleet-lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0


class RunDirInUse(UserError):
    """Another live job holds the run directory."""


@dataclass(frozen=True)
class Holder:
    """Who holds a run directory's lock (as its lock file says)."""

    host: str
    pid: int
    proc_start: str
    since: float
    job: str | None
    command: str
    token: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        job = f", batch job {self.job}" if self.job else ""
        return f"{self.command} (host {self.host}, pid {self.pid}, since {when}{job})"


def _stat_fields(pid: int) -> list[str]:
    """Fields 3.. of /proc/PID/stat (state, ppid, ..., starttime at index 19); [] when unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def _process_start(pid: int) -> str:
    """The start time of process `pid` in clock ticks since boot ('' when unknown or gone)."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


def _alive(holder: Holder) -> bool:
    """Whether a holder on this host still runs (the same process, not a reused pid)."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    fields = _stat_fields(holder.pid)
    if fields and fields[0] in ("Z", "X"):
        return False  # killed, not yet reaped by its parent
    start = fields[19] if len(fields) > 19 else ""
    return not holder.proc_start or not start or start == holder.proc_start


class RunLock:
    """The lock of one run directory, held by this process; see the module docstring.

    Args:
        run_dir: the run directory (created if missing).
        command: what holds it, for the message others get (e.g. ``fleet train``).
        job: this process's batch job id, if any.
        stale_after_s: a heartbeat older than this is a dead holder's.
    """

    def __init__(self, run_dir: str | os.PathLike, command: str, job: str | None = None,
                 stale_after_s: float = STALE_AFTER_S, host: str | None = None):
        self.path = Path(run_dir) / LOCK_NAME
        self.command, self.job, self.stale_after_s = command, job, stale_after_s
        self.host = host or socket.gethostname()
        self.token = secrets.token_hex(8)
        self.held = False
        self.note: str | None = None  # what was taken over, for the user
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading --------------------------------------------------------------------------------

    def holder(self) -> Holder | None:
        """The current holder, or None when there is no lock file (an unreadable one: a holder
        whose file is being written, reported as such)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return Holder(str(data["host"]), int(data["pid"]), str(data.get("proc_start", "")),
                          float(data["since"]), data.get("job"), str(data.get("command", "fleet")),
                          str(data.get("token", "")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return Holder("?", 0, "", time.time(), None, "an unreadable lock file", "")

    def _age(self) -> float:
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return 0.0

    def is_stale(self, holder: Holder) -> bool:
        if holder.host == self.host and holder.pid:
            return not _alive(holder)
        return self._age() > self.stale_after_s

    def _check_dir(self) -> None:
        run_dir = self.path.parent
        if run_dir.exists() and not run_dir.is_dir():
            raise UserError(f"run directory {run_dir}: is a file, not a directory")

    def check_free(self) -> None:
        """Raise `RunDirInUse` if a live holder has the lock (without taking it)."""
        self._check_dir()
        holder = self.holder()
        if holder is not None and not self.is_stale(holder):
            raise self._in_use(holder)

    # -- taking and giving back -------------------------------------------------------------------

    def acquire(self, on_lost: Callable[[str], None] | None = None, poll_s: float = 1.0) -> None:
        """Take the lock, or raise `RunDirInUse`; then keep its heartbeat going.

        Args:
            on_lost: called (from the heartbeat thread) with a message if another process
                took the lock over, which happens only if this one stopped beating for
                `stale_after_s`; the caller should stop writing into the run directory.
        """
        self._check_dir()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"run directory {self.path.parent}: cannot create it: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.stale_after_s + 2 * HEARTBEAT_S
        while not self._try_create():
            holder = self.holder()
            if holder is None:
                continue
            if self.is_stale(holder):
                self._take_over(holder)
                continue
            if not (self.job and holder.job == self.job and holder.host != self.host) or time.monotonic() > deadline:
                raise self._in_use(holder)
            time.sleep(poll_s)  # the same batch job's earlier copy: wait for its heartbeat to stop
        self.held = True
        self._thread = threading.Thread(target=self._beat, args=(on_lost,), name="run-lock", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file if it is still this process's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_S)
        if self.held and self._ours():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _try_create(self) -> bool:
        record = {"host": self.host, "pid": os.getpid(), "proc_start": _process_start(os.getpid()),
                  "since": time.time(), "job": self.job, "command": self.command, "token": self.token}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise UserError(f"{self.path}: cannot create the run directory lock: {exc.strerror or exc}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        return True

    def _take_over(self, holder: Holder) -> None:
        """Move a stale lock aside (one of several newcomers wins the rename; the others retry)."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale.{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        aside.unlink(missing_ok=True)
        self.note = f"took over the run directory lock of {holder.describe()}, which no longer runs"

    def _ours(self) -> bool:
        holder = self.holder()
        return holder is not None and holder.token == self.token

    def _beat(self, on_lost: Callable[[str], None] | None) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if not self._ours():
                holder = self.holder()
                if on_lost is not None:
                    who = holder.describe() if holder else "nobody (the lock file was removed)"
                    on_lost(f"{self.path.parent}: lost the run directory lock to {who}")
                return
            try:
                os.utime(self.path)
            except OSError:
                pass

    def _in_use(self, holder: Holder) -> RunDirInUse:
        return RunDirInUse(f"run directory {self.path.parent} is in use by {holder.describe()}; wait for it to "
                           f"finish or use another --run-dir (a lock left by a job that died is taken over "
                           f"once its holder is gone: {self.path})")
