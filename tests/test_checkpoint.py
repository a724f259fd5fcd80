"""Checkpoints: atomic commit, checksums, fallback, pruning, concurrent writers, exact resume."""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import pytest

import fleet.runtime.train.checkpoint as checkpoint_module
from fleet.engines.torch import TorchEngine
from fleet.errors import UserError
from fleet.runtime.train.checkpoint import CheckpointStore, ModelCheckpoint
from fleet.runtime.train.stop import StopTracker
from fleet.spec import ModelSpec, StopRule, TrainSpec

SHAPE, CLASSES = (1, 8, 8), 4


def spec(model_id: str = "mlp-000") -> ModelSpec:
    train = TrainSpec(optimizer="adam", lr=0.01)
    return ModelSpec(id=model_id, family="mlp", params={"hidden": [16]}, train=train, seed=3)


def batches(count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, *SHAPE)).astype(np.float32), rng.integers(0, CLASSES, 8)) for _ in range(count)]


def make_ckpt(
    model_id: str = "mlp-000", epochs: int = 1, epoch_samples: int = 0, state: dict | None = None
) -> ModelCheckpoint:
    tracker = StopTracker(StopRule(patience=2), max_epochs=10, epochs=epochs)
    return ModelCheckpoint(
        model_id=model_id,
        engine_state=state if state is not None else {"weights": np.arange(epochs + 3)},
        stop=tracker.to_dict(),
        history=[{"epoch": e + 1, "train_loss": 1.0 / (e + 1)} for e in range(epochs)],
        epochs=epochs,
        epoch_samples=epoch_samples,
        gpu_seconds=2.5 * epochs,
        meta={"round": 0, "gpus": 2},
    )


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store whose run directory is the cwd, so messages read ``checkpoints/...``."""
    monkeypatch.chdir(tmp_path)
    warnings: list[str] = []
    created = CheckpointStore(".", on_warning=warnings.append)
    created.warnings = warnings
    return created


def ckpt_files(store: CheckpointStore, model_id: str = "mlp-000") -> list[str]:
    return sorted(p.name for p in store.model_dir(model_id).iterdir())


def corrupt(path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_round_trip_of_a_torch_engine_resumes_training_exactly(store):
    before, after = batches(3, seed=1), batches(3, seed=2)
    original = TorchEngine(spec(), SHAPE, CLASSES)
    for x, y in before:
        original.train_step(x, y)
    original.end_epoch()
    saved = make_ckpt(epochs=1, epoch_samples=24, state=original.state())
    path = store.save(saved)
    expected = [original.train_step(x, y) for x, y in after]

    loaded = store.load("mlp-000")
    assert path.name == "ckpt-00001-000000024.pt"
    assert (loaded.epochs, loaded.epoch_samples, loaded.history, loaded.meta) == (1, 24, saved.history, saved.meta)
    rule = StopRule(patience=2)
    assert StopTracker.from_dict(rule, loaded.stop) == StopTracker.from_dict(rule, saved.stop)
    resumed = TorchEngine(spec(), SHAPE, CLASSES)
    resumed.load_state(loaded.engine_state)
    assert [resumed.train_step(x, y) for x, y in after] == expected
    assert store.save_seconds > 0 and store.last_save["mlp-000"].path == path
    assert store.warnings == []


def test_latest_json_is_the_commit_record(store):
    store.save(make_ckpt(epochs=1))
    store.save(make_ckpt(epochs=2, epoch_samples=64))
    info = store.latest_info("mlp-000")
    assert info == json.loads((store.root / "mlp-000" / "latest.json").read_text())
    assert info["file"] == "ckpt-00002-000000064.pt" and info["epochs"] == 2 and info["epoch_samples"] == 64
    assert info["bytes"] == (store.root / "mlp-000" / info["file"]).stat().st_size
    assert info["sha256"] == store.last_save["mlp-000"].sha256 and info["converged"] is False
    assert [e["file"] for e in info["previous"]] == ["ckpt-00001-000000000.pt"]
    assert ckpt_files(store) == ["ckpt-00001-000000000.pt", "ckpt-00002-000000064.pt", "latest.json"]


def test_a_crash_before_the_commit_keeps_the_previous_checkpoint(store, monkeypatch):
    store.save(make_ckpt(epochs=1))

    def crash(path, value):
        raise KeyboardInterrupt  # the process dies between the file write and the commit

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(checkpoint_module, "atomic_write_json", crash)
        store.save(make_ckpt(epochs=2))
    assert "ckpt-00002-000000000.pt" in ckpt_files(store)
    assert store.load("mlp-000").epochs == 1  # the uncommitted file does not exist for load
    store.save(make_ckpt(epochs=3))
    assert ckpt_files(store) == ["ckpt-00001-000000000.pt", "ckpt-00003-000000000.pt", "latest.json"]


def test_checksum_mismatch_falls_back_to_the_previous_file_with_a_warning(store):
    store.save(make_ckpt(epochs=3))
    newest = store.save(make_ckpt(epochs=4))
    corrupt(newest)
    loaded = store.load("mlp-000")
    assert loaded.epochs == 3
    assert store.warnings == [
        "checkpoints/mlp-000/ckpt-00004-000000000.pt: checksum mismatch (file corrupt?); "
        "resuming 'mlp-000' from the older ckpt-00003-000000000.pt"
    ]


def test_a_missing_newest_file_falls_back_too(store):
    store.save(make_ckpt(epochs=3))
    store.save(make_ckpt(epochs=4)).unlink()
    assert store.load("mlp-000").epochs == 3
    assert "ckpt-00004-000000000.pt: missing" in store.warnings[0]


def test_no_usable_file_is_a_one_line_error_naming_the_newest(store):
    old = store.save(make_ckpt(epochs=3))
    newest = store.save(make_ckpt(epochs=4))
    corrupt(newest)
    old.write_bytes(old.read_bytes()[:50])
    with pytest.raises(UserError) as caught:
        store.load("mlp-000")
    expected_bytes = store.latest_info("mlp-000")["previous"][0]["bytes"]
    assert str(caught.value) == (
        "checkpoints/mlp-000/ckpt-00004-000000000.pt: checksum mismatch (file corrupt?); older checkpoints "
        f"unusable too: ckpt-00003-000000000.pt: 50 bytes, expected {expected_bytes} (file truncated?)"
    )
    assert "\n" not in str(caught.value)


def test_a_corrupt_latest_json_is_a_user_error_naming_it(store):
    store.save(make_ckpt(epochs=1))
    (store.root / "mlp-000" / "latest.json").write_text('{"schema": 1, "file"')
    with pytest.raises(UserError, match=r"^checkpoints/mlp-000/latest.json: invalid JSON \(file corrupt\?\)$"):
        store.load("mlp-000")
    store.save(make_ckpt(epochs=2))  # a new save starts a fresh history, with a warning
    assert store.load("mlp-000").epochs == 2 and "starting a new checkpoint history" in store.warnings[0]
    assert ckpt_files(store) == ["ckpt-00002-000000000.pt", "latest.json"]


def test_keeps_the_newest_two_files(store, tmp_path):
    for epoch in range(1, 6):
        store.save(make_ckpt(epochs=epoch, epoch_samples=epoch * 10))
    assert ckpt_files(store) == ["ckpt-00004-000000040.pt", "ckpt-00005-000000050.pt", "latest.json"]
    assert len(store.latest_info("mlp-000")["previous"]) == 1
    one = CheckpointStore(tmp_path / "other", keep=1)
    for epoch in range(1, 3):
        one.save(make_ckpt(epochs=epoch))
    assert ckpt_files(one) == ["ckpt-00002-000000000.pt", "latest.json"]


def test_saving_the_same_position_twice_never_overwrites_a_committed_file(store):
    first = store.save(make_ckpt(epochs=2))
    second = store.save(make_ckpt(epochs=2, state={"weights": "again"}))
    assert (first.name, second.name) == ("ckpt-00002-000000000.pt", "ckpt-00002-000000000-r1.pt")
    assert store.load("mlp-000").engine_state == {"weights": "again"}
    third = store.save(make_ckpt(epochs=2, state={"weights": "third"}))
    assert third.name == "ckpt-00002-000000000-r2.pt"  # both older names were committed when it was written
    assert ckpt_files(store) == ["ckpt-00002-000000000-r1.pt", "ckpt-00002-000000000-r2.pt", "latest.json"]
    corrupt(third)
    assert store.load("mlp-000").engine_state == {"weights": "again"}
    assert store.save(make_ckpt(epochs=2)).name == "ckpt-00002-000000000.pt"  # free again after pruning


def test_models_without_checkpoints(store):
    assert store.load("mlp-000") is None and store.latest_info("mlp-000") is None
    store.save(make_ckpt("a-1", epochs=1))
    store.save(make_ckpt("b-2", epochs=2))
    loaded = store.load_all(["a-1", "b-2", "c-3"])
    assert {k: v.epochs for k, v in loaded.items()} == {"a-1": 1, "b-2": 2}


def test_two_models_saved_concurrently_from_two_threads(tmp_path):
    store = CheckpointStore(tmp_path)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(model_id: str) -> None:
        try:
            barrier.wait()
            for epoch in range(1, 7):
                store.save(make_ckpt(model_id, epochs=epoch, state={"weights": np.full(50_000, epoch)}))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(m,)) for m in ("left-0", "right-1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for model_id in ("left-0", "right-1"):
        ckpt = store.load(model_id)
        assert ckpt.model_id == model_id and ckpt.epochs == 6
        assert np.array_equal(ckpt.engine_state["weights"], np.full(50_000, 6))
        assert ckpt_files(store, model_id) == ["ckpt-00005-000000000.pt", "ckpt-00006-000000000.pt", "latest.json"]
    assert set(store.last_save) == {"left-0", "right-1"}


def test_a_file_of_another_model_is_not_loaded(store):
    store.save(make_ckpt("a-1", epochs=1))
    store.save(make_ckpt("b-2", epochs=1))
    a_dir, b_dir = store.model_dir("a-1"), store.model_dir("b-2")
    info = json.loads((b_dir / "latest.json").read_text())
    (a_dir / "ckpt-00001-000000000.pt").replace(b_dir / "ckpt-00001-000000000.pt")
    info.update(bytes=(b_dir / info["file"]).stat().st_size)
    info.update(sha256=hashlib.sha256((b_dir / info["file"]).read_bytes()).hexdigest())
    (b_dir / "latest.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match="holds model 'a-1', expected 'b-2'"):
        store.load("b-2")
