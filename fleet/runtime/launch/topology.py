"""Rank topology: which node each rank is on, its role for the whole job, and its GPU.

Every rank is a **preprocessor** or a **trainer** (DESIGN.md, "Processes and data flow").
On each node the first ``p`` local ranks (in world order) preprocess and the next
``gpus_per_node`` train; a trainer owns one GPU slot, numbered across the job as
``node * gpus_per_node + trainer_index``.

`assign_roles` is pure (a list of node ids in, a frozen `Topology` out) and checks that the
job's ranks fit `cluster`; a misfit is one `TopologyError` line that says what the job has
and what the spec needs. The MPI part only finds each rank's node: `node_of_rank_by_hostname`
all-gathers host names without spinning, and `node_of_rank_virtual` cuts one machine into
virtual nodes of consecutive ranks. `build_topology` picks one and calls `assign_roles`;
every rank gets the same node list, so every rank returns the same topology or raises the
same error (no rank is left waiting on one that failed). `fleet.runtime.launch.process.exit_all`
turns that error into one line and exit status 2 for the whole job.

`bind_device` maps a trainer to ``cuda:<i>`` through CUDA_VISIBLE_DEVICES semantics; it
depends on what this rank sees, so unlike the rest it may fail on some ranks only.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from fleet.errors import UserError
from fleet.runtime.launch.jobenv import JobEnv, Launcher
from fleet.runtime.waiting import IDLE, wait_request
from fleet.spec.sections import ClusterSpec, Device

HOSTNAME_BYTES = 256
"""Fixed width of one rank's name in the host-name all-gather (names up to 255 bytes)."""


class TopologyError(UserError):
    """The job's ranks do not fit `cluster` (one line, starts with ``cluster``, exit 2)."""


class LaunchMismatch(UserError):
    """MPI and the launcher do not fit: MPI sees one rank where the launcher started several,
    or ``MPI_Init`` would abort under this launcher.

    Each rank raises it; only the launcher's rank 0 (`prints`) should say so.
    """

    def __init__(self, message: str, env: JobEnv):
        super().__init__(message)
        self.prints = env.rank in (0, None)


def check_launch(world_size: int, env: JobEnv, library: str) -> None:
    """Raise `LaunchMismatch` when MPI's world is one rank but the launcher says it started more.

    That is mpi4py built against another MPI than the launcher's (the mpich wheel under a
    system mpirun, mpi4py for Open MPI under MPICH's mpiexec, srun without the PMI the library
    needs): the ranks would never meet, and each would find the job too small. `library`
    names the MPI that mpi4py was built with.
    """
    if world_size != 1 or (env.size or 1) <= 1:
        return
    raise LaunchMismatch(
        f"launch: the launcher ({env.launcher.value}) started {env.size} ranks but MPI sees 1 in each: "
        f"mpi4py is built with {library}, which does not speak this launcher's protocol; start the job "
        f"with that MPI's mpiexec, or rebuild mpi4py against the launcher's MPI "
        f"(MPICC=mpicc pip install --no-binary=mpi4py mpi4py)",
        env,
    )


def check_library(env: JobEnv, library_version: str) -> None:
    """Before ``MPI_Init``: raise `LaunchMismatch` where it would abort every rank.

    MPICH built without PMIx (the PyPI mpich wheel's, say) aborts ``MPI_Init`` in a process
    that a PMIx server started, with a block of its own ("Runtime environment uses
    unsupported PMI version PMIx") on every rank: the mpich wheel's mpi4py under Open MPI's
    mpirun or ``srun --mpi=pmix``. `library_version` is ``MPI_Get_library_version``'s text,
    which MPICH gives before ``MPI_Init``, with its configure line. Other MPICH derivatives
    (Cray, Intel, MVAPICH) name themselves differently and are left to ``MPI_Init``.
    """
    if not env.pmix or env.launcher is Launcher.MPICH or not _mpich_without_pmix(library_version):
        return
    version = library_version.split("\n", 1)[0].partition(":")[2].strip()
    raise LaunchMismatch(
        f"launch: the launcher ({env.launcher.value}) speaks PMIx, and mpi4py's MPI (MPICH {version}) is built "
        f"without it, so MPI_Init would abort every rank: start the job with MPICH's mpiexec (or srun "
        f"--mpi=pmi2), or give mpi4py the launcher's MPI (its wheel: MPI4PY_LIBMPI=libmpi.so.40 for Open MPI; "
        f"or MPICC=mpicc pip install --no-binary=mpi4py mpi4py)",
        env,
    )


