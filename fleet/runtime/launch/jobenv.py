"""The job-environment adapter: who started this process, and where it sits in the job.

This is the ONLY module in fleet that reads launcher and batch-system variables
(``SLURM_*``, ``LSB_*``, ``JSM_NAMESPACE_*``, ``OMPI_COMM_WORLD_*``, ``PMI_*``, ``MPI_LOCAL*``,
``PMIX_*``, ``CUDA_VISIBLE_DEVICES``). Everything else takes the frozen `JobEnv` that
`read_job_env(os.environ)` returns (STYLE item 6; the model is submitit's
``core/job_environment.py``: one table of variables per cluster).

It is pure: no MPI import, and the environment is an argument, so tests pass plain dicts.

Which launcher started this process
-----------------------------------
Launchers nest, and an inner launcher forwards the outer one's variables: Hydra's
``mpiexec`` forwards its whole environment to every rank (so an ``mpiexec`` inside an
``sbatch`` script hands each rank ``SLURM_PROCID=0`` of the batch step, and its proxies,
started with ``srun``, add a ``SLURM_STEP_ID``); Open MPI's ``mpirun`` starts its daemons with
``srun`` under Slurm. So the innermost launcher, the one that started *this* process, wins,
and each launcher is recognised by variables that only it sets for the processes it starts.
`LAUNCHERS` is tried in this order, the first match wins:

1. MPICH/Hydra ``mpiexec`` (also Intel MPI's Hydra): ``MPI_LOCALRANKID`` with ``PMI_RANK``
   or ``PMI_ID``. Hydra's proxy sets these per process; srun, jsrun and Open MPI never do.
2. LSF ``jsrun`` (IBM JSM): ``JSM_NAMESPACE_RANK``. Checked before Open MPI because jsrun
   (Spectrum MPI) also sets ``OMPI_COMM_WORLD_*``; the values agree, the name does not.
3. Open MPI ``mpirun``/``mpiexec``/``prterun``: ``OMPI_COMM_WORLD_RANK``.
4. Slurm ``srun``: ``SLURM_PROCID`` *and* a ``SLURM_STEP_ID`` (or ``SLURM_STEPID``) of a real
   job step. A batch script alone has ``SLURM_PROCID`` but no step id (or a special one:
   batch, extern, interactive are >= 0xfffffff0), so a plain ``python`` in an ``sbatch``
   script is a singleton, not rank 0 of ``SLURM_NTASKS``.
5. Another PMI-1 launcher (MPICH's gforker, ``srun --mpi=pmi2`` outside a step, ...):
   ``PMI_RANK``, reported as `Launcher.MPICH`.
6. A PMIx server alone (``prun``, a PMIx launcher not listed above): ``PMIX_RANK``.
7. Nothing: a singleton, rank 0 of 1 (`Launcher.UNKNOWN`).

The batch system (`Scheduler`) is read separately: the job id, node list, requeue count and
the like come from Slurm or LSF whichever launcher started the ranks (an ``mpiexec`` inside
an sbatch allocation has launcher ``mpich`` and scheduler ``slurm``). When the launcher is
srun or jsrun, its own batch system is used; otherwise Slurm first, then LSF.

Sources relied on
-----------------
- Slurm: srun(1) and sbatch(1) "OUTPUT ENVIRONMENT VARIABLES"
  (https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES): SLURM_PROCID
  (global rank), SLURM_LOCALID (node-local task id), SLURM_NODEID (relative node id),
  SLURM_NTASKS / SLURM_STEP_NUM_TASKS, SLURM_STEP_NUM_NODES, SLURM_STEP_TASKS_PER_NODE /
  SLURM_TASKS_PER_NODE (compressed, e.g. ``2(x3),1``), SLURMD_NODENAME, SLURM_JOB_ID,
  SLURM_STEP_ID, SLURM_JOB_NUM_NODES / SLURM_NNODES, SLURM_JOB_NODELIST (hostlist,
  e.g. ``node[01-03,7]``), SLURM_NTASKS_PER_NODE, SLURM_CPUS_PER_TASK, SLURM_RESTART_COUNT
  (set when the job was restarted or requeued). Step ids of the batch/extern/interactive
  steps are the special values of slurm.h (0xfffffffa-0xfffffffd; older releases
  0xfffffffe-0xffffffff).
- Open MPI 5 docs, "Environment variables set for MPI applications"
  (https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html):
  OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}. OMPI_COMM_WORLD_NODE_RANK is "the
  relative rank of this process on this node looking across *all* jobs", not a node index,
  so it is not read.
- MPICH Hydra source, ``src/pm/hydra/proxy/pmip_cb.c`` ``launch_procs()``: per process the
  proxy sets MPI_LOCALNRANKS, MPI_LOCALRANKID, PMI_RANK (PMI_ID with ``-pmi-port``),
  PMI_SIZE, PMI_FD, and the proxy host's name in PMI_HOSTNAME, on top of the forwarded
  environment of mpiexec. (Checked here: ``mpiexec -n 2 env`` of the PyPI mpich 5.0.2 wheel.)
- IBM JSM jsrun docs and PyTorch Lightning's ``LSFEnvironment``: JSM_NAMESPACE_RANK,
  JSM_NAMESPACE_SIZE, JSM_NAMESPACE_LOCAL_RANK (JSM_NAMESPACE_LOCAL_SIZE read when set),
  LSB_JOBID; libEnsemble's resource detection: LSB_HOSTS (a host per slot) and
  LSB_MCPU_HOSTS (``host n host n ...``). On some machines (Summit) the first host is the
  launch node; the list is kept as LSF gives it.
- PMIx standard: PMIX_RANK is set by every PMIx server (prterun, srun --mpi=pmix, jsrun).
- CUDA C Programming Guide, "CUDA Environment Variables": CUDA_VISIBLE_DEVICES is a comma
  list of indices or ``GPU-``/``MIG-`` UUIDs; enumeration stops at the first invalid entry
  (so ``-1`` or Slurm's ``NoDevFiles`` hide every GPU).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from fleet.errors import UserError


class JobEnvError(UserError):
    """A launcher variable that cannot be read (e.g. ``PMI_RANK='x'``); names the variable."""


class Launcher(str, Enum):
    """The program that started this process."""

    SLURM = "slurm"
    LSF = "lsf"
    OPENMPI = "openmpi"
    MPICH = "mpich"
    PMIX = "pmix"
    UNKNOWN = "unknown"


class Scheduler(str, Enum):
    """The batch system whose allocation this process runs in."""

    SLURM = "slurm"
    LSF = "lsf"
    NONE = "none"


@dataclass(frozen=True)
class JobEnv:
    """This process's place in the job, as its launcher and batch system describe it.

    Every field is None where the launcher does not say. Rank fields come from the launcher
    that started this process only (see the module docstring); job fields from the batch
    system.

    Attributes:
        launcher: Who started this process.
        rank, size: World rank and number of ranks.
        local_rank, local_size: Rank among, and number of, this launch's ranks on this node.
        node_index, node_count: This node's index and the node count of the launch (srun only).
        node_name: The launcher's name for this node (srun: SLURMD_NODENAME; Hydra:
            PMI_HOSTNAME); None where it has none, and topology uses the host name.
        step_id: The Slurm job step.
        scheduler: The batch system.
        job_id: The batch job's id (Slurm SLURM_JOB_ID, LSF LSB_JOBID), a string.
        job_nodes: Nodes in the allocation.
        job_hosts: The allocation's host names, in the batch system's order.
        ntasks_per_node: Slurm ``--ntasks-per-node``, when given.
        cpus_per_task: Slurm ``--cpus-per-task``, when given.
        restart_count: How often Slurm restarted or requeued this job (SLURM_RESTART_COUNT;
            absent on a first run, so None means "not restarted, or not Slurm").
        cuda_visible_devices: CUDA_VISIBLE_DEVICES as parsed by `parse_cuda_visible_devices`;
            None when unset (every GPU visible), ``()`` when set to hide them all.
        pmix: A PMIx server started this process (PMIX_NAMESPACE or PMIX_RANK is set: Open
            MPI's mpirun, ``srun --mpi=pmix``, jsrun, prterun), whatever `launcher` says.
    """

    launcher: Launcher = Launcher.UNKNOWN
    rank: int | None = 0
    size: int | None = 1
    local_rank: int | None = 0
    local_size: int | None = 1
    node_index: int | None = 0
    node_count: int | None = 1
    node_name: str | None = None
    step_id: str | None = None
    scheduler: Scheduler = Scheduler.NONE
    job_id: str | None = None
    job_nodes: int | None = None
    job_hosts: tuple[str, ...] | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    restart_count: int | None = None
    cuda_visible_devices: tuple[str, ...] | None = None
    pmix: bool = False

    @property
    def restarted(self) -> bool:
        """True when the batch system says this job ran before (requeued or restarted)."""
        return bool(self.restart_count)

    def __str__(self) -> str:
        def of(value: int | None, total: int | None) -> str:
            return f"{'?' if value is None else value}/{'?' if total is None else total}"

        parts = [
            f"launcher {self.launcher.value}",
            f"rank {of(self.rank, self.size)}",
            f"local {of(self.local_rank, self.local_size)}",
        ]
        if self.node_name or self.node_index is not None:
            parts.append(f"node {self.node_name or self.node_index}")
        if self.job_id is not None:
            parts.append(f"{self.scheduler.value} job {self.job_id}")
        return "JobEnv(" + ", ".join(parts) + ")"


# --- launcher tables --------------------------------------------------------------------

# Slurm's special step ids (slurm.h): pending, extern, batch, interactive; older releases
# used 0xfffffffe (batch) and 0xffffffff (extern). None of them is an srun step.
_SLURM_SPECIAL_STEP_MIN = 0xFFFFFFF0


@dataclass(frozen=True)
class LauncherTable:
    """Where one launcher puts a process's place in the job.

    Each field lists the variables to read, first set wins; ``()`` means the launcher does
    not say. `tasks_per_node` names a Slurm-style compressed per-node count list, used for
    `local_size` (indexed by the node index) when no variable gives it directly.
    """

    launcher: Launcher
    started_us: Callable[[Mapping[str, str]], bool]
    rank: tuple[str, ...] = ()
    size: tuple[str, ...] = ()
    local_rank: tuple[str, ...] = ()
    local_size: tuple[str, ...] = ()
    node_index: tuple[str, ...] = ()
    node_count: tuple[str, ...] = ()
    node_name: tuple[str, ...] = ()
    step_id: tuple[str, ...] = ()
    tasks_per_node: tuple[str, ...] = ()


def _is_srun_step(environ: Mapping[str, str]) -> bool:
    """SLURM_PROCID plus the id of a real job step (not the batch, extern or interactive step)."""
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    if "SLURM_PROCID" not in environ or step is None:
        return False
    return step.strip().isdigit() and int(step) < _SLURM_SPECIAL_STEP_MIN


HYDRA = LauncherTable(
    Launcher.MPICH,
    lambda env: "MPI_LOCALRANKID" in env and ("PMI_RANK" in env or "PMI_ID" in env),
    rank=("PMI_RANK", "PMI_ID"),
    size=("PMI_SIZE",),
    local_rank=("MPI_LOCALRANKID",),
    local_size=("MPI_LOCALNRANKS",),
    node_name=("PMI_HOSTNAME",),
)
JSRUN = LauncherTable(
    Launcher.LSF,
    lambda env: "JSM_NAMESPACE_RANK" in env,
    rank=("JSM_NAMESPACE_RANK",),
    size=("JSM_NAMESPACE_SIZE",),
    local_rank=("JSM_NAMESPACE_LOCAL_RANK",),
    local_size=("JSM_NAMESPACE_LOCAL_SIZE",),
)
OPENMPI = LauncherTable(
    Launcher.OPENMPI,
    lambda env: "OMPI_COMM_WORLD_RANK" in env,
    rank=("OMPI_COMM_WORLD_RANK",),
    size=("OMPI_COMM_WORLD_SIZE",),
    local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",),
    local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",),
)
SRUN = LauncherTable(
    Launcher.SLURM,
    _is_srun_step,
    rank=("SLURM_PROCID",),
    size=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
    local_rank=("SLURM_LOCALID",),
    node_index=("SLURM_NODEID",),
    node_count=("SLURM_STEP_NUM_NODES", "SLURM_NNODES"),
    node_name=("SLURMD_NODENAME",),
    step_id=("SLURM_STEP_ID", "SLURM_STEPID"),
    tasks_per_node=("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
)
PMI = LauncherTable(
    Launcher.MPICH,
    lambda env: "PMI_RANK" in env,
    rank=("PMI_RANK",),
    size=("PMI_SIZE",),
)
PMIX = LauncherTable(
    Launcher.PMIX,
    lambda env: "PMIX_RANK" in env,
    rank=("PMIX_RANK",),
)

LAUNCHERS: tuple[LauncherTable, ...] = (HYDRA, JSRUN, OPENMPI, SRUN, PMI, PMIX)
"""Launcher tables in detection order: the first whose `started_us` holds wins."""


# --- batch-system tables ----------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerTable:
    """Where one batch system describes the job (first set variable wins)."""

    scheduler: Scheduler
    job_id: tuple[str, ...]
    job_nodes: tuple[str, ...] = ()
    hosts: Callable[[Mapping[str, str]], tuple[str, ...] | None] = lambda env: None
    ntasks_per_node: tuple[str, ...] = ()
    cpus_per_task: tuple[str, ...] = ()
    restart_count: tuple[str, ...] = ()


def _slurm_hosts(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    text = _first(environ, ("SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    return None if text is None else expand_hostlist(text[1])


def _lsf_hosts(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    if "LSB_MCPU_HOSTS" in environ:  # "hostA 4 hostB 4"
        return _unique(environ["LSB_MCPU_HOSTS"].split()[0::2])
    if "LSB_HOSTS" in environ:  # "hostA hostA hostB hostB": one entry per slot
        return _unique(environ["LSB_HOSTS"].split())
    return None


SLURM_JOB = SchedulerTable(
    Scheduler.SLURM,
    job_id=("SLURM_JOB_ID", "SLURM_JOBID"),
    job_nodes=("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    hosts=_slurm_hosts,
    ntasks_per_node=("SLURM_NTASKS_PER_NODE",),
    cpus_per_task=("SLURM_CPUS_PER_TASK",),
    restart_count=("SLURM_RESTART_COUNT",),
)
LSF_JOB = SchedulerTable(Scheduler.LSF, job_id=("LSB_JOBID",), hosts=_lsf_hosts)

SCHEDULERS: tuple[SchedulerTable, ...] = (SLURM_JOB, LSF_JOB)


ALLOCATION_VARIABLES = ("SLURM_", "LSB_", "PBS_", "COBALT_", "PE_HOSTFILE")
"""Prefixes of the variables by which an mpiexec finds a batch allocation (Slurm, LSF,
PBS/Torque, Cobalt, Grid Engine): MPICH Hydra's resource-management kernels and Open MPI's
ras/plm components read them to spread ranks over the allocation's nodes."""


def without_allocation(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the batch allocation's variables (`ALLOCATION_VARIABLES`).

    For an mpiexec that must start every rank on this machine: inside a multi-node
    allocation, Open MPI's mpirun otherwise starts daemons on the other nodes with srun, and
    Hydra with ``-launcher fork`` forks every rank here but tells those it meant for other
    nodes that they run there (``PMI_HOSTNAME``).
    """
    return {name: value for name, value in environ.items() if not name.startswith(ALLOCATION_VARIABLES)}


# --- reading ----------------------------------------------------------------------------


def read_job_env(environ: Mapping[str, str]) -> JobEnv:
    """Read this process's `JobEnv` from an environment (pass ``os.environ``).

    Raises:
        JobEnvError: a launcher variable is not a non-negative integer, or the rank is not
            below the size.
    """
    table = next((t for t in LAUNCHERS if t.started_us(environ)), None)
    launch = _read_launch(table, environ) if table is not None else {}
    job = _read_job(_scheduler_for(table, environ), environ)
    devices = environ.get("CUDA_VISIBLE_DEVICES")
    return JobEnv(
        **launch,
        **job,
        cuda_visible_devices=None if devices is None else parse_cuda_visible_devices(devices),
        pmix="PMIX_NAMESPACE" in environ or "PMIX_RANK" in environ,
    )


def _read_launch(table: LauncherTable, environ: Mapping[str, str]) -> dict:
    fields = {
        name: _int(environ, getattr(table, name))
        for name in ("rank", "size", "local_rank", "local_size", "node_index", "node_count")
    }
    if fields["local_size"] is None and table.tasks_per_node and fields["node_index"] is not None:
        fields["local_size"] = _tasks_on_node(environ, table.tasks_per_node, fields["node_index"])
    for outer, inner in (("size", "rank"), ("local_size", "local_rank"), ("node_count", "node_index")):
        if fields[outer] is not None and fields[inner] is not None and fields[inner] >= fields[outer]:
            raise JobEnvError(
                f"job environment ({table.launcher.value}): {inner.replace('_', ' ')} "
                f"{fields[inner]} is not below {outer.replace('_', ' ')} {fields[outer]} "
                f"({_names(environ, getattr(table, inner))}, {_names(environ, getattr(table, outer))})"
            )
    node_name = _first(environ, table.node_name)
    step_id = _first(environ, table.step_id)
    return {
        "launcher": table.launcher,
        **fields,
        "node_name": (node_name[1].strip() or None) if node_name else None,
        "step_id": step_id[1].strip() if step_id else None,
    }


def _scheduler_for(table: LauncherTable | None, environ: Mapping[str, str]) -> SchedulerTable | None:
    own = {Launcher.SLURM: SLURM_JOB, Launcher.LSF: LSF_JOB}.get(table.launcher) if table else None
    candidates = ((own,) if own else ()) + SCHEDULERS
    return next((s for s in candidates if _first(environ, s.job_id) is not None), None)


def _read_job(table: SchedulerTable | None, environ: Mapping[str, str]) -> dict:
    if table is None:
        return {}
    hosts = table.hosts(environ)
    job_nodes = _int(environ, table.job_nodes, strict=False)
    return {
        "scheduler": table.scheduler,
        "job_id": _first(environ, table.job_id)[1].strip(),
        "job_nodes": job_nodes if job_nodes is not None or hosts is None else len(hosts),
        "job_hosts": hosts,
        "ntasks_per_node": _int(environ, table.ntasks_per_node, strict=False),
        "cpus_per_task": _int(environ, table.cpus_per_task, strict=False),
        "restart_count": _int(environ, table.restart_count, strict=False),
    }


# --- value parsers ----------------------------------------------------------------------


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, value) of the first of `names` that is set, else None."""
    for name in names:
        if name in environ:
            return name, environ[name]
    return None


def _names(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    found = _first(environ, names)
    return f"{found[0]}={found[1]!r}" if found else "unset"


def _int(environ: Mapping[str, str], names: tuple[str, ...], strict: bool = True) -> int | None:
    """The first set variable of `names` as an int; None when none is set.

    A value that is not a non-negative integer raises `JobEnvError` when `strict` (the rank
    fields, which the job cannot run without), else reads as None (informational fields).
    """
    found = _first(environ, names)
    if found is None:
        return None
    name, value = found
    if value.strip().isdigit():
        return int(value)
    if strict:
        raise JobEnvError(f"job environment: {name}={value!r} is not a non-negative integer")
    return None


_CUDA_ENTRY = re.compile(r"^(\d+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+)$")


def parse_cuda_visible_devices(value: str) -> tuple[str, ...]:
    """The visible devices of a CUDA_VISIBLE_DEVICES value, as CUDA enumerates them.

    Entries are indices or GPU-/MIG- UUIDs; like CUDA, the list stops at the first entry that
    cannot name a device (``-1``, ``NoDevFiles``), so ``""`` and ``"-1"`` give ``()``.
    """
    devices: list[str] = []
    for entry in (part.strip() for part in value.split(",")):
        if not _CUDA_ENTRY.match(entry):
            break
        devices.append(entry)
    return tuple(devices)


def parse_tasks_per_node(value: str) -> tuple[int, ...]:
    """Expand Slurm's compressed per-node task counts: ``"2(x3),1"`` -> ``(2, 2, 2, 1)``."""
    counts: list[int] = []
    for item in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ValueError(f"not a Slurm task count list: {value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return tuple(counts)


def _tasks_on_node(environ: Mapping[str, str], names: tuple[str, ...], node: int) -> int | None:
    name, value = _first(environ, names) or (None, None)
    if value is None:
        return None
    try:
        counts = parse_tasks_per_node(value)
    except ValueError:
        raise JobEnvError(f"job environment: {name}={value!r} is not a Slurm task count list") from None
    return counts[node] if node < len(counts) else None


def expand_hostlist(text: str) -> tuple[str, ...] | None:
    """Expand a Slurm hostlist: ``"n[01-03,7],gpu[1-2]-ib"`` -> ``n01 n02 n03 n7 gpu1-ib gpu2-ib``.

    Several bracket groups in one name multiply out. Returns None for text it cannot read
    (the host list is informational; nothing fails on it).
    """
    try:
        return tuple(host for item in _split_top_level(text) for host in _expand_item(item))
    except ValueError:
        return None


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise ValueError(text)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(text)
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    hosts: list[str] = []
    for part in match.group(1).split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(item)
        values = range(int(low), int(high) + 1) if dash else [int(low)]
        for value in values:
            hosts += _expand_item(f"{head}{str(value).zfill(len(low))}{tail}")
    return hosts


def _unique(names: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))
