"""What this process runs on: the cores it may use (standard library only)."""

from __future__ import annotations

import os


def node_cores() -> int:
    """Cores this process may run on: its affinity (a Slurm job's cgroup, a launcher's
    binding), or the machine's cores where the system cannot say."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
