"""Single-process reference trainer: the models one after another, on one device.

It decodes each model's data itself (no sharing), so it is the slow, simple reference that
the MPI runtime's results are checked against, and what `fleet run --local` runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from fleet.engines.factory import create_engine
from fleet.engines.options import EngineOptions
from fleet.inspect import input_shape
from fleet.report.results import ModelResult, RunResult
from fleet.runtime.train.stop import StopTracker
from fleet.spec import ModelSpec, Spec
from preprocess.readers import class_notices, open_reader, partition_manifest
from preprocess.split import epoch_order, split_blocks, split_three
from preprocess.transforms import Pipeline


@dataclass(frozen=True)
class EpochRecord:
    model: str
    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float
    samples_per_s: float
    lr: float


class LocalData:
    """The data set, split and preprocessed in this process."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.reader = open_reader(spec.data, seed=spec.seed)
        self.notices = class_notices(self.reader)  # "note: ..."/"warning: ..." lines for the user
        self.pipeline = Pipeline(spec.preprocess, spec.data)
        labels = self.reader.labels  # partitioned data: its parts one after another, each split as its node does
        if spec.data.partitioned:
            blocks = partition_manifest(spec.data).sizes
            self.train_idx, self.val_idx = split_blocks(labels, blocks, spec.data.val_fraction, spec.seed)
        else:  # the test set (data.test_fraction) is held out, never trained on
            data = spec.data
            self.train_idx, self.val_idx, _ = split_three(labels, data.val_fraction, data.test_fraction, spec.seed)
        self.samples_decoded = 0
        self.val_x, self.val_y = self.decode(self.val_idx, np.random.default_rng(spec.seed), train=False)

    @property
    def num_classes(self) -> int:
        return self.reader.num_classes

    def decode(self, indices: np.ndarray, rng: np.random.Generator, train: bool) -> tuple[np.ndarray, np.ndarray]:
        raw = self.reader.read(np.sort(indices) if not train else indices)
        self.samples_decoded += len(indices)
        return self.pipeline(raw, rng, train=train), raw.labels

    def epoch_batches(self, epoch: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = epoch_order(self.train_idx, self.spec.seed, epoch)
        rng = np.random.default_rng([self.spec.seed, epoch])
        for start in range(0, len(order), batch_size):
            yield self.decode(order[start : start + batch_size], rng, train=True)


def train_model(
    model: ModelSpec, data: LocalData, device: str, on_epoch: Callable[[EpochRecord], None]
) -> ModelResult:
    """Train one model until its stop rule fires; report every epoch through `on_epoch`."""
    engine = create_engine(EngineOptions(model, input_shape(data.spec), data.num_classes, device=device))
    tracker = StopTracker(model.train.stop, model.train.max_epochs)
    busy_s, final_loss, best_accuracy, history = 0.0, None, 0.0, []
    while not tracker.converged:
        start, losses, seen = time.perf_counter(), [], 0
        for x, y in data.epoch_batches(tracker.epochs, model.train.batch_size):
            losses.append(engine.train_step(x, y) * len(y))
            seen += len(y)
        final_loss = sum(losses) / seen
        metrics = engine.evaluate(data.val_x, data.val_y)
        best_accuracy = max(best_accuracy, metrics["accuracy"])
        elapsed = time.perf_counter() - start
        busy_s += elapsed
        lr = engine.lr
        engine.end_epoch()
        tracker.update({"train_loss": final_loss, "val_loss": metrics["loss"], "val_accuracy": metrics["accuracy"]})
        record = EpochRecord(model.id, tracker.epochs, final_loss, metrics["loss"], metrics["accuracy"], seen / elapsed, lr)
        history.append({k: v for k, v in record.__dict__.items() if k != "model"})
        on_epoch(record)
    return ModelResult(
        id=model.id,
        family=model.family,
        parameters=engine.num_parameters,
        epochs=tracker.epochs,
        converged=tracker.reason is not None,
        stop_reason=tracker.reason.value if tracker.reason else None,
        metric=model.train.stop.metric.value,
        best_metric=tracker.best,
        best_epoch=tracker.best_epoch,
        best_val_accuracy=best_accuracy,
        final_train_loss=final_loss,
        gpu_seconds=busy_s,
        history=history,
    )


def train_local(spec: Spec, device: str, on_epoch: Callable[[EpochRecord], None],
                on_notice: Callable[[str], None] = lambda line: None) -> RunResult:
    """Train every model of `spec`, one after another; what the data set's reader says of its
    classes goes to `on_notice` first (`class_notices`)."""
    start = time.perf_counter()
    data = LocalData(spec)
    for notice in data.notices:
        on_notice(notice)
    results = [train_model(model, data, device, on_epoch) for model in spec.models]
    return RunResult(
        name=spec.name,
        policy="local-sequential",
        gpus=1,
        makespan_s=time.perf_counter() - start,
        rounds=len(spec.models),
        samples_decoded=data.samples_decoded,
        overhead_s={"planning": 0.0, "checkpoint": 0.0, "checkpoint_gpu": 0.0},
        models=results,
    )
