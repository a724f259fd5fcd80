"""`fleet run`'s watch over its mpiexec: output, signals, the rank that died, leftovers.

`fleet run` starts every rank on this machine through mpiexec and stays its parent. It
* passes the ranks' output through, printing an error that every rank reports alike once
  (not once per rank), and keeping the MPI launcher's own termination blocks (MPICH's "BAD
  TERMINATION ...", Open MPI's "MPI_ABORT was invoked ...") out of the way: their lines go to
  `Outcome.aside` and the facts they state (how the job ended) to `Outcome.exit_string`;
* forwards SIGTERM and SIGHUP sent to itself to mpiexec as the checkpoint signal (USR1), as
  the batch scripts do, so the ranks checkpoint and exit 75 instead of training on orphaned;
* watches the ranks' processes (their pids, from ``ranks.json`` that rank 0 writes at start)
  and notes which one ended first: when a rank is killed, the launcher kills the rest;
* removes the MPI shared-memory segments in /dev/shm that the job left (a killed job does
  not unlink them) once no process maps them.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

SHM = Path("/dev/shm")
MPI_SEGMENT_PREFIXES = ("mpich_shm_", "vader_segment.", "osc_sm.")  # MPICH; Open MPI's vader BTL and osc/sm
FORWARDED = (signal.SIGTERM, signal.SIGHUP)
RANKS_FILE = "ranks.json"

_ERROR_LINE = re.compile(r"^fleet: rank \d+ \([^)]*\): (?P<message>.+)$")
_MPICH_BAR = re.compile(r"^={20,}$")
_OMPI_BAR = re.compile(r"^-{20,}$")
_MPICH_EXIT = re.compile(r"^YOUR APPLICATION TERMINATED WITH THE EXIT STRING: (?P<how>.+)$")
_OMPI_SIGNAL = re.compile(r"noticed that process rank (?P<rank>\d+) with PID \d+ on node \S+ exited on (?P<how>signal .+?)\.?$")
_MPI_NOISE = (
    re.compile(r"^Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): application called MPI_Abort"),
    re.compile(r"^This typically refers to a problem with your application\.$"),
    re.compile(r"^Please see the FAQ page for debugging suggestions$"),
)
_OMPI_BLOCK_WORDS = ("MPI_ABORT was invoked", "exited on signal", "has exited due to process rank",
                     "noticed that process rank", "terminated the job", "killed by signal")


@dataclass
class RankInfo:
    rank: int
    pid: int
    host: str
    role: str
    node: int

    def describe(self) -> str:
        return f"rank {self.rank} ({self.role}, node {self.node}, pid {self.pid})"


@dataclass
class Outcome:
    """How a watched job ended.

    Attributes:
        returncode: mpiexec's exit code (negative: killed by that signal).
        first_ended: the rank whose process ended first, where its pid was known.
        exit_string: what the launcher said of how the job ended (e.g. ``Killed (signal 9)``).
        fleet_errors: error lines the ranks printed (``fleet: rank N (...): ...``), once each.
        repeats: how many more ranks printed an error already printed.
        aside: the launcher's termination blocks, as printed.
        forwarded: the signal forwarded to mpiexec as the checkpoint signal, if any.
        segments_removed: MPI shared-memory segments removed from /dev/shm.
    """

    returncode: int = 0
    first_ended: RankInfo | None = None
    exit_string: str | None = None
    fleet_errors: list[str] = field(default_factory=list)
    repeats: int = 0
    aside: list[str] = field(default_factory=list)
    forwarded: int | None = None
    segments_removed: list[str] = field(default_factory=list)


class OutputFilter:
    """Decides, line by line, what of the launcher's output the user sees; see the module
    docstring. Not thread-safe: callers hold `lock`."""

    def __init__(self, outcome: Outcome):
        self.outcome = outcome
        self.lock = threading.Lock()
        self._seen: set[str] = set()
        self._mpich_block = False
        self._ompi_block: list[str] | None = None

    def feed(self, line: str) -> list[str]:
        """The lines to show for one line of output (none, it, or a held block)."""
        if self._ompi_block is not None:
            return self._in_ompi_block(line)
        if _MPICH_BAR.match(line):
            self._mpich_block = not self._mpich_block
            return self._aside(line)
        if self._mpich_block or any(p.match(line) for p in _MPI_NOISE):
            return self._aside(line)
        if exit_line := _MPICH_EXIT.match(line):
            self.outcome.exit_string = exit_line["how"]
            return self._aside(line)
        if _OMPI_BAR.match(line):
            self._ompi_block = [line]
            return []
        if _OMPI_SIGNAL.search(line):
            return self._aside(line)
        return self._error_once(line)

    def finish(self) -> list[str]:
        """Whatever is still held (an unterminated block is shown as it was)."""
        held, self._ompi_block = self._ompi_block or [], None
        return held

    def _error_once(self, line: str) -> list[str]:
        error = _ERROR_LINE.match(line)
        if error is None:
            return [line]
        if error["message"] in self._seen:
            self.outcome.repeats += 1
            return []
        self._seen.add(error["message"])
        self.outcome.fleet_errors.append(line)
        return [line]

    def _in_ompi_block(self, line: str) -> list[str]:
        block = self._ompi_block
        block.append(line)
        if not _OMPI_BAR.match(line) or len(block) == 1:
            return []
        self._ompi_block = None
        text = "\n".join(block)
        if not any(word in text for word in _OMPI_BLOCK_WORDS):
            return block
        for inner in block:
            if found := _OMPI_SIGNAL.search(inner):
                self.outcome.exit_string = found["how"]
        self.outcome.aside.extend(block)
        return []

    def _aside(self, line: str) -> list[str]:
        self.outcome.aside.append(line)
        if found := _OMPI_SIGNAL.search(line):
            self.outcome.exit_string = found["how"]
        return []


def mpi_segments(shm: Path = SHM) -> set[str]:
    """Names of the MPI shared-memory segments in `shm`."""
    try:
        return {p.name for p in shm.iterdir() if p.name.startswith(MPI_SEGMENT_PREFIXES)}
    except OSError:
        return set()


def _mapped() -> str:
    """Every process's memory maps, as one string (whether a segment is still in use)."""
    maps = []
    for proc in Path("/proc").iterdir():
        try:
            maps.append((proc / "maps").read_text())
        except (OSError, UnicodeDecodeError):
            continue
    return "".join(maps)


