"""The reference for `bench/parity.py`: one model of a spec trained by a plain PyTorch loop.

What a user's own training script does, written without fleet's runtime, engine, pipeline or
schedule: a `torch.utils.data.Dataset` that decodes and transforms one sample at a time with
PIL and torch, a shuffling `DataLoader`, `torch.optim` and `torch.optim.lr_scheduler`, and
`model.eval()` under `torch.no_grad()` for validation. What it shares with fleet on purpose,
because the comparison is about training and not about these: the network (the zoo's builder,
seeded with the model's seed, so both start from the same weights), the raw data (the
reader's file bytes or pixels and labels), the train/validation split
(`preprocess.split.split_indices`), the stop rule (`StopTracker`) and the rule that a
one-sample batch is skipped (fleet's `Batcher` drops it; BatchNorm cannot train on it).

Run as a script, it trains one model of a spec in this process and writes its result as JSON,
what one task of a job array would do (`bench/peers.py` starts one process per model):

Usage: .venv/bin/python bench/plain_loop.py SPEC --model INDEX --seed S [--threads T] --json OUT
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fleet.inspect import input_shape, num_classes
from fleet.engines.torch.zoo import build_model
from fleet.runtime.train.stop import StopTracker
from fleet.spec import ModelSpec, Optimizer, ScheduleKind, Spec, load_spec
from fleet.spec.sections import CenterCropOp, DecodeOp, FlipOp, NormalizeOp, RandomCropOp, ResizeOp, TrainSpec
from preprocess.readers import open_reader
from preprocess.split import split_three

EVAL_BATCH = 256

EpochHook = Callable[[dict], bool]
"""Called after each epoch with its record (epoch, train_loss, val_accuracy, lr): True trains
on, False stops the model there (a tuner's pruning: `bench/early_stop.py`)."""


# ----------------------------------------------------------------------------- transforms


def _pil(item, channels: int) -> Image.Image:
    """Encoded bytes or an H x W x C uint8 array as a PIL image of the spec's channels."""
    mode = "RGB" if channels == 3 else "L"
    if isinstance(item, (bytes, bytearray)):
        image = Image.open(io.BytesIO(item))
    else:
        array = np.asarray(item)
        image = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    return image if image.mode == mode else image.convert(mode)


def _tensor(image) -> torch.Tensor:
    """A PIL image as float C x H x W in [0, 255]; a tensor passes through."""
    if isinstance(image, torch.Tensor):
        return image
    array = np.asarray(image, dtype=np.float32)
    return torch.from_numpy(array[..., None] if array.ndim == 2 else array).permute(2, 0, 1).contiguous()


def _resize(image, size: tuple[int, int]):
    if isinstance(image, Image.Image):
        return image if image.size == (size[1], size[0]) else image.resize((size[1], size[0]), Image.BILINEAR)
    return F.interpolate(image[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]


def _centre_crop(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    pad_h, pad_w = max(0, size[0] - x.shape[1]), max(0, size[1] - x.shape[2])
    if pad_h or pad_w:
        x = F.pad(x, ((pad_w + 1) // 2, (pad_w + 1) // 2, (pad_h + 1) // 2, (pad_h + 1) // 2))
    top, left = (x.shape[1] - size[0]) // 2, (x.shape[2] - size[1]) // 2
    return x[:, top : top + size[0], left : left + size[1]]


def _random_crop(x: torch.Tensor, size: tuple[int, int], padding: int) -> torch.Tensor:
    if padding:
        x = F.pad(x, (padding, padding, padding, padding))
    top = int(torch.randint(0, x.shape[1] - size[0] + 1, ()))
    left = int(torch.randint(0, x.shape[2] - size[1] + 1, ()))
    return x[:, top : top + size[0], left : left + size[1]]


class SpecTransform:
    """The spec's `preprocess` ops for one sample, as torchvision-style code would apply them:
    decode and resize with PIL (bilinear), crops, flips and normalisation on tensors, random
    ones from torch's global RNG and only when `train` (a random crop is a centre crop then)."""

    def __init__(self, spec: Spec, train: bool):
        data = spec.data.defaults_filled()
        self.ops, self.channels, self.train = spec.preprocess, data.channels, train
        self.default_size = tuple(data.image_size)
        self._normalize: dict = {}

    def __call__(self, item) -> torch.Tensor:
        x, scaled = (item if isinstance(item, (bytes, bytearray)) else _pil(item, self.channels)), False
        for op in self.ops:
            x, scaled = self._apply(op, x, scaled)
        x = _tensor(x)
        return x if scaled else x / 255.0

    def _moments(self, op: NormalizeOp) -> tuple[torch.Tensor, torch.Tensor]:
        if op not in self._normalize:
            self._normalize[op] = tuple(torch.tensor(v, dtype=torch.float32)[:, None, None] for v in (op.mean, op.std))
        return self._normalize[op]

    def _size(self, op) -> tuple[int, int]:
        return tuple(op.size) if getattr(op, "size", None) else self.default_size

    def _apply(self, op, x, scaled: bool):
        if isinstance(op, DecodeOp):
            return (_pil(x, self.channels) if isinstance(x, (bytes, bytearray)) else x), scaled
        if isinstance(op, ResizeOp):
            return _resize(x, self._size(op)), scaled
        if isinstance(op, CenterCropOp) or (isinstance(op, RandomCropOp) and not self.train):
            return _centre_crop(_tensor(x), self._size(op)), scaled
        if isinstance(op, RandomCropOp):
            return _random_crop(_tensor(x), self._size(op), op.padding), scaled
        if isinstance(op, FlipOp):
            x = _tensor(x)
            return (x.flip(-1) if self.train and float(torch.rand(())) < op.p else x), scaled
        if isinstance(op, NormalizeOp):
            mean, std = self._moments(op)
            return (_tensor(x) / 255.0 - mean) / std, True
        raise TypeError(f"unknown preprocess op {op!r}")


# ----------------------------------------------------------------------------- data


class SpecDataset(Dataset):
    """Raw samples (file bytes or pixels, read once) transformed one at a time."""

    def __init__(self, items: list, labels: np.ndarray, transform: SpecTransform):
        self.items, self.labels, self.transform = items, torch.as_tensor(labels, dtype=torch.int64), transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.transform(self.items[i]), self.labels[i]


@dataclass
class PlainData:
    """The spec's data as a plain script holds it: the training set, the validation tensors and,
    with `data.test_fraction`, the test tensors (None without), split as fleet splits them."""

    train: SpecDataset
    val_x: torch.Tensor
    val_y: torch.Tensor
    input_shape: tuple[int, int, int]
    num_classes: int
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None

    @classmethod
    def open(cls, spec: Spec) -> "PlainData":
        reader = open_reader(spec.data, seed=spec.seed)
        # a test fraction of 0 splits train and validation as split_indices does
        train_idx, val_idx, test_idx = split_three(reader.labels, spec.data.val_fraction, spec.data.test_fraction,
                                                   spec.seed)
        train_raw = reader.read(train_idx)
        train = SpecDataset(list(train_raw.items), train_raw.labels, SpecTransform(spec, train=True))
        val_x, val_y = _held_out(reader, val_idx, spec)
        test_x, test_y = _held_out(reader, test_idx, spec) if len(test_idx) else (None, None)
        return cls(train, val_x, val_y, input_shape(spec), num_classes(spec), test_x, test_y)


def _held_out(reader, indices: np.ndarray, spec: Spec) -> tuple[torch.Tensor, torch.Tensor]:
    """A held-out set's samples, transformed for evaluation once, and its labels."""
    raw = reader.read(indices)
    held = SpecDataset(list(raw.items), raw.labels, SpecTransform(spec, train=False))
    return torch.stack([held[i][0] for i in range(len(held))]), held.labels


# ----------------------------------------------------------------------------- training


def make_optimizer(net: torch.nn.Module, train: TrainSpec) -> torch.optim.Optimizer:
    if train.optimizer is Optimizer.SGD:
        return torch.optim.SGD(net.parameters(), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    kind = torch.optim.Adam if train.optimizer is Optimizer.ADAM else torch.optim.AdamW
    return kind(net.parameters(), lr=train.lr, weight_decay=train.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec):
    """torch's own schedulers, stepped once per epoch: linear warm-up from lr/(w+1), then
    cosine over the remaining epochs, step decay, or constant."""
    schedule, lr_ = train.schedule, torch.optim.lr_scheduler
    w = schedule.warmup_epochs
    if schedule.kind is ScheduleKind.COSINE:
        after = lr_.CosineAnnealingLR(optimizer, T_max=max(train.max_epochs - w, 1))
    elif schedule.kind is ScheduleKind.STEP:
        after = lr_.StepLR(optimizer, step_size=schedule.step_epochs, gamma=schedule.gamma)
    else:
        after = lr_.LambdaLR(optimizer, lambda epoch: 1.0)
    if w == 0:
        return after
    warm = lr_.LinearLR(optimizer, start_factor=1.0 / (w + 1), end_factor=1.0, total_iters=w)
    return lr_.SequentialLR(optimizer, [warm, after], milestones=[w])


def evaluate(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean loss and accuracy on (x, y), in eval mode without gradients."""
    net.eval()
    loss = correct = 0.0
    with torch.no_grad():
        for i in range(0, len(y), EVAL_BATCH):
            logits = net(x[i : i + EVAL_BATCH])
            loss += float(F.cross_entropy(logits, y[i : i + EVAL_BATCH], reduction="sum"))
            correct += float((logits.argmax(1) == y[i : i + EVAL_BATCH]).sum())
    return loss / len(y), correct / len(y)


def train_epoch(net, loader, optimizer) -> float:
    """One pass over the loader; the mean training loss over the samples trained on."""
    net.train()
    loss_sum, seen = 0.0, 0
    for x, y in loader:
        if len(y) < 2:  # fleet's Batcher drops a one-sample batch (BatchNorm cannot train on it)
            continue
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(y)
        seen += len(y)
    return loss_sum / max(seen, 1)


def train_model(model: ModelSpec, data: PlainData, seed: int, on_epoch: EpochHook | None = None) -> dict:
    """Train `model` until its stop rule fires, or until `on_epoch` (when given) returns False
    after an epoch; `seed` seeds data order, augmentation and dropout (the weights come from the
    model's own seed, as in fleet)."""
    started = time.perf_counter()
    torch.manual_seed(seed)
    net = build_model(model.family, model.params, data.input_shape, data.num_classes, seed=model.seed)
    optimizer = make_optimizer(net, model.train)
    scheduler = make_scheduler(optimizer, model.train)
    shuffle = torch.Generator().manual_seed(seed)
    loader = DataLoader(data.train, batch_size=model.train.batch_size, shuffle=True, generator=shuffle)
    tracker, history = StopTracker(model.train.stop, model.train.max_epochs), []
    while not tracker.converged:
        lr = optimizer.param_groups[0]["lr"]
        train_loss = train_epoch(net, loader, optimizer)
        val_loss, accuracy = evaluate(net, data.val_x, data.val_y)
        scheduler.step()
        tracker.update({"train_loss": train_loss, "val_loss": val_loss, "val_accuracy": accuracy})
        history.append({"epoch": tracker.epochs, "train_loss": train_loss, "val_accuracy": accuracy, "lr": lr})
        if data.test_x is not None:  # scored as fleet keeps a model's best epoch's test predictions
            history[-1]["test_accuracy"] = evaluate(net, data.test_x, data.test_y)[1]
        if on_epoch is not None and not on_epoch(history[-1]):
            break
    best = max(history, key=lambda h: h["val_accuracy"])  # the first best epoch
    return {
        "id": model.id, "epochs": tracker.epochs, "best_val_accuracy": best["val_accuracy"],
        "final_train_loss": history[-1]["train_loss"], "seconds": time.perf_counter() - started, "history": history,
        **({"test_accuracy_of_best": best["test_accuracy"]} if data.test_x is not None else {}),
    }


# ----------------------------------------------------------------------------- worker processes

_WORKER: dict = {}


def worker_init(spec_path: str, threads: int) -> None:
    """A worker process of the plain run: its torch threads, the spec and its own data."""
    torch.set_num_threads(threads)
    spec = load_spec(spec_path)
    _WORKER.update(spec=spec, data=PlainData.open(spec))


def worker_train(index: int, seed: int, on_epoch: EpochHook | None = None) -> dict:
    """Train the spec's model `index` in this worker (see `worker_init`; `on_epoch` as for
    `train_model`), with the samples it decoded for it: its training set every epoch, and the
    worker's validation set with the worker's first model (`PlainData.open` decoded it once)."""
    return worker_train_model(_WORKER["spec"].models[index], seed, on_epoch)


def worker_spec() -> Spec:
    """The spec this worker opened (`worker_init`)."""
    return _WORKER["spec"]


def worker_train_model(model: ModelSpec, seed: int, on_epoch: EpochHook | None = None) -> dict:
    """`worker_train` of any `model` (a tuner's: its values asked by the tuner)."""
    data = _WORKER["data"]
    result = train_model(model, data, seed, on_epoch)
    first, _WORKER["trained"] = not _WORKER.get("trained"), True
    return {**result, "samples_decoded": samples_decoded(data, result["epochs"], validation=first)}


# ----------------------------------------------------------------------------- one model per process


def samples_decoded(data: PlainData, epochs: int, validation: bool = True) -> int:
    """JPEGs a process decodes for a model: the training set every epoch (the Dataset decodes
    a sample each time it is drawn) and, with `validation`, the validation and test sets once
    (`PlainData.open` keeps their tensors: a worker decodes them for its first model only)."""
    held_out = len(data.val_y) + (len(data.test_y) if data.test_y is not None else 0)
    return len(data.train) * epochs + (held_out if validation else 0)


def train_one(spec_path: str, index: int, seed: int, threads: int, on_epoch: EpochHook | None = None) -> dict:
    """Open the spec's data in this process and train its model `index` (`on_epoch` as for
    `train_model`); the result of `train_model` with the samples this process decoded."""
    torch.set_num_threads(threads)
    spec = load_spec(spec_path)
    data = PlainData.open(spec)
    result = train_model(spec.models[index], data, seed, on_epoch)
    return {**result, "samples_decoded": samples_decoded(data, result["epochs"])}


def main() -> None:
    parser = argparse.ArgumentParser(description="Train one model of SPEC with the plain loop; its result as JSON.")
    parser.add_argument("spec", help="the fleet spec (YAML) whose data, transforms and models to use")
    parser.add_argument("--model", type=int, required=True, metavar="INDEX", help="index of the model in the spec")
    parser.add_argument("--seed", type=int, required=True, help="seed of data order, augmentation and dropout")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", required=True, metavar="OUT", help="file to write the result to")
    args = parser.parse_args()
    result = train_one(args.spec, args.model, args.seed, args.threads)
    Path(args.json).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
