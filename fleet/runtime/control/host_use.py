"""How much of its host's cores a CPU job's work gets while it wants more than the host has.

The simulator shares a CPU node's cores between trainers and preprocessors by their measured
costs per sample (`fleet.schedule.cores`). On a node whose ranks want more than its cores, a
real job gets less than that out of them: every rank sometimes waits for another at once
(hand-offs between the preprocessors and the trainers, a stream's members between
themselves), and the ranks do work their costs per sample leave out. A job sharing one host
(every rank on rank 0's host: a workstation, virtual nodes) measures it itself: rank 0 reads
its ranks' CPU seconds from ``/proc`` every `PERIOD_S`, and keeps

- how busy the host's cores were during the samples in which the job's work wanted more than
  the host has: `busy_share`. Wanting more is measured where Linux keeps its run-queue waits
  (``/proc/PID/task/*/schedstat``): an interval in which the ranks' threads waited for a core
  at least `WAITING_THREADS` threads' worth of its time. Elsewhere it is estimated from what
  the job runs (every busy trainer slot's cores and every preprocessor's, at both ends of the
  interval), which counts a rank that waits for data as wanting its core;
- all the ranks' CPU seconds from the first sample to the last: `cpu_s`, and the same per rank
  role (`cpu_by_role`: the preprocessors', the trainers', rank 0's), which a run sets beside
  what each role's measured costs account for.

`core_share` sets them beside the CPU seconds the measured costs account for, as the part of
the simulated cores the work got (`SharedCores.share`). Where ``/proc`` cannot be read, nothing
is measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

PERIOD_S = 0.5
RANK0_ROLE = "rank 0"  # rank 0's role in `cpu_by_role`: a preprocessor that also runs the coordinator
MIN_SATURATED_S = 1.0  # less time than this with the cores wanted by more than they are: no figure
WAITING_THREADS = 0.5  # ranks' threads waiting for a core, on average over an interval, that make it saturated
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user and system) process `pid` has used, from ``/proc``; None where it
    cannot be read (gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, ValueError, IndexError):
        return None


def run_queue_wait_s(pid: int) -> float | None:
    """Seconds the threads of process `pid` have waited for a core while ready to run, from
    ``/proc``; None where it cannot be read (gone, not Linux, a kernel without schedstat)."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as handle:
                    total += int(handle.read().split()[1])
            except FileNotFoundError:  # the thread ended between the listing and the read
                continue
        return total / 1e9
    except (OSError, ValueError, IndexError):
        return None


class HostUse:
    """Samples the CPU seconds of a job's ranks on one host (see the module).

    Args:
        pids: the job's ranks' processes on this host.
        roles: each process's role (as `pids`), for `cpu_by_role`; none: every one "rank".
        cores: the host's cores the ranks run on.
        demand: the cores the job's work would use now (busy trainer slots' and preprocessors'),
            where the run-queue waits cannot be read.
        period_s: seconds between samples.
        clock, read, waits: the time, one process's CPU seconds and its threads' run-queue waits
            (tests give their own).
    """

    def __init__(self, pids: Sequence[int], cores: float, demand: Callable[[], float], period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.monotonic, read: Callable[[int], float | None] = process_cpu_s,
                 roles: Sequence[str] | None = None, waits: Callable[[int], float | None] = run_queue_wait_s):
        self.pids, self.cores, self.demand, self.period_s = tuple(pids), cores, demand, period_s
        self.roles = tuple(roles) if roles is not None else ("rank",) * len(self.pids)
        if len(self.roles) != len(self.pids):
            raise ValueError("roles must name one role per pid")
        self.clock, self.read, self.waits = clock, read, waits
        self.last: tuple[float, float, bool, float | None] | None = None  # (time, CPU seconds, demand > cores, waits)
        self.first: tuple[float, float] | None = None
        self.first_readings: list[float] = []  # each rank's CPU seconds at the first sample
        self.last_readings: list[float] = []  # ... and at the last
        self.saturated_s = 0.0
        self.saturated_cpu_s = 0.0
        self.failed = False

    def tick(self) -> None:
        """Take a sample where `period_s` has passed since the last one."""
        if not self.failed and (self.last is None or self.clock() - self.last[0] >= self.period_s):
            self.sample()

    def sample(self) -> None:
        """Read every rank's CPU seconds now; the interval since the last sample counts as
        saturated where the ranks' threads waited for a core (see the module), or where their
        waits cannot be read, where the work wanted more than the cores at both its ends."""
        readings = [self.read(pid) for pid in self.pids]
        if any(r is None for r in readings):
            self.failed = True  # a rank gone, or no /proc: the figures would be wrong
            return
        waited = [self.waits(pid) for pid in self.pids]
        waits = None if any(w is None for w in waited) else sum(waited)
        now, cpu, wanting = self.clock(), sum(readings), self.demand() > self.cores
        if self.last is None:
            self.first, self.first_readings = (now, cpu), readings
        elif self._saturated(now, wanting, waits):
            self.saturated_s += now - self.last[0]
            self.saturated_cpu_s += cpu - self.last[1]
        self.last, self.last_readings = (now, cpu, wanting, waits), readings

    def _saturated(self, now: float, wanting: bool, waits: float | None) -> bool:
        """Whether the interval from the last sample to `now` had more work than cores."""
        last_time, _, last_wanting, last_waits = self.last
        if waits is not None and last_waits is not None:
            return waits - last_waits >= WAITING_THREADS * (now - last_time)
        return wanting and last_wanting

    def busy_share(self) -> float | None:
        """The share of the cores the ranks kept busy while the work wanted more than them."""
        if self.failed or self.saturated_s < MIN_SATURATED_S:
            return None
        return min(1.0, self.saturated_cpu_s / (self.cores * self.saturated_s))

    def cpu_s(self) -> float | None:
        """The ranks' CPU seconds from the first sample to the last."""
        if self.failed or self.first is None or self.last is None:
            return None
        return self.last[1] - self.first[1]

    def cpu_by_role(self) -> dict[str, float]:
        """Per rank role, its ranks' CPU seconds from the first sample to the last (empty where
        nothing was measured)."""
        if self.failed or self.first is None or self.last is None:
            return {}
        roles: dict[str, float] = {}
        for role, first, last in zip(self.roles, self.first_readings, self.last_readings):
            roles[role] = roles.get(role, 0.0) + last - first
        return roles


def core_share(use: HostUse, accounted_core_s: float, simulated_cores: float) -> float | None:
    """The part of the `simulated_cores` (the host's nodes as the simulator counts them: a
    host of virtual nodes counts its cores once per node) the job's measured work got: the
    host's busy share while oversubscribed, times the part of the ranks' CPU seconds that
    `accounted_core_s` accounts for, times the host's cores over the simulated ones."""
    busy, cpu = use.busy_share(), use.cpu_s()
    if busy is None or not cpu or simulated_cores <= 0:
        return None
    share = busy * min(1.0, accounted_core_s / cpu) * min(1.0, use.cores / simulated_cores)
    return share if share > 0 else None