def remove_leftover_segments(before: set[str], shm: Path = SHM) -> list[str]:
    """Remove the segments that appeared since `before` and that no process maps."""
    new = mpi_segments(shm) - before
    in_use = _mapped() if new else ""
    removed = []
    for name in sorted(new):
        if name not in in_use:
            (shm / name).unlink(missing_ok=True)
            removed.append(name)
    return removed


def read_ranks(run_dir: Path, since: float) -> list[RankInfo] | None:
    """The ranks of the job started at `since` (None until rank 0 wrote them)."""
    path = run_dir / RANKS_FILE
    try:
        if path.stat().st_mtime < since:
            return None
        return [RankInfo(int(r["rank"]), int(r["pid"]), str(r["host"]), str(r["role"]), int(r["node"]))
                for r in json.loads(path.read_text(encoding="utf-8"))["ranks"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class JobWatch:
    """Runs one mpiexec command under watch; `run()` returns its `Outcome`.

    Args:
        command: the mpiexec command line.
        run_dir: the run directory (where rank 0 writes ``ranks.json``).
        env: the environment for mpiexec.
        out, err: where the ranks' stdout and stderr lines go.
        start_timeout_s: the job is stopped when rank 0 has not written ``ranks.json`` this
            long after the launch (a rank that failed before MPI was up leaves the others
            waiting in MPI's start-up, where fleet's own deadlines do not reach); None: never.
    """

    def __init__(self, command: list[str], run_dir: Path, env: Mapping[str, str], out: TextIO, err: TextIO,
                 start_timeout_s: float | None = None):
        self.command, self.run_dir, self.env = command, Path(run_dir), dict(env)
        self.start_timeout_s = start_timeout_s
        self.out, self.err = out, err
        self.outcome = Outcome()
        self.filter = OutputFilter(self.outcome)
        self._ranks: dict[int, RankInfo] = {}  # pidfd -> rank
        self._poll = select.poll()

    def run(self) -> Outcome:
        before, started = mpi_segments(), time.time()
        proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", bufsize=1)
        pumps = [threading.Thread(target=self._pump, args=(pipe, sink), daemon=True)
                 for pipe, sink in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for pump in pumps:
            pump.start()
        previous = {s: signal.signal(s, lambda signum, _: self._forward(proc, signum)) for s in FORWARDED}
        try:
            self._wait(proc, started)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        for pump in pumps:
            pump.join()
        with self.filter.lock:
            self._show(self.filter.finish(), self.err)
        for fd in self._ranks:
            os.close(fd)
        self.outcome.returncode = proc.returncode
        self.outcome.segments_removed = remove_leftover_segments(before)
        return self.outcome

    def _wait(self, proc: subprocess.Popen, started: float) -> None:
        while True:
            try:
                if proc.poll() is not None:
                    return
                if not self._ranks:
                    self._watch_ranks(started)
                    self._stop_if_never_started(proc, started)
                for fd, _ in self._poll.poll(200) if self._ranks else ():
                    self._ended(fd)
                if not self._ranks:
                    time.sleep(0.2)
            except KeyboardInterrupt:  # Ctrl-C reached mpiexec too: wait for it to end the job
                self.outcome.forwarded = signal.SIGINT

    def _stop_if_never_started(self, proc: subprocess.Popen, started: float) -> None:
        if self.start_timeout_s is None or time.time() - started < self.start_timeout_s:
            return
        self.outcome.exit_string = (f"no rank had started after {self.start_timeout_s:g} s (one may have failed "
                                    "before MPI was up, leaving the others waiting: see its output above)")
        self.start_timeout_s = None
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()

    def _watch_ranks(self, started: float) -> None:
        ranks = read_ranks(self.run_dir, started)
        for info in ranks or ():
            try:
                fd = os.pidfd_open(info.pid)
            except (OSError, AttributeError):
                continue
            self._ranks[fd] = info
            self._poll.register(fd, select.POLLIN)

    def _ended(self, fd: int) -> None:
        if self.outcome.first_ended is None:
            self.outcome.first_ended = self._ranks[fd]
        self._poll.unregister(fd)

    def _forward(self, proc: subprocess.Popen, signum: int) -> None:
        self.outcome.forwarded = signum
        try:
            proc.send_signal(signal.SIGUSR1)
        except OSError:
            pass

    def _pump(self, pipe, sink: TextIO) -> None:
        for line in pipe:
            with self.filter.lock:
                self._show(self.filter.feed(line.rstrip("\n")), sink)
        pipe.close()

    @staticmethod
    def _show(lines: list[str], sink: TextIO) -> None:
        for line in lines:
            sink.write(line + "\n")
        if lines:
            sink.flush()
