"""The golden-file cases of the batch scripts: a spec, a cluster section and `fleet submit` options.

Each case renders to tests/golden/<name>; the slurm/ and lsf/ examples are the same scripts
with a commentary block of ``## `` lines after the shebang. After a deliberate change to the
templates, regenerate both and review the diff:

    .venv/bin/python tests/golden/regenerate.py
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent
CWD = "/home/user/fleet"  # where the user ran `fleet submit`
PYTHON = "/home/user/fleet/.venv/bin/python"


@dataclass(frozen=True)
class Case:
    name: str  # the golden file's name
    spec: str  # a spec of the repository
    cluster: dict  # replaces the spec's cluster section
    options: dict  # SubmitOptions fields
    example: str | None = None  # the commented example of the same script, relative to REPO


CASES = (
    Case(
        "slurm-gpu4.sh", "examples/fleet100.yaml",
        {"nodes": 10, "gpus_per_node": 4, "preprocessors_per_node": "auto", "device": "cuda"},
        {"system": "slurm", "time": "6:00:00", "account": "abc123", "partition": "gpu", "preprocessors": 2,
         "cpus_per_task": 8, "env": ("module:cuda/12.4", "venv:/home/user/fleet/.venv")},
        "slurm/examples/gpu4-per-node.sh",
    ),
    Case(
        "slurm-gpu8.sh", "examples/fleet100.yaml",
        {"nodes": 4, "gpus_per_node": 8, "preprocessors_per_node": 4, "device": "cuda"},
        {"system": "slurm", "time": "1-00:00:00", "partition": "gpu", "cpus_per_task": 10,
         "env": ("conda:fleet",)},
        "slurm/examples/gpu8-per-node.sh",
    ),
    Case(
        "slurm-cpu.sh", "examples/quickstart.yaml",
        {"nodes": 4, "gpus_per_node": 8, "preprocessors_per_node": 2, "device": "cpu", "threads_per_trainer": 4},
        {"system": "slurm", "time": "90", "account": "abc123", "partition": "compute"},
        "slurm/examples/cpu-cluster.sh",
    ),
    Case(
        "lsf-summit.sh", "examples/fleet100.yaml",
        {"nodes": 10, "gpus_per_node": 6, "preprocessors_per_node": "auto", "device": "cuda"},
        {"system": "lsf", "time": "2:00:00", "account": "ABC123", "partition": "batch", "preprocessors": 1,
         "cpus_per_task": 6, "env": ("module:open-ce", "conda:fleet"),
         "launcher_args": '--smpiargs="-disable_gpu_hooks"'},
        "lsf/examples/summit.sh",
    ),
    Case(
        "lsf-cpu.sh", "examples/quickstart.yaml",
        {"nodes": 2, "gpus_per_node": 4, "preprocessors_per_node": 1, "device": "cpu"},
        {"system": "lsf"},
    ),
)


def render_case(case: Case) -> str:
    from fleet.batch import BatchSystem, SubmitOptions, batch_job, render
    from fleet.spec import parse_spec

    doc = yaml.safe_load((REPO / case.spec).read_text())
    doc["cluster"] = case.cluster
    spec = parse_spec(doc, check_paths=False)
    options = SubmitOptions(**{**case.options, "system": BatchSystem(case.options["system"])})
    return render(batch_job(spec, case.spec, options, CWD, PYTHON))


def without_commentary(text: str) -> str:
    """An example script without its ``## `` commentary lines: the rendered script."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("## "))


def with_commentary(script: str, commented: str) -> str:
    """`script` with the ``## `` lines of `commented` after its shebang line."""
    notes = "".join(line for line in commented.splitlines(keepends=True) if line.startswith("## "))
    shebang, _, rest = script.partition("\n")
    return f"{shebang}\n{notes}{rest}"