def _mpich_without_pmix(library_version: str) -> bool:
    lines = library_version.splitlines()
    if not lines or not lines[0].startswith("MPICH Version:"):
        return False
    configure = next((line for line in lines if line.startswith("MPICH configure:")), None)
    return configure is not None and "pmix" not in configure.lower()


class Role(str, Enum):
    PREPROCESSOR = "preprocessor"
    TRAINER = "trainer"


@dataclass(frozen=True)
class RankPlacement:
    """Where one world rank sits and what it does.

    Attributes:
        rank: World rank.
        node: Node id; nodes are numbered in the order of their lowest world rank.
        local_rank: Index among this node's ranks, in world order.
        role: Preprocessor or trainer, for the whole job.
        trainer_index: Index among this node's trainers (None for a preprocessor).
        gpu: Global trainer slot, ``node * gpus_per_node + trainer_index`` (None for a preprocessor).
        preprocessor_index: Index among all preprocessors, node-major (None for a trainer).
    """

    rank: int
    node: int
    local_rank: int
    role: Role
    trainer_index: int | None = None
    gpu: int | None = None
    preprocessor_index: int | None = None


@dataclass(frozen=True)
class Topology:
    """Every rank's placement (index = world rank) and the per-node layout it follows.

    Attributes:
        placements: One `RankPlacement` per world rank, in rank order.
        nodes: Number of nodes.
        gpus_per_node: Trainers per node.
        preprocessors_per_node: Preprocessors per node ("auto" resolved to a count).
        node_names: The host name of each node when discovered by name, else ``()``.
    """

    placements: tuple[RankPlacement, ...]
    nodes: int
    gpus_per_node: int
    preprocessors_per_node: int
    node_names: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.placements)

    @property
    def gpus(self) -> int:
        """Trainer slots in the job."""
        return self.nodes * self.gpus_per_node

    def placement(self, rank: int) -> RankPlacement:
        return self.placements[rank]

    def node_of(self, rank: int) -> int:
        return self.placements[rank].node

    def role_of(self, rank: int) -> Role:
        return self.placements[rank].role

    def gpu_of(self, rank: int) -> int | None:
        """The trainer slot of `rank`; None for a preprocessor."""
        return self.placements[rank].gpu

    def trainer_rank(self, gpu: int) -> int:
        """The world rank that trains on trainer slot `gpu` (inverse of `gpu_of`)."""
        for placement in self.placements:
            if placement.gpu == gpu:
                return placement.rank
        raise ValueError(f"no trainer slot {gpu}: the job has slots 0..{self.gpus - 1}")

    def trainer_ranks(self, node: int | None = None) -> list[int]:
        """Trainer ranks in slot order, on `node` or on every node."""
        trainers = [p for p in self.placements if p.role is Role.TRAINER and node in (None, p.node)]
        return [p.rank for p in sorted(trainers, key=lambda p: p.gpu)]

    def preprocessor_ranks(self, node: int | None = None) -> list[int]:
        """Preprocessor ranks in preprocessor order, on `node` or on every node."""
        found = [p for p in self.placements if p.role is Role.PREPROCESSOR and node in (None, p.node)]
        return [p.rank for p in sorted(found, key=lambda p: p.preprocessor_index)]

    def describe(self) -> str:
        """A few lines for the console: the layout, then per node its ranks and roles."""
        lines = [
            f"topology: {_layout(self.nodes, self.gpus_per_node, str(self.preprocessors_per_node))} "
            f"= {self.size} ranks"
        ]
        for node in range(self.nodes):
            name = f" ({self.node_names[node]})" if self.node_names else ""
            preprocessors = ", ".join(str(r) for r in self.preprocessor_ranks(node))
            trainers = ", ".join(f"{r} (gpu {self.gpu_of(r)})" for r in self.trainer_ranks(node))
            lines.append(f"  node {node}{name}: preprocessors {preprocessors}; trainers {trainers}")
        return "\n".join(lines)


