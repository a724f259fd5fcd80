"""What this process runs on: the cores it may use (standard library only)."""

from __future__ import annotations

import os
from collections.abc import Sequence


def node_cores() -> int:
    """Cores this process may run on: its affinity (a Slurm job's cgroup, a launcher's
    binding), or the machine's cores where the system cannot say."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cores_per_node(cores: float, rank_hosts: Sequence[str], rank_nodes: Sequence[int], host: str) -> float:
    """The cores one node of the job has: `cores` of the machine `host`, shared by the job's
    nodes that run there (virtual nodes on one machine share its cores). `rank_hosts` and
    `rank_nodes`: each rank's machine and node."""
    here = {node for rank_host, node in zip(rank_hosts, rank_nodes) if rank_host == host}
    return cores / max(1, len(here))
