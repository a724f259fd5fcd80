"""Checkpoints: atomic commit, checksums, fallback, pruning, concurrent writers, exact resume."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import fleet.runtime.train.checkpoint as checkpoint_module
from fleet import safetree
from fleet.engines import EngineOptions
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
    model_id: str = "mlp-000", epochs: int = 1, epoch_samples: int = 0, state: bytes | None = None
) -> ModelCheckpoint:
    tracker = StopTracker(StopRule(patience=2), max_epochs=10, epochs=epochs)
    return ModelCheckpoint(
        model_id=model_id,
        engine_state=state if state is not None else f"weights of epoch {epochs}".encode(),
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


def engine_after_one_epoch() -> TorchEngine:
    engine = TorchEngine(EngineOptions(spec(), SHAPE, CLASSES))
    for x, y in batches(3, seed=1):
        engine.train_step(x, y)
    engine.end_epoch()
    return engine


def test_round_trip_of_a_torch_engine_resumes_training_exactly(store):
    original, after = engine_after_one_epoch(), batches(3, seed=2)
    saved = make_ckpt(epochs=1, epoch_samples=24, state=original.state_bytes())
    path = store.save(saved)
    expected = [original.train_step(x, y) for x, y in after]

    loaded = store.load("mlp-000")
    assert path.name == "ckpt-00001-000000024.npz"
    assert (loaded.epochs, loaded.epoch_samples, loaded.history, loaded.meta) == (1, 24, saved.history, saved.meta)
    rule = StopRule(patience=2)
    assert StopTracker.from_dict(rule, loaded.stop) == StopTracker.from_dict(rule, saved.stop)
    resumed = TorchEngine(EngineOptions(spec(), SHAPE, CLASSES))
    resumed.load_state_bytes(loaded.engine_state)
    assert [resumed.train_step(x, y) for x, y in after] == expected
    assert store.save_seconds > 0 and store.last_save["mlp-000"].path == path
    assert store.warnings == []


def test_latest_json_is_the_commit_record(store):
    store.save(make_ckpt(epochs=1))
    store.save(make_ckpt(epochs=2, epoch_samples=64))
    info = store.latest_info("mlp-000")
    assert info == json.loads((store.root / "mlp-000" / "latest.json").read_text())
    assert info["file"] == "ckpt-00002-000000064.npz" and info["epochs"] == 2 and info["epoch_samples"] == 64
    assert info["bytes"] == (store.root / "mlp-000" / info["file"]).stat().st_size
    assert info["sha256"] == store.last_save["mlp-000"].sha256 and info["converged"] is False
    assert [e["file"] for e in info["previous"]] == ["ckpt-00001-000000000.npz"]
    assert ckpt_files(store) == ["ckpt-00001-000000000.npz", "ckpt-00002-000000064.npz", "latest.json"]


def test_a_crash_before_the_commit_keeps_the_previous_checkpoint(store, monkeypatch):
    store.save(make_ckpt(epochs=1))

    def crash(path, value):
        raise KeyboardInterrupt  # the process dies between the file write and the commit

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(checkpoint_module, "atomic_write_json", crash)
        store.save(make_ckpt(epochs=2))
    assert "ckpt-00002-000000000.npz" in ckpt_files(store)
    assert store.load("mlp-000").epochs == 1  # the uncommitted file does not exist for load
    store.save(make_ckpt(epochs=3))
    assert ckpt_files(store) == ["ckpt-00001-000000000.npz", "ckpt-00003-000000000.npz", "latest.json"]


def test_checksum_mismatch_falls_back_to_the_previous_file_with_a_warning(store):
    store.save(make_ckpt(epochs=3))
    newest = store.save(make_ckpt(epochs=4))
    corrupt(newest)
    loaded = store.load("mlp-000")
    assert loaded.epochs == 3
    assert store.warnings == [
        "checkpoints/mlp-000/ckpt-00004-000000000.npz: checksum mismatch (file corrupt?); "
        "resuming 'mlp-000' from the older ckpt-00003-000000000.npz"
    ]


def test_a_missing_newest_file_falls_back_too(store):
    store.save(make_ckpt(epochs=3))
    store.save(make_ckpt(epochs=4)).unlink()
    assert store.load("mlp-000").epochs == 3
    assert "ckpt-00004-000000000.npz: missing" in store.warnings[0]


def test_no_usable_file_is_a_one_line_error_naming_the_newest(store):
    old = store.save(make_ckpt(epochs=3))
    newest = store.save(make_ckpt(epochs=4))
    corrupt(newest)
    old.write_bytes(old.read_bytes()[:50])
    with pytest.raises(UserError) as caught:
        store.load("mlp-000")
    expected_bytes = store.latest_info("mlp-000")["previous"][0]["bytes"]
    assert str(caught.value) == (
        "checkpoints/mlp-000/ckpt-00004-000000000.npz: checksum mismatch (file corrupt?); older checkpoints "
        f"unusable too: ckpt-00003-000000000.npz: 50 bytes, expected {expected_bytes} (file truncated?)"
    )
    assert "\n" not in str(caught.value)


def test_a_corrupt_latest_json_is_a_user_error_naming_it(store):
    store.save(make_ckpt(epochs=1))
    (store.root / "mlp-000" / "latest.json").write_text('{"schema": 1, "file"')
    with pytest.raises(UserError, match=r"^checkpoints/mlp-000/latest.json: invalid JSON \(file corrupt\?\)$"):
        store.load("mlp-000")
    store.save(make_ckpt(epochs=2))  # a new save starts a fresh history, with a warning
    assert store.load("mlp-000").epochs == 2 and "starting a new checkpoint history" in store.warnings[0]
    assert ckpt_files(store) == ["ckpt-00002-000000000.npz", "latest.json"]


def test_keeps_the_newest_two_files(store, tmp_path):
    for epoch in range(1, 6):
        store.save(make_ckpt(epochs=epoch, epoch_samples=epoch * 10))
    assert ckpt_files(store) == ["ckpt-00004-000000040.npz", "ckpt-00005-000000050.npz", "latest.json"]
    assert len(store.latest_info("mlp-000")["previous"]) == 1
    one = CheckpointStore(tmp_path / "other", keep=1)
    for epoch in range(1, 3):
        one.save(make_ckpt(epochs=epoch))
    assert ckpt_files(one) == ["ckpt-00002-000000000.npz", "latest.json"]


def test_saving_the_same_position_twice_never_overwrites_a_committed_file(store):
    first = store.save(make_ckpt(epochs=2))
    second = store.save(make_ckpt(epochs=2, state=b"again"))
    assert (first.name, second.name) == ("ckpt-00002-000000000.npz", "ckpt-00002-000000000-r1.npz")
    assert store.load("mlp-000").engine_state == b"again"
    third = store.save(make_ckpt(epochs=2, state=b"third"))
    assert third.name == "ckpt-00002-000000000-r2.npz"  # both older names were committed when it was written
    assert ckpt_files(store) == ["ckpt-00002-000000000-r1.npz", "ckpt-00002-000000000-r2.npz", "latest.json"]
    corrupt(third)
    assert store.load("mlp-000").engine_state == b"again"
    assert store.save(make_ckpt(epochs=2)).name == "ckpt-00002-000000000.npz"  # free again after pruning


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
                store.save(make_ckpt(model_id, epochs=epoch, state=np.full(50_000, epoch).tobytes()))
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
        assert ckpt.engine_state == np.full(50_000, 6).tobytes()
        assert ckpt_files(store, model_id) == ["ckpt-00005-000000000.npz", "ckpt-00006-000000000.npz", "latest.json"]
    assert set(store.last_save) == {"left-0", "right-1"}


def test_a_file_of_another_model_is_not_loaded(store):
    store.save(make_ckpt("a-1", epochs=1))
    store.save(make_ckpt("b-2", epochs=1))
    a_dir, b_dir = store.model_dir("a-1"), store.model_dir("b-2")
    info = json.loads((b_dir / "latest.json").read_text())
    (a_dir / "ckpt-00001-000000000.npz").replace(b_dir / "ckpt-00001-000000000.npz")
    info.update(bytes=(b_dir / info["file"]).stat().st_size)
    info.update(sha256=hashlib.sha256((b_dir / info["file"]).read_bytes()).hexdigest())
    (b_dir / "latest.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match="holds model 'a-1', expected 'b-2'"):
        store.load("b-2")


# -- files that the store must read safely: old ones, and planted ones ---------------------


def commit_file(store: CheckpointStore, model_id: str, name: str, data: bytes, epochs: int, previous=()) -> Path:
    """Write a file and a latest.json naming it with a matching checksum, as anyone who can
    write the run directory could (a planted file), or as fleet up to 99f14b6 did (an old one)."""
    directory = store.model_dir(model_id)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)
    entry = {"file": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "epochs": epochs,
             "epoch_samples": 0, "converged": False, "time": 1.0}
    latest = {"schema": 1, "model_id": model_id, **entry, "previous": list(previous)}
    (directory / "latest.json").write_text(json.dumps(latest))
    return directory / name


def old_checkpoint_bytes(engine_state: dict, epochs: int = 1) -> bytes:
    """A checkpoint as fleet wrote it up to commit 99f14b6: torch.save of the whole dict,
    the engine state as tensors (`ModelCheckpoint.to_dict()` of format fleet.checkpoint/1)."""
    tracker = StopTracker(StopRule(patience=2), max_epochs=10, epochs=epochs)
    old = {"format": "fleet.checkpoint/1", "model_id": "mlp-000", "engine_state": engine_state,
           "stop": tracker.to_dict(), "history": [{"epoch": 1, "train_loss": 0.5}], "epochs": epochs,
           "epoch_samples": 0, "gpu_seconds": 1.5, "converged": False, "stop_reason": None,
           "meta": {"round": 0, "stream": 0, "gpus": 2, "epoch_loss_sum": 0.0, "epoch_compute_s": 0.0}}
    buffer = io.BytesIO()
    torch.save(old, buffer)
    return buffer.getvalue()


def test_an_old_torch_checkpoint_still_resumes_exactly(store):
    original, after = engine_after_one_epoch(), batches(3, seed=2)
    commit_file(store, "mlp-000", "ckpt-00001-000000000.pt", old_checkpoint_bytes(original.state()), epochs=1)
    expected = [original.train_step(x, y) for x, y in after]

    loaded = store.load("mlp-000")
    assert (loaded.epochs, loaded.gpu_seconds, loaded.meta["gpus"]) == (1, 1.5, 2)
    resumed = TorchEngine(EngineOptions(spec(), SHAPE, CLASSES))
    resumed.load_state_bytes(loaded.engine_state)
    assert [resumed.train_step(x, y) for x, y in after] == expected
    store.save(make_ckpt(epochs=2, state=resumed.state_bytes()))  # the old file stays as the fallback
    assert ckpt_files(store) == ["ckpt-00001-000000000.pt", "ckpt-00002-000000000.npz", "latest.json"]
    assert store.warnings == []


def test_an_old_emulated_checkpoint_resumes_without_a_framework_in_its_state(store):
    """The emulated engine's old states held a torch tensor; they come back as numpy arrays."""
    from fleet.engines.emulated import EmulatedEngine
    from fleet.schedule.rates import RateTable

    rates = RateTable.from_dict({"schema": 1, "gpus_per_node": 1, "samples_per_epoch": 64,
                                 "models": [{"id": "mlp-000", "rates": {"1": 1e9}}]})
    engine = EmulatedEngine(EngineOptions(spec(), SHAPE, CLASSES), rates, sleep=lambda s: None)
    engine.train_step(*batches(1, seed=3)[0])
    old_state = {**engine.state(), "params": torch.from_numpy(engine.state()["params"])}
    commit_file(store, "mlp-000", "ckpt-00001-000000000.pt", old_checkpoint_bytes(old_state), epochs=1)
    resumed = EmulatedEngine(EngineOptions(spec(), SHAPE, CLASSES), rates, sleep=lambda s: None)
    resumed.load_state_bytes(store.load("mlp-000").engine_state)
    assert np.array_equal(resumed.flat_parameters(), engine.flat_parameters()) and resumed.steps == 1


