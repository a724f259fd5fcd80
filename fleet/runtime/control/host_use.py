"""How much of its host's cores a CPU job's work gets while it wants more than the host has.

The simulator shares a CPU node's cores between trainers and preprocessors by their measured
costs per sample (`fleet.schedule.cores`). On a node whose ranks want more than its cores, a
real job gets less than that out of them: every rank sometimes waits for another at once
(hand-offs between the preprocessors and the trainers, a stream's members between
themselves), and the ranks do work their costs per sample leave out. A job sharing one host
(every rank on rank 0's host: a workstation, virtual nodes) measures it itself: rank 0 reads
its ranks' CPU seconds from ``/proc`` every `PERIOD_S`, and keeps

- how busy the host's cores were during the samples in which the job's work wanted more than
  the host has (every busy trainer slot's cores and every preprocessor's): `busy_share`;
- all the ranks' CPU seconds from the first sample to the last: `cpu_s`.

`core_share` sets them beside the CPU seconds the measured costs account for, as the part of
the simulated cores the work got (`SharedCores.share`). Where ``/proc`` cannot be read, nothing
is measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

PERIOD_S = 0.5
MIN_SATURATED_S = 1.0  # less time than this with the cores wanted by more than they are: no figure
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


class HostUse:
    """Samples the CPU seconds of a job's ranks on one host (see the module).

    Args:
        pids: the job's ranks' processes on this host.
        cores: the host's cores the ranks run on.
        demand: the cores the job's work would use now (busy trainer slots' and preprocessors').
        period_s: seconds between samples.
        clock, read: the time and one process's CPU seconds (tests give their own).
    """

    def __init__(self, pids: Sequence[int], cores: float, demand: Callable[[], float], period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.monotonic, read: Callable[[int], float | None] = process_cpu_s):
        self.pids, self.cores, self.demand, self.period_s = tuple(pids), cores, demand, period_s
        self.clock, self.read = clock, read
        self.last: tuple[float, float, bool] | None = None  # (time, CPU seconds, wanted more than the cores)
        self.first: tuple[float, float] | None = None
        self.saturated_s = 0.0
        self.saturated_cpu_s = 0.0
        self.failed = False

    def tick(self) -> None:
        """Take a sample where `period_s` has passed since the last one."""
        if not self.failed and (self.last is None or self.clock() - self.last[0] >= self.period_s):
            self.sample()

    def sample(self) -> None:
        """Read every rank's CPU seconds now; the interval since the last sample counts as
        saturated where the work wanted more than the cores at both its ends."""
        readings = [self.read(pid) for pid in self.pids]
        if any(r is None for r in readings):
            self.failed = True  # a rank gone, or no /proc: the figures would be wrong
            return
        now, cpu, wanting = self.clock(), sum(readings), self.demand() > self.cores
        if self.last is None:
            self.first = (now, cpu)
        elif wanting and self.last[2]:
            self.saturated_s += now - self.last[0]
            self.saturated_cpu_s += cpu - self.last[1]
        self.last = (now, cpu, wanting)

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
