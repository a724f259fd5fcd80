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
    """The bsub script: one jsrun resource set per node starts `fleet train` on every rank."""
    resources = _directives("#BSUB", [
        f"-W {lsf_time(job.walltime_s)}" if job.walltime_s else None,
        f"-P {job.account}" if job.account else None,
        f"-q {job.partition}" if job.partition else None,
    ])
    return fill(templates.LSF, {
        **_common(job),
        "preprocessors": _first_ranks(job.preprocessors_per_node),
        "warning_min": str(math.ceil(CHECKPOINT_WARNING_S / 60)),
        "jsrun_flags": " ".join(jsrun_flags(job)),
        "resources": resources,
    })


def _first_ranks(preprocessors: int) -> str:
    if preprocessors == 1:
        return "the first rank is the preprocessor"
    return f"the first {preprocessors} ranks are preprocessors"


def jsrun_flags(job: BatchJob) -> list[str]:
    """One resource set per node with all its ranks, cores and GPUs; each rank bound to its cores."""
    return [
        "-n", str(job.nodes), "-r", "1", "-a", str(job.tasks_per_node),
        "-c", str(job.tasks_per_node * job.cpus_per_task), "-g", str(job.gpus_per_node),
        "--bind", f"packed:{job.cpus_per_task}", "-d", "packed",
    ]


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
        "forward_and_wait": templates.FORWARD_AND_WAIT,
    }


def layout(job: BatchJob) -> str:
    """``2 nodes x (4 trainers + 1 preprocessor) = 10 ranks, 4 GPUs per node``."""
    def n(count: int, noun: str) -> str:
        return f"{count} {noun}{'' if count == 1 else 's'}"

    gpus = f", {n(job.gpus_per_node, 'GPU')} per node" if job.gpus_per_node else ", CPU only"
    return (
        f"{n(job.nodes, 'node')} x ({n(job.trainers_per_node, 'trainer')} + "
        f"{n(job.preprocessors_per_node, 'preprocessor')}) = {n(job.tasks, 'rank')}{gpus}"
    )


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