class WritesAFile:
    """Unpickling this calls ``Path(path).write_text("pwned")``: code run from a checkpoint."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "pwned"))


def planted_torch_file(marker: Path) -> bytes:
    return old_checkpoint_bytes({"format": "fleet.torch_engine/1", "model": WritesAFile(marker)})


def planted_pickle(marker: Path) -> bytes:
    return pickle.dumps(make_ckpt(epochs=3).to_dict() | {"engine_state": WritesAFile(marker)})


def planted_object_array(marker: Path) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, tree=np.frombuffer(b'{"$array": 0}', np.uint8), a0=np.array([WritesAFile(marker)], dtype=object))
    return buffer.getvalue()


PLANTS = [("ckpt-00003-000000000.pt", planted_torch_file), ("ckpt-00003-000000000.npz", planted_pickle),
          ("ckpt-00003-000000000.npz", planted_object_array)]


@pytest.mark.parametrize(("name", "plant"), PLANTS, ids=["torch-file", "pickle", "npz-object-array"])
def test_a_planted_checkpoint_that_would_run_code_is_refused_and_runs_nothing(store, tmp_path, name, plant):
    probe, marker = tmp_path / "probe", tmp_path / "pwned"
    pickle.loads(pickle.dumps(WritesAFile(probe)))  # the payload is live: unpickled, it writes
    assert probe.read_text() == "pwned"
    commit_file(store, "mlp-000", name, plant(marker), epochs=3)
    with pytest.raises(UserError) as caught:
        store.load("mlp-000")
    message = str(caught.value)
    assert message.startswith(f"checkpoints/mlp-000/{name}: not a readable checkpoint: ") and "\n" not in message
    assert "refused" in message or "pickled data" in message
    assert not marker.exists()


@pytest.mark.parametrize(("name", "plant"), PLANTS, ids=["torch-file", "pickle", "npz-object-array"])
def test_a_planted_newest_checkpoint_falls_back_to_the_older_one_with_a_warning(store, tmp_path, name, plant):
    marker = tmp_path / "pwned"
    store.save(make_ckpt(epochs=2))
    good = store.latest_info("mlp-000")
    commit_file(store, "mlp-000", name, plant(marker), epochs=3, previous=[{k: good[k] for k in good if
                                                                          k not in ("schema", "model_id", "previous")}])
    assert store.load("mlp-000").epochs == 2
    assert store.warnings[0].startswith(f"checkpoints/mlp-000/{name}: not a readable checkpoint: ")
    assert not marker.exists()


def test_a_checkpoint_with_a_field_of_the_wrong_type_is_unreadable(store):
    data = safetree.dumps(make_ckpt(epochs=3).to_dict() | {"engine_state": {"weights": np.zeros(3)}})
    commit_file(store, "mlp-000", "ckpt-00003-000000000.npz", data, epochs=3)
    with pytest.raises(UserError, match=r"not a readable checkpoint: checkpoint field 'engine_state': expected "
                                         r"bytes, got dict$"):
        store.load("mlp-000")


def test_saving_anything_but_engine_bytes_is_a_programming_error(store):
    with pytest.raises(TypeError, match="engine_state must be Engine.state_bytes"):
        store.save(make_ckpt(state={"weights": 1}))  # type: ignore[arg-type]


# -- the file format --------------------------------------------------------------------------


def test_safetree_round_trips_what_states_hold():
    tree = {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "optimizer": {"state": {0: {"step": 3}},
            "param_groups": [{"betas": (0.9, 0.999), "params": [0, 1], "foreach": None}]}, "rng": b"\x00\xff",
            "nan": float("nan"), "$odd": 1, "scalar": np.float64(0.25)}
    back = safetree.loads(safetree.dumps(tree))
    assert np.array_equal(back["model"]["w"], tree["model"]["w"]) and back["model"]["w"].dtype == np.float32
    assert back["optimizer"] == tree["optimizer"] and isinstance(back["optimizer"]["param_groups"][0]["betas"], tuple)
    assert back["rng"] == b"\x00\xff" and np.isnan(back["nan"]) and back["$odd"] == 1 and back["scalar"] == 0.25
    with pytest.raises(TypeError, match="cannot store a .*WritesAFile"):
        safetree.dumps({"x": WritesAFile(Path("unused"))})


@pytest.mark.parametrize("data", [b"", b"junk", pickle.dumps({"a": 1}), safetree.dumps({"a": 1})[:40]],
                         ids=["empty", "junk", "pickle", "truncated"])
def test_safetree_refuses_what_it_did_not_write(data):
    with pytest.raises(safetree.TreeError):
        safetree.loads(data)