# --- roles (pure) -----------------------------------------------------------------------


def assign_roles(node_of_rank: Sequence[int], cluster: ClusterSpec) -> Topology:
    """Give every rank its node, role and trainer slot.

    Args:
        node_of_rank: Any node label per world rank; ranks with equal labels share a node.
            Nodes are renumbered by their lowest world rank.
        cluster: The spec's cluster section.

    Raises:
        TopologyError: the node count differs from ``cluster.nodes``, nodes have unequal rank
            counts, a node has fewer than ``gpus_per_node + 1`` ranks, or a fixed
            ``preprocessors_per_node`` does not fill the node.
    """
    if not node_of_rank:
        raise ValueError("assign_roles needs at least one rank")
    node_ids = number_nodes(node_of_rank)
    members: list[list[int]] = [[] for _ in range(max(node_ids) + 1)]
    for rank, node in enumerate(node_ids):
        members[node].append(rank)
    per_node = _check_fit([len(ranks) for ranks in members], cluster)
    preprocessors = per_node - cluster.gpus_per_node
    placements = [
        _place(rank, node, local, preprocessors, cluster.gpus_per_node)
        for node, ranks in enumerate(members)
        for local, rank in enumerate(ranks)
    ]
    return Topology(
        placements=tuple(sorted(placements, key=lambda p: p.rank)),
        nodes=len(members),
        gpus_per_node=cluster.gpus_per_node,
        preprocessors_per_node=preprocessors,
    )


def number_nodes(labels: Sequence[Any]) -> list[int]:
    """Renumber node labels 0, 1, ... in the order of each node's lowest world rank."""
    ids: dict[Any, int] = {}
    return [ids.setdefault(label, len(ids)) for label in labels]


def _place(rank: int, node: int, local: int, preprocessors: int, gpus_per_node: int) -> RankPlacement:
    if local < preprocessors:
        return RankPlacement(
            rank, node, local, Role.PREPROCESSOR, preprocessor_index=node * preprocessors + local
        )
    trainer = local - preprocessors
    return RankPlacement(
        rank, node, local, Role.TRAINER, trainer_index=trainer, gpu=node * gpus_per_node + trainer
    )


def _check_fit(counts: list[int], cluster: ClusterSpec) -> int:
    """The ranks per node if `counts` (ranks on each node) fit `cluster`, else TopologyError."""
    gpn, auto = cluster.gpus_per_node, cluster.preprocessors_per_node == "auto"
    have, need = _have(counts), _need(cluster)
    if len(counts) != cluster.nodes:
        per = f"at least {gpn + 1}" if auto else str(gpn + cluster.preprocessors_per_node)
        virtual = ", or cluster.virtual_nodes: true to split this machine" if len(counts) == 1 else ""
        raise TopologyError(
            f"cluster: {have}; {need} (launch with {per} ranks per node on "
            f"{_n(cluster.nodes, 'node')}, or set cluster.nodes: {len(counts)}{virtual})"
        )
    if len(set(counts)) > 1:
        raise TopologyError(
            f"cluster: {have}; {need}, the same on every node (launch the same number of "
            f"ranks on each node, e.g. srun --ntasks-per-node or mpiexec -ppn)"
        )
    per_node = counts[0]
    if per_node < gpn + 1:
        fewer = f", or set cluster.gpus_per_node: {per_node - 1}" if per_node > 1 else ""
        raise TopologyError(
            f"cluster: {have}; {need}, and every node needs at least one preprocessor "
            f"(launch with at least {gpn + 1} ranks per node{fewer})"
        )
    if not auto and per_node != gpn + cluster.preprocessors_per_node:
        raise TopologyError(
            f"cluster: {have}; {need} (launch with {gpn + cluster.preprocessors_per_node} "
            f"ranks per node, or set cluster.preprocessors_per_node: {per_node - gpn} or auto)"
        )
    return per_node


