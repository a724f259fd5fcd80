"""A batch job, derived from a spec and the `fleet submit` options by pure functions.

`batch_job(spec, spec_path, options, cwd, python)` is the one place that decides a job's shape: nodes,
tasks per node (trainers + preprocessors), GPUs, cores per task, walltime. The renderers in
`render.py` only format a `BatchJob`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import Enum

from fleet.errors import UserError
from fleet.runtime.launch import signals
from fleet.spec import Device, Spec

CHECKPOINT_WARNING_S = 120
"""How long before the walltime the batch system sends the checkpoint signal (USR1)."""

EXIT_CHECKPOINTED = signals.EXIT_CHECKPOINTED
"""`fleet train`'s "checkpointed, not finished" exit code (75): the scripts requeue the job on it."""

DEFAULT_PREPROCESSORS = 1
"""Preprocessors per node when the spec says ``auto`` and ``--preprocessors`` does not."""


class BatchSystem(str, Enum):
    SLURM = "slurm"
    LSF = "lsf"


class EnvKind(str, Enum):
    CONDA = "conda"
    VENV = "venv"
    MODULE = "module"


@dataclass(frozen=True)
class EnvStep:
    """One step that prepares the job's shell: load modules, activate conda or a venv."""

    kind: EnvKind
    value: str


@dataclass(frozen=True)
class SubmitOptions:
    """`fleet submit`'s options, as typed (validated by `batch_job`)."""

    system: BatchSystem
    time: str | None = None
    account: str | None = None
    partition: str | None = None
    env: tuple[str, ...] = ()
    preprocessors: int | None = None
    cpus_per_task: int | None = None
    launcher_args: str | None = None
    calibrate_from: str | None = None


@dataclass(frozen=True)
class BatchJob:
    """Everything a batch script says, with every path absolute.

    Attributes:
        name: The job's name (the spec's name).
        spec_path, run_dir, workdir: The spec, the run directory, and the directory the job
            runs in (where `fleet submit` ran: the spec's relative paths resolve from it).
        nodes, trainers_per_node, preprocessors_per_node: The ranks' layout.
        gpus_per_node: GPUs to request per node (0 on a CPU or emulated run).
        cpus_per_task: Cores per rank.
        walltime_s: The time limit, None for the site's default.
        account, partition: Slurm --account/--partition, LSF -P/-q.
        env: Steps that prepare the environment, in order.
        fleet: The command that starts fleet (``python -m fleet`` or ``fleet``).
        launcher_args: Extra flags for srun or jsrun, as typed (shell syntax).
        calibrate_from: An earlier run's directory whose measured costs the job predicts and
            plans with (`fleet train --calibrate-from`), or None.
    """

    system: BatchSystem
    name: str
    spec_path: str
    run_dir: str
    workdir: str
    nodes: int
    trainers_per_node: int
    preprocessors_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    walltime_s: int | None = None
    account: str | None = None
    partition: str | None = None
    env: tuple[EnvStep, ...] = ()
    fleet: tuple[str, ...] = ("fleet",)
    launcher_args: str | None = None
    calibrate_from: str | None = None

    @property
    def tasks_per_node(self) -> int:
        return self.trainers_per_node + self.preprocessors_per_node

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node


