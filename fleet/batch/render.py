"""Batch scripts from a `BatchJob`: pure functions, text in, text out (no I/O).

`render(job)` picks `render_slurm` or `render_lsf`; `script_path(job)` is where `fleet submit`
writes the result. Golden files in tests/golden/ hold the expected text.
"""

from __future__ import annotations

import math
import re
import shlex

from fleet.batch import templates
from fleet.batch.job import CHECKPOINT_WARNING_S, EXIT_CHECKPOINTED, BatchJob, BatchSystem, EnvKind, EnvStep
from fleet.errors import UserError

SCRIPT_NAMES = {BatchSystem.SLURM: "sbatch.sh", BatchSystem.LSF: "bsub.sh"}


def script_path(job: BatchJob) -> str:
    return f"{job.run_dir}/{SCRIPT_NAMES[job.system]}"


def render(job: BatchJob) -> str:
    return render_slurm(job) if job.system is BatchSystem.SLURM else render_lsf(job)


def render_slurm(job: BatchJob) -> str:
    """The sbatch script: ``srun --mpi=pmi2`` starts `fleet train` on every rank."""
    resources = _directives("#SBATCH", [
        f"--gpus-per-node={job.gpus_per_node}" if job.gpus_per_node else None,
        f"--time={slurm_time(job.walltime_s)}" if job.walltime_s else None,
        f"--account={job.account}" if job.account else None,
        f"--partition={job.partition}" if job.partition else None,
    ])
    return fill(templates.SLURM, {
        **_common(job),
        "cpus_per_task": str(job.cpus_per_task),
        "resources": resources,
    })


def render_lsf(job: BatchJob) -> str:
    """The bsub script: jsrun starts `fleet train` with one resource set per rank (`render_erf`)."""
    resources = _directives("#BSUB", [
        f"-W {lsf_time(job.walltime_s)}" if job.walltime_s else None,
        f"-P {job.account}" if job.account else None,
        f"-q {job.partition}" if job.partition else None,
    ])
    return fill(templates.LSF, {
        **_common(job),
        "preprocessors": _first_ranks(job.preprocessors_per_node),
        "cores": _n(job.cpus_per_task, "core"),
        "gpus": "trainer i gets GPU i only (its cuda:0), a preprocessor none." if job.gpus_per_node
        else "no rank gets a GPU (CPU only).",
        "smt": str(SMT),
        "warning_min": str(math.ceil(CHECKPOINT_WARNING_S / 60)),
        "erf": render_erf(job),
        "resources": resources,
    })


def _first_ranks(preprocessors: int) -> str:
    if preprocessors == 1:
        return "the first rank is the preprocessor"
    return f"the first {preprocessors} ranks are preprocessors"


SMT = 4
"""Hardware threads per core of an LSF job: the script asks for ``-alloc_flags smt4`` and the
ERF's logical CPU indices count threads at this level (Summit's default; a POWER9 core has 4)."""

FIRST_COMPUTE_HOST = 1
"""The ERF host number of the first compute node: on CSM LSF (Summit, Sierra) jsrun numbers
the launch (batch) node 0 and the job's compute nodes 1..N."""


def render_erf(job: BatchJob) -> str:
    """jsrun's explicit resource file: one resource set per rank, world ranks node-major.

    On each node the first ``preprocessors_per_node`` ranks are CPU-only preprocessors and the
    next ``trainers_per_node`` are trainers, trainer i with ``gpu: {i}`` (none on a CPU job),
    as `fleet.runtime.launch.topology` assigns roles. Local rank k takes the hardware threads
    ``k*c*SMT .. (k+1)*c*SMT - 1`` (c = cpus_per_task), packed in node-local order.
    """
    threads = job.cpus_per_task * SMT
    lines = ["cpu_index_using: logical", "launch_distribution: packed"]
    for rank in range(job.tasks):
        node, local = divmod(rank, job.tasks_per_node)
        trainer = local - job.preprocessors_per_node
        gpu = f" ; gpu: {{{trainer}}}" if trainer >= 0 and job.gpus_per_node else ""
        cpus = f"{local * threads}-{(local + 1) * threads - 1}"
        lines.append(f"rank: {rank}: {{ host: {FIRST_COMPUTE_HOST + node}; cpu: {{{cpus}}}{gpu} }}")
    return "".join(line + "\n" for line in lines)


def _common(job: BatchJob) -> dict[str, str]:
    _check_directive_path("--run-dir", job.run_dir)
    return {
        "name": job.name,
        "layout": layout(job),
        "script": shlex.quote(script_path(job)),
        "nodes": str(job.nodes),
        "tasks_per_node": str(job.tasks_per_node),
        "warning_s": str(CHECKPOINT_WARNING_S),
        "exit_checkpointed": str(EXIT_CHECKPOINTED),
        "run_dir": job.run_dir,
        "run_dir_q": shlex.quote(job.run_dir),
        "spec_q": shlex.quote(job.spec_path),
        "workdir_q": shlex.quote(job.workdir),
        "env": "".join(line + "\n" for step in job.env for line in env_lines(step)),
        "fleet": shlex.join(job.fleet),
        "launcher_args": f"{job.launcher_args} " if job.launcher_args else "",
        "train_args": f" --calibrate-from {shlex.quote(job.calibrate_from)}" if job.calibrate_from else "",
        "forward_and_wait": templates.FORWARD_AND_WAIT,
    }


def layout(job: BatchJob) -> str:
    """``2 nodes x (4 trainers + 1 preprocessor) = 10 ranks, 4 GPUs per node``."""
    gpus = f", {_n(job.gpus_per_node, 'GPU')} per node" if job.gpus_per_node else ", CPU only"
    return (
        f"{_n(job.nodes, 'node')} x ({_n(job.trainers_per_node, 'trainer')} + "
        f"{_n(job.preprocessors_per_node, 'preprocessor')}) = {_n(job.tasks, 'rank')}{gpus}"
    )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def env_lines(step: EnvStep) -> list[str]:
    if step.kind is EnvKind.MODULE:
        return ["module load " + " ".join(name for name in step.value.split(",") if name)]
    if step.kind is EnvKind.CONDA:
        return ['eval "$(conda shell.bash hook)"', f"conda activate {shlex.quote(step.value)}"]
    return [f"source {shlex.quote(step.value + '/bin/activate')}"]


def slurm_time(seconds: int) -> str:
    """``[D-]HH:MM:SS``."""
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def lsf_time(seconds: int) -> str:
    """``HH:MM``, rounded up to a whole minute (LSF's run limit has no seconds)."""
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every ``{{name}}``; a name without a value is a bug (KeyError)."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _directives(prefix: str, options: list[str | None]) -> str:
    return "".join(f"{prefix} {option}\n" for option in options if option)


def _check_directive_path(option: str, path: str) -> None:
    if re.search(r"\s", path):
        raise UserError(f"{option} {path!r}: #SBATCH/#BSUB lines cannot hold a path with spaces")
