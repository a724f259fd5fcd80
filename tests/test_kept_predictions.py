"""Each model's best-epoch predictions in the run directory: which epoch is best, what is
written, what is kept, and what a reader refuses."""

import json

import numpy as np
import pytest

from fleet.errors import UserError
from fleet.report.predictions import (
    Checkpoint,
    commit_best,
    improves,
    labels_path,
    read_kept,
    read_labels,
    write_labels,
)


def test_the_best_epoch_is_the_leaderboards_first_of_equals():
    assert improves(0.5, [], "val_accuracy") and improves(0.5, [0.4, None, float("nan")], "val_accuracy")
    assert not improves(0.5, [0.5], "val_accuracy") and not improves(0.4, [0.5], "val_accuracy")
    assert improves(0.9, [1.0, 1.2], "val_loss") and not improves(1.0, [1.0], "val_loss")
    assert not improves(float("nan"), [], "val_loss") and not improves(None, [], "val_loss")


def test_a_new_best_replaces_the_older_epochs_files(tmp_path):
    checkpoint = tmp_path / "ckpt.npz"
    checkpoint.write_bytes(b"state")
    first = np.full((3, 2), 0.5, dtype=np.float64)
    commit_best(tmp_path, "m", 1, {"val_accuracy": 0.5}, {"validation": first}, None)
    second = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    commit_best(tmp_path, "m", 3, {"val_accuracy": 0.7}, {"validation": second, "test": second[:2]},
                Checkpoint(checkpoint, "0" * 64, 5))
    kept = read_kept(tmp_path, "m")
    assert (kept.epoch, kept.metric, kept.value) == (3, "val_accuracy", 0.7)
    assert kept.probabilities("validation").dtype == np.float32
    np.testing.assert_allclose(kept.probabilities("test"), second[:2])
    names = sorted(p.name for p in (tmp_path / "predictions" / "m").iterdir())
    assert names == ["best.json", "e00003-test.npy", "e00003-validation.npy", "e00003.npz"]
    assert (tmp_path / "predictions" / "m" / "e00003.npz").read_bytes() == b"state"
    with pytest.raises(UserError, match="does not match its size and checksum"):
        kept.checkpoint_bytes()
    assert read_kept(tmp_path, "other") is None


def test_labels_are_written_once_and_read_back(tmp_path):
    write_labels(tmp_path, "validation", np.array([1, 0, 2]))
    write_labels(tmp_path, "validation", np.array([9, 9, 9]))
    assert read_labels(tmp_path, "validation").tolist() == [1, 0, 2]
    assert read_labels(tmp_path, "test") is None


def test_a_pickled_array_or_a_malformed_record_is_one_line(tmp_path):
    path = labels_path(tmp_path, "validation")
    path.parent.mkdir(parents=True)
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UserError, match="not a readable .npy array"):
        read_labels(tmp_path, "validation")
    (tmp_path / "predictions" / "m").mkdir()
    (tmp_path / "predictions" / "m" / "best.json").write_text(json.dumps({"model": "m"}))
    with pytest.raises(UserError, match="not a record of kept predictions"):
        read_kept(tmp_path, "m")