def batch_job(spec: Spec, spec_path: str, options: SubmitOptions, cwd: str, python: str) -> BatchJob:
    """The job that trains `spec` under `options.system`.

    Args:
        spec: The loaded spec (with ``--run-dir`` already applied).
        spec_path: The spec file as given; made absolute against `cwd`.
        cwd: The directory `fleet submit` runs in; the job runs there too.
        python: This interpreter; without ``--env`` the job starts fleet with it.

    Raises:
        UserError: an option is invalid; the message names it.
    """
    if spec.cluster.virtual_nodes and spec.cluster.nodes > 1:
        raise UserError(
            f"cluster.virtual_nodes: true runs {spec.cluster.nodes} nodes on one machine, but a batch job asks "
            "for real nodes; set virtual_nodes: false (or nodes: 1) to submit it"
        )
    env = tuple(parse_env(text, cwd) for text in options.env)
    return BatchJob(
        system=options.system,
        name=spec.name,
        spec_path=_absolute(spec_path, cwd),
        run_dir=_absolute(spec.run_dir, cwd),
        workdir=cwd,
        nodes=spec.cluster.nodes,
        trainers_per_node=spec.cluster.gpus_per_node,
        preprocessors_per_node=preprocessors_per_node(spec, options.preprocessors),
        gpus_per_node=spec.cluster.gpus_per_node if spec.cluster.device is Device.CUDA else 0,
        cpus_per_task=options.cpus_per_task or spec.cluster.threads_per_trainer,
        walltime_s=None if options.time is None else parse_walltime(options.time),
        account=_plain("--account", options.account),
        partition=_plain("--partition" if options.system is BatchSystem.SLURM else "--queue", options.partition),
        env=env,
        fleet=("fleet",) if env else (python, "-m", "fleet"),
        launcher_args=options.launcher_args or None,
        calibrate_from=_absolute(options.calibrate_from, cwd) if options.calibrate_from else None,
    )


def preprocessors_per_node(spec: Spec, override: int | None) -> int:
    """The spec's count; with ``auto``, `override` or `DEFAULT_PREPROCESSORS`."""
    fixed = spec.cluster.preprocessors_per_node
    if fixed == "auto":
        return override or DEFAULT_PREPROCESSORS
    if override is not None and override != fixed:
        raise UserError(
            f"--preprocessors {override}: the spec fixes cluster.preprocessors_per_node: {fixed} "
            f"(set it to auto to choose at submission)"
        )
    return fixed


_WALLTIME_FORMS = (
    (re.compile(r"(\d+)"), ("m",)),
    (re.compile(r"(\d+):(\d+)"), ("m", "s")),
    (re.compile(r"(\d+):(\d+):(\d+)"), ("h", "m", "s")),
    (re.compile(r"(\d+)-(\d+)"), ("d", "h")),
    (re.compile(r"(\d+)-(\d+):(\d+)"), ("d", "h", "m")),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"), ("d", "h", "m", "s")),
)
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_walltime(text: str) -> int:
    """Seconds of a Slurm-style time limit: ``90`` (minutes), ``MM:SS``, ``HH:MM:SS``,
    ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``.

    Raises:
        UserError: not one of these forms, or no longer than the checkpoint warning.
    """
    for pattern, units in _WALLTIME_FORMS:
        match = pattern.fullmatch(text.strip())
        if match:
            seconds = sum(int(v) * _SECONDS[u] for v, u in zip(match.groups(), units))
            break
    else:
        raise UserError(f"--time {text!r}: expected minutes, HH:MM:SS or D-HH:MM:SS (Slurm's forms)")
    if seconds <= CHECKPOINT_WARNING_S:
        raise UserError(
            f"--time {text!r}: must be longer than the {CHECKPOINT_WARNING_S} s checkpoint warning "
            f"sent before the walltime"
        )
    return seconds


def parse_env(text: str, cwd: str) -> EnvStep:
    """``conda:NAME``, ``venv:PATH`` (made absolute) or ``module:NAME[,NAME...]``."""
    kind, _, value = text.partition(":")
    valid = ", ".join(f"{k.value}:..." for k in EnvKind)
    if kind not in {k.value for k in EnvKind} or not value.strip():
        raise UserError(f"--env {text!r}: expected conda:NAME, venv:PATH or module:NAME[,NAME...] ({valid})")
    step = EnvStep(EnvKind(kind), value.strip())
    if step.kind is EnvKind.VENV:
        return EnvStep(EnvKind.VENV, _absolute(os.path.expanduser(step.value), cwd))
    _plain(f"--env {kind}", step.value.replace(",", ""))
    return step


def _absolute(path: str, cwd: str) -> str:
    return os.path.normpath(os.path.join(cwd, path))


_PLAIN = re.compile(r"[A-Za-z0-9_.+/@%=-]+")


def _plain(option: str, value: str | None) -> str | None:
    """`value` if it is one word that needs no quoting in a #SBATCH/#BSUB line."""
    if value is not None and not _PLAIN.fullmatch(value):
        raise UserError(f"{option} {value!r}: use letters, digits and _ . + / @ % = - only")
    return value