def _have(counts: list[int]) -> str:
    total, nodes = sum(counts), len(counts)
    if nodes == 1:
        return f"the job has {_n(total, 'rank')} on 1 node"
    if len(set(counts)) == 1:
        detail = f"{counts[0]} per node"
    elif nodes <= 8:
        detail = " + ".join(str(c) for c in counts)
    else:
        detail = f"{min(counts)} to {max(counts)} per node"
    return f"the job has {_n(total, 'rank')} on {nodes} nodes ({detail})"


def _need(cluster: ClusterSpec) -> str:
    gpn, ppn = cluster.gpus_per_node, cluster.preprocessors_per_node
    if ppn == "auto":
        total = f"at least {_n(cluster.nodes * (gpn + 1), 'rank')}"
        layout = _layout(cluster.nodes, gpn, "at least 1")
    else:
        total = _n(cluster.nodes * (gpn + ppn), "rank")
        layout = _layout(cluster.nodes, gpn, str(ppn))
    return f"the spec needs {layout} = {total}"


def _layout(nodes: int, gpus_per_node: int, preprocessors: str) -> str:
    plural = "" if preprocessors.endswith(" 1") or preprocessors == "1" else "s"
    return f"{_n(nodes, 'node')} x ({_n(gpus_per_node, 'trainer')} + {preprocessors} preprocessor{plural})"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# --- node discovery ---------------------------------------------------------------------


def node_of_rank_virtual(size: int, ranks_per_node: int) -> list[int]:
    """Virtual nodes of consecutive ranks: rank r is on node ``r // ranks_per_node``.

    Raises:
        TopologyError: `ranks_per_node` is not positive or does not divide `size`.
    """
    if ranks_per_node < 1:
        raise TopologyError(f"cluster: ranks per node must be a positive integer, got {ranks_per_node}")
    if size % ranks_per_node:
        raise TopologyError(
            f"cluster: the job's {_n(size, 'rank')} do not split into nodes of {ranks_per_node} "
            f"(launch with a multiple of {ranks_per_node} ranks)"
        )
    return [rank // ranks_per_node for rank in range(size)]


def gather_node_names(world: Any, name: str, timeout_s: float = 600.0) -> list[str]:
    """Every rank's node name, in rank order, by a non-blocking all-gather polled without spinning.

    Each rank sends `name` in a fixed `HOSTNAME_BYTES` buffer; a name of 256 bytes or more
    is replaced by its SHA-256 hex digest (the same on every rank of that node).

    Raises:
        fleet.runtime.waiting.WaitTimeout: some rank did not join within `timeout_s`.
    """
    from mpi4py import MPI

    send = bytearray(_encode_name(name))
    recv = bytearray(HOSTNAME_BYTES * world.Get_size())
    request = world.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE])
    wait_request(request, "every rank's host name (topology)", timeout_s, IDLE)
    chunks = (recv[i : i + HOSTNAME_BYTES] for i in range(0, len(recv), HOSTNAME_BYTES))
    return [bytes(chunk).rstrip(b"\0").decode("utf-8", "replace") for chunk in chunks]


