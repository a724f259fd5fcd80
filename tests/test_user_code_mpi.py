"""A user model that calls sys.exit (or raises KeyboardInterrupt) while a job trains ends the
whole job at once, with one line naming the rank and what the model's code did.

Before, the rank left quietly with exit code 0 and the other ranks waited for it until
`runtime.timeout_s`. The runtime's timeout here is far longer than the test's own.
"""

import json

import pytest
import yaml

from conftest import REPO, run_fleet

pytestmark = pytest.mark.mpi

FAMILY = "tests.specs.bad.usermods.nets:tiny"  # imported from the repository's root, where the ranks start


def write_run(tmp_path, mode: str):
    """A spec of an MLP and a user model whose forward misbehaves (`mode`), and a run directory
    whose profile.json lets the plan skip profiling, so that the trainers meet the forward."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "quit", "seed": 1, "data": {"source": "digits", "val_fraction": 0.2},
        "models": [{"family": "mlp", "params": {"hidden": [16]}},
                   {"family": FAMILY, "params": {"mode": mode}, "name": "quitter"}],
        "train": {"batch_size": 32, "max_epochs": 2},
        "scheduler": {"policy": "fleet-g", "profile": False},
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 900, "chunk_samples": 64, "qp_samples": 512, "qt_samples": 512},
    }))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rates = [{"id": m, "rates": {"1": 1000.0, "2": 1800.0}, "epochs": 2} for m in ("mlp-000", "quitter")]
    (run_dir / "profile.json").write_text(json.dumps(
        {"schema": 1, "gpus_per_node": 2, "samples_per_epoch": 1437, "models": rates}))
    return spec, run_dir


@pytest.mark.parametrize(
    ("mode", "problem"),
    [("exits", "forward called sys.exit(0)"),
     ("interrupts", "forward raised KeyboardInterrupt (its own code, not a Ctrl-C)")],
)
def test_a_user_model_that_exits_ends_the_job_with_one_line_naming_the_rank(tmp_path, mode, problem):
    spec, run_dir = write_run(tmp_path, mode)
    done = run_fleet("run", str(spec), "--run-dir", str(run_dir), "--quiet", cwd=REPO, timeout=240)
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if problem in line]
    assert done.returncode == 2, output[-3000:]
    assert len(lines) == 1, output[-3000:]
    assert lines[0].startswith("fleet: rank ") and "(trainer of quitter, node 0)" in lines[0]
    assert f"family '{FAMILY}': {problem}" in lines[0]
    assert "Traceback" not in output and "interrupted" not in output
    assert problem in (run_dir / "fleet-errors.log").read_text()


MYNETS = '''
from torch import nn


def tiny(input_shape, num_classes, hidden=16):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
'''


def test_a_user_model_beside_the_spec_is_found_without_pythonpath(tmp_path):
    """`family: mynets:tiny` with mynets.py beside the spec: `fleet validate` and `fleet run`
    (every rank) find it, started from another folder, through the `fleet` console script
    (which puts no working directory on sys.path) and with no PYTHONPATH; and a module in the
    folder fleet runs from is found too."""
    import os
    import subprocess
    import sys

    from conftest import mpi_env

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "mynets.py").write_text(MYNETS)
    (elsewhere / "herenets.py").write_text(MYNETS)
    spec = project / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "mine", "seed": 1, "data": {"source": "digits", "val_fraction": 0.2},
        "models": [{"family": "mynets:tiny", "params": {"hidden": 8}, "name": "beside"},
                   {"family": "herenets:tiny", "name": "here"}],
        "train": {"batch_size": 32, "max_epochs": 1},
        "scheduler": {"policy": "fleet-g", "profile": False},
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 300},
    }))
    env = {k: v for k, v in mpi_env().items() if k != "PYTHONPATH"}
    fleet = os.path.join(os.path.dirname(sys.executable), "fleet")
    for command in (["validate", str(spec)], ["run", str(spec), "--run-dir", str(tmp_path / "run"), "--quiet"]):
        done = subprocess.run([fleet, *command], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=300)
        assert done.returncode == 0, (command[0], done.stdout[-2000:], done.stderr[-2000:])
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert {m["id"]: m["epochs"] for m in result["models"]} == {"beside": 1, "here": 1}
