"""Fleet's training is the engine's on its stream, exactly: a real run under mpiexec, replayed in
this process through an engine of its framework on the samples the stream's order gives (the same chunks,
augmentation generators, batches and epoch ends), reports the same training losses and
validation accuracies. With `tests/test_engine_parity.py` (the engine trains as a plain PyTorch
loop on the same batches) this leaves only the sample order and augmentation draws, and the
documented differences, between fleet and a user's own loop (`bench/parity.py`)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import run_mpi
from fleet.engines import EngineOptions
from fleet.engines.factory import create_engine
from fleet.inspect import input_shape, num_classes
from fleet.runtime.data.chunks import StreamOrder, share_bounds
from fleet.runtime.protocol import StreamSource
from fleet.spec import load_spec
from preprocess.readers import open_reader
from preprocess.split import split_indices
from preprocess.transforms import Pipeline

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CHUNK = 64
BATCH = 32


def write_run(tmp_path: Path) -> tuple[Path, Path]:
    """A spec where FLEET-G puts `solo` (a CNN with BatchNorm) on one trainer and `pair` (an
    MLP) on two, on one stream (rates from a profile.json, as in test_runtime_mpi.py), in one
    round (with alpha 0.1 the round lasts until both converged)."""
    doc = {
        "name": "replay", "seed": 4,
        "data": {"source": "digits", "val_fraction": 0.2},
        "preprocess": [{"random_crop": {"size": 8, "padding": 1}}, {"normalize": {"mean": [0.3], "std": [0.3]}}],
        "models": [{"family": "cnn", "name": "solo", "params": {"channels": [8], "hidden": 16}},
                   {"family": "mlp", "name": "pair", "params": {"hidden": [32]},
                    "train": {"optimizer": "adam", "lr": 0.005}}],
        "train": {"batch_size": BATCH, "max_epochs": 2, "lr": 0.05, "schedule": "cosine", "stop": {"patience": 100}},
        "scheduler": {"policy": "fleet-g", "profile": False, "alpha": 0.1},  # one round: no re-planning
        "cluster": {"nodes": 1, "gpus_per_node": 3, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 90, "chunk_samples": CHUNK, "qp_samples": 512, "qt_samples": 512},
    }
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rates = {"solo": 1000.0, "pair": 560.0}  # pair on 2 trainers: 560 * 2**0.85 = 1009, matched to solo
    profile = {"schema": 1, "gpus_per_node": 3, "samples_per_epoch": 1, "models": [
        {"id": m, "rates": {str(k): r * k**0.85 for k in (1, 2, 3)}, "epochs": 2} for m, r in rates.items()]}
    (run_dir / "profile.json").write_text(json.dumps(profile))
    return spec_path, run_dir


class Stream:
    """The samples of the run's one stream, as the preprocessors decode them (see StreamOrder)."""

    def __init__(self, spec, members: list[str]):
        self.spec = spec
        self.reader = open_reader(spec.data, seed=spec.seed)
        self.train_idx, val_idx = split_indices(self.reader.labels, spec.data.val_fraction, spec.seed)
        self.pipeline = Pipeline(spec.preprocess, spec.data)
        salt = zlib.crc32(",".join(sorted(members)).encode()) & 0x7FFFFFFF  # the coordinator's stream salt
        self.order = StreamOrder(self.train_idx, StreamSource(spec.seed, salt, 0, CHUNK))
        val = self.reader.read(np.sort(val_idx))
        self.val = (self.pipeline(val, np.random.default_rng(spec.seed), train=False), val.labels)

    def chunks(self, epoch: int):
        per_epoch = self.order.chunks_per_epoch
        for k in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            raw = self.reader.read(self.order.indices(k))
            yield self.pipeline(raw, self.order.rng(k), train=True), raw.labels


def trainer_batches(shares: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """One trainer's batches of an epoch: its shares joined and cut at the batch size; the last
    one short, dropped when it holds one sample (the Batcher's rule)."""
    x, y = np.concatenate([s[0] for s in shares]), np.concatenate([s[1] for s in shares])
    cuts = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(y), BATCH)]
    return [c for c in cuts if len(c[1]) > 1]


def group_steps(chunks, size: int):
    """A group's steps of an epoch: each trainer's share of every chunk, batched on its own;
    step i trains on the union of the trainers' i-th batches."""
    shares = [[] for _ in range(size)]
    for x, y in chunks:
        for trainer, (lo, hi) in enumerate(share_bounds(len(y), size)):
            shares[trainer].append((x[lo:hi], y[lo:hi]))
    batches = [trainer_batches(s) for s in shares]
    for i in range(max(len(b) for b in batches)):
        parts = [b[i] for b in batches if i < len(b)]
        yield np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def replay(stream: Stream, model_id: str, group_size: int) -> list[tuple[float, float]]:
    """(train loss, validation accuracy) per epoch of `model_id` retrained in this process by one
    engine of its framework on its stream's samples, a step per union of the group's batches."""
    model = stream.spec.model(model_id)
    engine = create_engine(EngineOptions(model, input_shape(stream.spec), num_classes(stream.spec), threads=1))
    out = []
    for epoch in range(model.train.max_epochs):
        loss_sum = seen = 0.0
        for x, y in group_steps(stream.chunks(epoch), group_size):
            loss_sum += engine.train_step(x, y) * len(y)
            seen += len(y)
        out.append((loss_sum / seen, engine.evaluate(*stream.val)["accuracy"]))
        engine.end_epoch()
    return out


def test_a_run_replays_exactly_through_the_engine_on_its_stream(tmp_path):
    spec_path, run_dir = write_run(tmp_path)
    done = run_mpi(4, "train", str(spec_path), "--run-dir", str(run_dir), "--quiet", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert len(plan["rounds"]) == 1
    gpus = {m["model"]: len(m["gpus"]) for m in plan["rounds"][0]["members"]}
    assert gpus == {"solo": 1, "pair": 2}
    results = {m["id"]: m for m in json.loads((run_dir / "results.json").read_text())["models"]}
    stream = Stream(load_spec(spec_path), list(gpus))
    for model_id, size in gpus.items():
        fleet = [(h["train_loss"], h["val_accuracy"]) for h in results[model_id]["history"]]
        replayed = replay(stream, model_id, size)
        # one trainer: the same arithmetic, bit for bit; two: the group's weighted gradient sum
        # is the union batch's gradient up to float rounding (an MLP: no per-trainer BatchNorm)
        tolerance = 0.0 if size == 1 else 1e-5
        assert [loss for loss, _ in fleet] == pytest.approx([loss for loss, _ in replayed], rel=tolerance, abs=0)
        assert [acc for _, acc in fleet] == pytest.approx([acc for _, acc in replayed], abs=0.005 if size > 1 else 0)