def _encode_name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) >= HOSTNAME_BYTES:
        raw = hashlib.sha256(raw).hexdigest().encode("ascii")
    return raw.ljust(HOSTNAME_BYTES, b"\0")


def local_node_name(env: JobEnv) -> str:
    """This rank's node name: the launcher's (SLURMD_NODENAME, PMI_HOSTNAME) or the host name."""
    return env.node_name or socket.gethostname()


def node_of_rank_by_hostname(world: Any, env: JobEnv, timeout_s: float = 600.0) -> list[int]:
    """Node id of every rank, ranks with the same node name sharing one; numbered by lowest rank."""
    return number_nodes(gather_node_names(world, local_node_name(env), timeout_s))


def build_topology(
    world: Any,
    cluster: ClusterSpec,
    env: JobEnv,
    ranks_per_node: int | None = None,
    timeout_s: float = 600.0,
) -> Topology:
    """Discover the nodes and assign roles; the same result (or error) on every rank.

    Nodes are virtual when `ranks_per_node` is given (``--ranks-per-node``) or
    ``cluster.virtual_nodes`` is set (then ``size // cluster.nodes`` ranks per node), else
    found by node name. Collective over `world` only in the by-name case.

    Raises:
        TopologyError: the ranks do not fit `cluster` (identical on every rank).
    """
    size = world.Get_size()
    if ranks_per_node is not None:
        return assign_roles(node_of_rank_virtual(size, ranks_per_node), cluster)
    if cluster.virtual_nodes:
        if size % cluster.nodes:
            raise TopologyError(
                f"cluster.virtual_nodes: the job's {_n(size, 'rank')} do not split evenly into "
                f"cluster.nodes: {cluster.nodes} (launch with a multiple of {cluster.nodes} ranks)"
            )
        return assign_roles(node_of_rank_virtual(size, size // cluster.nodes), cluster)
    names = gather_node_names(world, local_node_name(env), timeout_s)
    topology = assign_roles(number_nodes(names), cluster)
    return replace(topology, node_names=tuple(dict.fromkeys(names)))  # node i's name: i-th new name


# --- devices ----------------------------------------------------------------------------


def bind_device(
    placement: RankPlacement,
    cluster: ClusterSpec,
    env: JobEnv,
    visible_gpu_count: int | None = None,
) -> str:
    """The torch device string of one rank: ``"cuda:<i>"`` for a CUDA trainer, else ``"cpu"``.

    A launcher that gives each task exactly one GPU (CUDA_VISIBLE_DEVICES with one entry:
    ``srun --gpus-per-task=1``, jsrun resource sets of 1 GPU) makes it ``cuda:0``; otherwise
    a trainer uses its node-local trainer index. `visible_gpu_count` is what the caller's
    ``torch.cuda.device_count()`` says (this module does not import torch); without it the
    count is the length of CUDA_VISIBLE_DEVICES, or unchecked when that is unset.

    Raises:
        TopologyError: this rank sees too few GPUs for its trainer index (per rank: other
            ranks may see more).
    """
    if placement.role is not Role.TRAINER or cluster.device is not Device.CUDA:
        return "cpu"
    visible = env.cuda_visible_devices
    count = visible_gpu_count if visible_gpu_count is not None else (None if visible is None else len(visible))
    if count != 0 and visible is not None and len(visible) == 1:
        return "cuda:0"
    if count is not None and placement.trainer_index >= count:
        shown = "unset" if visible is None else repr(",".join(visible))
        raise TopologyError(
            f"cluster.gpus_per_node: {cluster.gpus_per_node} trainers per node, but rank "
            f"{placement.rank} (trainer {placement.trainer_index} on node {placement.node}) sees "
            f"{_n(count, 'GPU')} (CUDA_VISIBLE_DEVICES {shown}); give each node "
            f"{cluster.gpus_per_node} GPUs or each trainer task one GPU"
        )
    return f"cuda:{placement.trainer_index}"
