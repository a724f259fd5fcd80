"""Horovod as the collective of trainer groups, under a real mpiexec (built by `make horovod`).

The collective itself (sums, broadcasts, a group of m against one process, thirty groups
opened and closed, waiting without spinning, timeouts) runs in tests/test_collectives.py with
the other backends. Here: whole runs with ``runtime.collective: horovod`` beside the same runs
with ``mpi``: groups of 2 and 3 trainers train alike, groups of several sizes form and dissolve
over rounds, a run checkpointed on the signal resumes, and the quickstart ends alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, mpi_env
from test_runtime_mpi import (digits_train_size, emulated_workload, epochs_by_model, events, results, signal_job,
                              start_train, train, write_profile, write_spec)
from fleet.runtime.train.collectives.horovod import HorovodCollective

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.skipif(HorovodCollective.unavailable("cpu") is not None and os.environ.get("FLEET_REQUIRE_HOROVOD") != "1",
                       reason="Horovod is not built here (make horovod)"),
]

ONE_CNN = [{"family": "cnn", "name": "x", "params": {"channels": [8, 16], "hidden": 32}}]


def group_sizes(run_dir: Path) -> dict[str, set[int]]:
    """The sizes of the groups each model trained in."""
    sizes: dict[str, set[int]] = {}
    for event in events(run_dir):
        if event["event"] == "member_start":
            sizes.setdefault(event["model"], set()).add(len(event["gpus"]))
    return sizes


def one_model_on(tmp_path: Path, trainers: int, collective: str, max_epochs: int = 3) -> Path:
    """The spec of one CNN that FLEET-G puts on all `trainers` (its profile says it scales)."""
    spec = write_spec(tmp_path / f"{collective}-{trainers}.yaml", ONE_CNN,
                      {"nodes": 1, "gpus_per_node": trainers, "preprocessors_per_node": 1}, "fleet-g",
                      train={"batch_size": 16, "max_epochs": max_epochs, "optimizer": "sgd", "lr": 0.05,
                             "stop": {"patience": 100}},
                      runtime={"collective": collective})
    return spec


def reported_collective(run_dir: Path) -> str:
    return next(e["collective"] for e in events(run_dir) if e["event"] == "run_start")


@pytest.mark.parametrize("trainers", [2, 3])
def test_a_group_trains_under_horovod_as_under_mpi(tmp_path, trainers):
    """One model on a group of m trainers, same seeds: Horovod's losses and accuracies are
    the MPI backend's, epoch by epoch (float tolerance)."""
    histories = {}
    for collective in ("horovod", "mpi"):
        spec = one_model_on(tmp_path, trainers, collective)
        run_dir = tmp_path / collective
        write_profile(run_dir, {"x": 500.0}, {"x": 3}, trainers, digits_train_size(0.2, 1), trainers)
        train(trainers + 1, spec, run_dir)
        assert group_sizes(run_dir) == {"x": {trainers}}
        assert reported_collective(run_dir) == collective
        histories[collective] = results(run_dir)["models"][0]["history"]
    assert [h["epoch"] for h in histories["horovod"]] == [1, 2, 3]
    for key in ("train_loss", "val_accuracy", "val_loss"):
        np.testing.assert_allclose([h[key] for h in histories["horovod"]], [h[key] for h in histories["mpi"]],
                                   rtol=1e-5, err_msg=key)


