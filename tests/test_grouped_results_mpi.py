"""Learning over groups (issue 47) under a real mpiexec, its results, early stopping and
ensembles: four configurations on three Zipf-sized groups under `grouped` with asha, each rung
deciding among the configurations of one group, and an ensemble per group; results.json's
`group_results`, `fleet status`'s groups done, the report's groups section in a real headless
browser, and `fleet predict --group`."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO, mpi_env
from headless import browser, open_page
from preprocess.make import make_synthetic
from test_runtime_mpi import results, train

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CONFIGURATIONS = [{"family": "mlp", "name": "a", "params": {"hidden": [16]}},
                  {"family": "mlp", "name": "b", "params": {"hidden": [48]}},
                  {"family": "mlp", "name": "c", "params": {"hidden": [16]}, "train": {"lr": 0.001}},
                  {"family": "mlp", "name": "d", "params": {"hidden": [32]}, "train": {"lr": 0.2}}]


def grouped_asha_spec(tmp_path: Path) -> Path:
    """600 16x16 images of 4 classes in 3 groups; the 4 configurations, 4 epochs at most,
    asha (rungs at 1 and 2 epochs, η = 2), an ensemble of 3 steps, on 1 node of 2 CPU trainers."""
    data = make_synthetic(tmp_path / "data.h5", "hdf5", classes=4, samples=600, image_size=16, progress=False,
                          groups=3, seed=1)
    doc = {
        "name": "grouped-asha", "seed": 1,
        "data": {"source": "hdf5", "path": str(data), "image_size": 16, "val_fraction": 0.2, "test_fraction": 0.2,
                 "group_by": {"dataset": "groups"}, "min_group_samples": 20},
        "models": CONFIGURATIONS,
        "train": {"batch_size": 16, "max_epochs": 4, "optimizer": "sgd", "lr": 0.05},
        "scheduler": {"policy": "grouped", "profile": False,
                      "early_stop": {"method": "asha", "min_epochs": 1, "reduction": 2}},
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 90, "chunk_samples": 32, "qp_samples": 256, "qt_samples": 256},
        "ensemble": {"size": 3},
    }
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(doc))
    return spec


def check_rungs_per_group(run_dir: Path, groups: dict[str, str]) -> None:
    """Every rung decision was made among the models of its group that reached that rung by
    then: the first of a group there trains on with no cut-off (fewer than η), and a cut-off is
    the metric of a model of the same group."""
    decisions = sorted((json.loads(line) for line in (run_dir / "rungs.jsonl").read_text().splitlines()),
                       key=lambda d: d["seq"])
    arrived: dict[tuple[str, int], list[float]] = {}
    for d in decisions:
        mine = arrived.setdefault((groups[d["model"]], d["rung"]), [])
        if not mine:
            assert (d["verdict"], d["cutoff"]) == ("continue", None), d
        else:
            assert d["cutoff"] in mine + [d["metric"]], d
        mine.append(d["metric"])
    assert any(d["verdict"] == "stopped" for d in decisions)
    assert len({g for g, _ in arrived}) == 3  # every group had rungs of its own


def check_group_ensembles(run_dir: Path, done: dict) -> None:
    """Each group kept its own validation and test labels, and has an ensemble of its own models;
    `fleet predict` applies the ensemble of the group it is given."""
    ensembles = json.loads((run_dir / "ensemble.json").read_text())
    assert list(ensembles["groups"]) == [g["key"] for g in done["group_results"]]
    for key, doc in ensembles["groups"].items():
        assert {m["model"] for m in doc["members"]} <= {m for m, g in done["groups"].items() if g == key}
        assert doc["evaluated_on"] == "test"
        val = {h["val_samples"] for m in done["models"] if done["groups"][m["id"]] == key for h in m["history"]}
        labels = np.load(run_dir / "predictions" / f"labels-validation-{key}.npy")  # synthetic keys are id parts
        assert {len(labels)} == val
    assert ensembles["ensemble"]["samples"] == sum(d["ensemble"]["samples"] for d in ensembles["groups"].values())
    key = done["group_results"][0]["key"]
    predicted = subprocess.run([sys.executable, "-m", "fleet", "predict", str(run_dir), "--data",
                                str(run_dir.parent / "data.h5"), "--group", key], capture_output=True, text=True,
                               cwd=REPO, env=mpi_env(), timeout=300)
    assert predicted.returncode == 0 and "fleet: predict: 600 samples" in predicted.stdout, predicted.stderr


def test_a_grouped_run_stops_early_within_each_group_and_reports_per_group(tmp_path):
    run_dir = tmp_path / "run"
    train(3, grouped_asha_spec(tmp_path), run_dir)
    done = results(run_dir)
    check_rungs_per_group(run_dir, done["groups"])
    per_group = done["group_results"]
    assert [g["samples"] for g in per_group] == sorted((g["samples"] for g in per_group), reverse=True)
    for entry in per_group:
        assert sorted(entry["configurations"]) == ["a", "b", "c", "d"] and entry["done"] and entry["ended"] == 4
        mine = {m["id"]: m for m in done["models"] if done["groups"][m["id"]] == entry["key"]}
        best = max(mine.values(), key=lambda m: m["best_metric"])
        assert (entry["best"]["model"], entry["best"]["value"]) == (best["id"], best["best_metric"])
        assert entry["models"][0] == best["id"] and set(entry["models"]) == set(mine)
    check_group_ensembles(run_dir, done)
    status = subprocess.run([sys.executable, "-m", "fleet", "status", str(run_dir)], capture_output=True, text=True,
                            cwd=REPO, env=mpi_env(), timeout=120)
    assert ", 3/3 groups done" in status.stdout, status.stdout + status.stderr
    if browser() is None:
        return
    sort_by_size = ("document.querySelectorAll('#groups th')[1].click(); "
                    "Array.from(document.querySelectorAll('#groups tbody tr')).map(r => r.cells[1].textContent)")
    page = open_page(run_dir / "report.html", (sort_by_size,))
    assert page.errors == [] and page.headings[:4] == ["summary", "leaderboard (click a column to sort)", "groups",
                                                       "ensemble"]
    assert any(image["file"] == "report/groups.png" and image["ok"] for image in page.images)
    assert [row[2] for row in page.rows][::4] == [g["key"] for g in per_group]  # by group, the largest first
    assert page.values[0] == [str(g["samples"]) for g in reversed(per_group)]  # the click sorted it ascending
