"""Batch jobs for Slurm and LSF: a `BatchJob` from a spec, its script, its submission.

`job.py` and `render.py` are pure (no I/O); `submit.py` runs sbatch or bsub.
"""

from fleet.batch.job import (
    CHECKPOINT_WARNING_S,
    EXIT_CHECKPOINTED,
    BatchJob,
    BatchSystem,
    EnvKind,
    EnvStep,
    SubmitOptions,
    batch_job,
    parse_env,
    parse_walltime,
)
from fleet.batch.render import render, render_lsf, render_slurm, script_path

__all__ = [
    "CHECKPOINT_WARNING_S",
    "EXIT_CHECKPOINTED",
    "BatchJob",
    "BatchSystem",
    "EnvKind",
    "EnvStep",
    "SubmitOptions",
    "batch_job",
    "parse_env",
    "parse_walltime",
    "render",
    "render_lsf",
    "render_slurm",
    "script_path",
]