def test_groups_of_several_sizes_form_and_dissolve_over_rounds(tmp_path):
    """2 virtual nodes x (3 trainers + 1 preprocessor), emulated, FLEET-G under Horovod: groups
    of different sizes start and end over at least three rounds (each a Horovod started and
    shut down on its members), with no hang and every epoch trained once; the same run under
    MPI ends with the same epochs."""
    rates, epochs = emulated_workload(7, seed=3, low=1500, high=4000)
    models = [{"family": "mlp", "name": m} for m in rates]
    n = digits_train_size(0.2, 1)
    finished = {}
    for collective in ("horovod", "mpi"):
        spec = write_spec(tmp_path / f"{collective}.yaml", models,
                          {"nodes": 2, "gpus_per_node": 3, "preprocessors_per_node": 1, "device": "emulated"},
                          "fleet-g", train={"batch_size": 32, "max_epochs": 20}, runtime={"collective": collective})
        run_dir = tmp_path / collective
        write_profile(run_dir, rates, epochs, 3, n, 6)
        train(8, spec, run_dir, "--ranks-per-node", "4")
        res = results(run_dir)
        assert epochs_by_model(run_dir) == {m: list(range(1, e + 1)) for m, e in epochs.items()}
        finished[collective] = {m["id"]: m["epochs"] for m in res["models"]}
        if collective == "horovod":
            assert res["rounds"] >= 3, res["rounds"]
            sizes = set().union(*group_sizes(run_dir).values())
            assert len(sizes - {1}) >= 2, f"groups of one size only: {sizes}"
    assert finished["horovod"] == finished["mpi"] == epochs


def test_a_horovod_run_checkpointed_on_the_signal_resumes(tmp_path):
    """A model training on two trainers under Horovod is checkpointed mid-epoch on SIGUSR1 (exit
    75); the next start resumes it under Horovod and trains every epoch exactly once."""
    spec = one_model_on(tmp_path, 2, "horovod", max_epochs=4)
    run_dir = tmp_path / "run"
    write_profile(run_dir, {"x": 500.0}, {"x": 4}, 2, digits_train_size(0.2, 1), 2)
    signal_job(start_train(3, spec, run_dir), run_dir, 1)
    saved = json.loads((run_dir / "checkpoints" / "x" / "latest.json").read_text())
    assert saved["epochs"] < 4, saved
    train(3, spec, run_dir)
    final = results(run_dir)
    assert final["interrupted"] is False
    history = final["models"][0]["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert all(h["samples"] == digits_train_size(0.2, 1) for h in history)
    assert any(e["event"] == "member_start" and e["resume"] and len(e["gpus"]) == 2 for e in events(run_dir))


def test_the_quickstart_ends_alike_under_horovod_and_mpi(tmp_path):
    """`fleet run` of the quickstart (10 nets, FLEET-G on 3 slots), once per backend, both
    planning with the rates estimated from FLOPs (so with the same plan): every model ends
    with the same epochs, and some trained on 2 or more slots."""
    data = tmp_path / "data"
    made = subprocess.run([sys.executable, "-m", "fleet", "data", "make", "synthetic", "--format", "jpeg", "--out",
                           str(data), "--classes", "10", "--samples", "2400", "--image-size", "20", "--channels", "3",
                           "--seed", "0"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert made.returncode == 0, made.stderr
    text = (REPO / "examples" / "quickstart.yaml").read_text().replace("path: data/quickstart", f"path: {data}")
    assert "  policy: fleet-g\n" in text
    text = text.replace("  policy: fleet-g\n", "  policy: fleet-g\n  profile: false\n")
    epochs = {}
    for collective in ("horovod", "mpi"):
        spec = tmp_path / f"quickstart-{collective}.yaml"
        spec.write_text(text + f"\nruntime: {{collective: {collective}}}\n")
        run_dir = tmp_path / collective
        done = subprocess.run([sys.executable, "-m", "fleet", "run", str(spec), "--run-dir", str(run_dir), "--quiet"],
                              capture_output=True, text=True, cwd=REPO, timeout=600, env=mpi_env())
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert f"groups reduce with {collective}" in done.stdout
        epochs[collective] = {m["id"]: m["epochs"] for m in results(run_dir)["models"]}
        assert any(max(sizes) >= 2 for sizes in group_sizes(run_dir).values()), group_sizes(run_dir)
    assert epochs["horovod"] == epochs["mpi"]
