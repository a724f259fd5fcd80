"""A real `fleet run` (three small torch models on synthetic data, under mpiexec) keeps each
model's best-epoch predictions, ends with its greedy ensemble, and `fleet ensemble` and
`fleet predict` work on its run directory."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import run_fleet
from fleet.report.predictions import read_kept, read_labels
from preprocess.make import make_synthetic
from preprocess.split import split_three

pytestmark = [pytest.mark.mpi]

SAMPLES, CLASSES, SIDE, SEED = 600, 4, 8, 1


def write_spec(path: Path) -> Path:
    doc = {
        "name": "ens", "seed": SEED,
        "data": {"source": "synthetic", "samples": SAMPLES, "image_size": SIDE, "channels": 1, "classes": CLASSES,
                 "val_fraction": 0.2, "test_fraction": 0.2},
        "models": [{"family": "mlp", "name": "a", "params": {"hidden": [16]}},
                   {"family": "mlp", "name": "b", "params": {"hidden": [32]}},
                   {"family": "cnn", "name": "c", "params": {"channels": [4], "hidden": 16}}],
        "train": {"batch_size": 32, "max_epochs": 3, "optimizer": "adam", "lr": 0.01},
        "scheduler": {"policy": "fleet-g", "profile": False},
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1},
        "runtime": {"timeout_s": 90, "chunk_samples": 64, "qp_samples": 512, "qt_samples": 512},
        "ensemble": {"size": 4},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ens")
    run_dir = root / "run"
    done = run_fleet("run", str(write_spec(root / "s.yaml")), "--run-dir", str(run_dir), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "fleet: ensemble: " in done.stdout and " on test: accuracy " in done.stdout, done.stdout[-2000:]
    return run_dir


def test_each_model_keeps_its_best_epochs_predictions_on_validation_and_test(finished):
    results = {m["id"]: m for m in json.loads((finished / "results.json").read_text())["models"]}
    val_labels, test_labels = read_labels(finished, "validation"), read_labels(finished, "test")
    assert len(val_labels) == len(test_labels) == SAMPLES // 5
    for model_id, result in results.items():
        kept = read_kept(finished, model_id)
        assert (kept.epoch, kept.value) == (result["best_epoch"], result["best_metric"])
        val, test = kept.probabilities("validation"), kept.probabilities("test")
        assert val.dtype == test.dtype == np.float32 and val.shape == test.shape == (SAMPLES // 5, CLASSES)
        np.testing.assert_allclose(val.sum(axis=1), 1.0, atol=1e-5)
        assert np.mean(val.argmax(axis=1) == val_labels) == pytest.approx(result["best_val_accuracy"])
        files = sorted(p.name for p in kept.directory.iterdir())
        epoch = f"e{kept.epoch:05d}"
        assert files == ["best.json", f"{epoch}-test.npy", f"{epoch}-validation.npy", f"{epoch}.npz"]


def test_the_run_ends_with_its_ensemble_and_the_report_shows_it(finished):
    doc = json.loads((finished / "ensemble.json").read_text())
    assert doc["size"] == 4 and doc["evaluated_on"] == "test" and doc["ensemble"]["samples"] == SAMPLES // 5
    assert sum(m["weight"] for m in doc["members"]) == pytest.approx(1.0)
    assert "<h2>ensemble</h2>" in (finished / "report.html").read_text()
    again = run_fleet("ensemble", str(finished), "--size", "3", "--from", "2")
    assert again.returncode == 0, again.stderr
    assert json.loads((finished / "ensemble.json").read_text())["from"] == 2


def test_predict_applies_the_best_checkpoint_as_it_was_validated(finished, tmp_path):
    """The same synthetic samples in an HDF5 file: the best checkpoint, loaded and applied
    through the run's pipeline, gives the probabilities kept for the validation and test splits."""
    data = make_synthetic(tmp_path / "same.h5", "hdf5", classes=CLASSES, samples=SAMPLES, image_size=SIDE,
                          channels=1, seed=SEED, progress=False)
    out = tmp_path / "c.npz"
    done = run_fleet("predict", str(finished), "--data", str(data), "--model", "c", "--out", str(out))
    assert done.returncode == 0, done.stderr
    got = np.load(out, allow_pickle=False)
    _, val_idx, test_idx = split_three(got["labels"], 0.2, 0.2, SEED)
    kept = read_kept(finished, "c")
    np.testing.assert_allclose(got["probabilities"][val_idx], kept.probabilities("validation"), atol=1e-6)
    np.testing.assert_allclose(got["probabilities"][test_idx], kept.probabilities("test"), atol=1e-6)
    csv_out = tmp_path / "ensemble.csv"
    done = run_fleet("predict", str(finished), "--data", str(data), "--out", str(csv_out))
    assert done.returncode == 0 and "fleet: predict: 600 samples" in done.stdout, done.stderr
    assert csv_out.read_text().splitlines()[0].endswith("p3,entropy,mutual_information,disagreement")
    bad = run_fleet("predict", str(finished), "--data", str(data), "--model", "zz")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'zz' is no model" in bad.stderr
