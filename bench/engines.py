"""Per-step time of fleet's Keras engine beside a plain Keras loop and fleet's torch engine, in one run.

For each family (`--families`, default mlp, cnn, resnet, densenet, lstm; small params, see
`PARAMS`, changed with `--params`) on batches of `--batch` (64) random ``(N, C, H, W)`` float32
images of `--shape` (3 32 32) with int64 labels of `--classes` (10), three contenders train on
the same few numpy batches (`--batches` of them, cycled), with the same optimizer
(`--optimizer`, SGD with momentum 0.9 and fleet's default weight decay unless changed):

- ``fleet keras``: fleet's `TensorFlowEngine` (``FRAMEWORK.create_engine``), stepped exactly
  as the runtime's trainer steps a replica of a one-trainer group
  (`fleet.runtime.train.trainer.Trainer._step` with ``size == 1``): ``train_step(x, y)``
  (returns the loss as a float). A 1-trainer group has nothing to reduce, so no collective
  is timed; the Keras engine's ``train_step`` is one tf.function of forward, backward and its
  in-graph optimizer (torch's update formulas), with no host copy of the gradients.
- ``plain keras``: what a user writes by hand without fleet, on the same network (built by the
  same `KerasZoo` with the same seed: same architecture and initial weights, checked before
  timing): a ``@tf.function`` step of ``GradientTape``, Keras' sparse categorical cross-entropy
  on the logits, ``tape.gradient`` and the Keras optimizer's ``apply_gradients`` (SGD/Adam/AdamW
  with the same settings; their update formulas differ slightly from fleet's torch-style ones,
  their cost does not), called on the same numpy arrays turned into tensors, the loss read
  back as a float every step as fleet's trainer does.
- ``fleet torch``: fleet's `TorchEngine` for the same family and params (the torch zoo's
  network: the same parameter count, checked), stepped as the Keras engine is.
- with ``--detail``, ``plain keras fwd+bwd``: the plain step without its optimizer (forward,
  backward, the gradients returned from the tf.function), the reference for the
  ``compute_gradients`` share of the next.
- with ``--detail``, ``fleet keras 2 calls``: the Keras engine stepped as a member of a group
  calls it, without the collective: ``compute_gradients`` then ``apply_gradients`` (the
  gradients stay TF tensors: nothing asks for the host buffer), its time split into the two
  (a clock read between them).

Method. Both frameworks get the same thread count (`--threads`, default 1, fleet's default
``threads_per_trainer``): ``torch.set_num_threads`` and, as fleet's
`configure_tensorflow` does, TF's intra-op and inter-op pools, set once before TF runs
anything (TF's pools are process-wide and fixed once it has started, so the two Keras
contenders share them; for another count run the script again). TF's oneDNN rewrites are off
for both Keras contenders, as fleet's TensorFlow package sets them for the whole process
(``--onednn`` turns them on for both). Every contender first runs `--warmup` untimed steps (the
tf.function tracing among them). Then `--repeats` repetitions, each a block of `--steps` timed
steps per contender, interleaved contender by contender (fleet keras, plain keras, fleet
torch, ...), the order rotated by one every repetition so that each contender follows each other
one equally often (a framework's idle thread pool may still spin just after its block): drift
on the machine hits all alike. A block's figure is its mean step time; each contender's figure is
the median over its blocks (min-max shown beside it; the ratio of the fastest blocks is printed
too: on a busy machine it is the steadier of the two).

Usage: .venv/bin/python bench/engines.py [--families mlp cnn resnet] [--steps 20] [--repeats 15]
       [--threads 1] [--shape 3 32 32] [--batch 64] [--detail] [--json out.json]
Prints, per family, ms/step of each contender, fleet keras / plain keras (target: <= 1.10x, the
overhead of fleet's engine over the hand-written loop) and fleet torch / fleet keras, then a
summary table. With the defaults (five families, 3 x 15 x 20 timed steps each) it takes about
7 minutes on one thread of a 2-core x86 VM, most of it densenet's. Run nothing else meanwhile:
on a loaded machine the figures move by more than the overhead measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np

TARGET = 1.10
PARAMS: dict[str, dict] = {
    "mlp": {"hidden": [512, 256]},
    "cnn": {"channels": [16, 32], "hidden": 64},
    "resnet": {"blocks": [1, 1, 1, 1], "width": 8},
    "densenet": {"blocks": [2, 2, 2], "growth_rate": 8},
    "lstm": {"hidden": 64},
}
DETAIL = "plain keras fwd+bwd"
TWO_CALLS = "fleet keras 2 calls"
SEED = 11


def setup_frameworks(threads: int, onednn: bool):
    """Import TF (through fleet's package, so its environment settings apply) and torch, and
    give both `threads` before either runs anything; returns (tf, keras, torch)."""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"  # read when TF's C++ side starts
    import fleet.engines.tensorflow  # noqa: F401 - sets TF's log level before TF starts
    import keras
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(threads)  # what fleet's configure_tensorflow sets
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    torch.set_num_threads(threads)
    if tf.config.threading.get_intra_op_parallelism_threads() != threads or torch.get_num_threads() != threads:
        raise SystemExit(f"engines: could not give both frameworks {threads} thread(s)")
    return tf, keras, torch


def model_spec(family: str, params: dict, framework: str, train: dict):
    from fleet.spec import ModelSpec, TrainSpec

    return ModelSpec(id=f"{family}-bench", family=family, params=params, train=TrainSpec(**train), seed=SEED,
                     framework=framework)


def fleet_step(engine) -> Callable[[np.ndarray, np.ndarray], float]:
    """One batch as the runtime's trainer runs it in a 1-trainer group: ``train_step``."""
    return engine.train_step


class SplitStep:
    """`--detail`: one batch as a group member steps it, without the collective:
    ``compute_gradients`` then ``apply_gradients``; the seconds of each are summed in `split`
    (two clock reads a step, nothing else added)."""

    def __init__(self, engine):
        self.engine, self.split = engine, [0.0, 0.0]

    def __call__(self, x: np.ndarray, y: np.ndarray) -> float:
        began = time.perf_counter()
        loss = self.engine.compute_gradients(x, y)
        computed = time.perf_counter()
        self.engine.apply_gradients()
        self.split[0] += computed - began
        self.split[1] += time.perf_counter() - computed
        return loss


def keras_optimizer(keras, train: dict):
    """The Keras optimizer a user picks for the spec's settings."""
    kind, lr, wd = train["optimizer"], train["lr"], train["weight_decay"] or None
    if kind == "sgd":
        return keras.optimizers.SGD(learning_rate=lr, momentum=train["momentum"], weight_decay=wd)
    if kind == "adam":
        return keras.optimizers.Adam(learning_rate=lr, weight_decay=wd)
    return keras.optimizers.AdamW(learning_rate=lr, weight_decay=train["weight_decay"])


def plain_keras_step(tf, keras, net, train: dict) -> Callable[[np.ndarray, np.ndarray], float]:
    """The hand-written loop: a tf.function of GradientTape, loss, gradients and the optimizer."""
    optimizer = keras_optimizer(keras, train)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
        grads = tape.gradient(loss, net.trainable_variables)
        optimizer.apply_gradients(zip(grads, net.trainable_variables))
        return loss

    def step(x: np.ndarray, y: np.ndarray) -> float:
        return float(train_step(tf.convert_to_tensor(x), tf.convert_to_tensor(y)))
    return step


def plain_keras_gradients(tf, keras, net) -> Callable[[np.ndarray, np.ndarray], float]:
    """`--detail`: the plain step without the optimizer (forward, backward, the gradients
    returned from the tf.function): what fleet's ``compute_gradients`` does."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
        return loss, tape.gradient(loss, net.trainable_variables)

    def step(x: np.ndarray, y: np.ndarray) -> float:
        return float(gradients(tf.convert_to_tensor(x), tf.convert_to_tensor(y))[0])
    return step


def contenders(family: str, params: dict, args: argparse.Namespace, mods) -> tuple[dict, int]:
    """Each contender's step for `family`, and the network's parameter count (checked equal:
    the plain network's initial weights are the fleet Keras engine's)."""
    from fleet.engines.options import EngineOptions
    from fleet.engines.tensorflow import FRAMEWORK as TF_FRAMEWORK, KerasZoo
    from fleet.engines.torch.framework import FRAMEWORK as TORCH_FRAMEWORK

    tf, keras, _ = mods
    shape, train = tuple(args.shape), {"optimizer": args.optimizer, "lr": args.lr, "momentum": args.momentum,
                                       "weight_decay": args.weight_decay, "batch_size": args.batch}
    keras_engine = TF_FRAMEWORK.create_engine(EngineOptions(model_spec(family, params, "tensorflow", train), shape,
                                                            args.classes, threads=args.threads))
    net = KerasZoo().build(family, params, shape, args.classes, seed=SEED)
    torch_engine = TORCH_FRAMEWORK.create_engine(EngineOptions(model_spec(family, params, "torch", train), shape,
                                                               args.classes, threads=args.threads))
    plain = np.concatenate([np.asarray(v.numpy(), np.float32).reshape(-1) for v in net.trainable_variables])
    if not np.array_equal(plain, keras_engine.flat_parameters()):
        raise SystemExit(f"engines: {family}: the plain network's weights are not the fleet engine's")
    if torch_engine.num_parameters != keras_engine.num_parameters:
        raise SystemExit(f"engines: {family}: torch has {torch_engine.num_parameters} parameters, "
                         f"keras {keras_engine.num_parameters}")
    steps = {"fleet keras": fleet_step(keras_engine), "plain keras": plain_keras_step(tf, keras, net, train),
             "fleet torch": fleet_step(torch_engine)}
    if args.detail:
        steps[DETAIL] = plain_keras_gradients(tf, keras, net)
        twin = TF_FRAMEWORK.create_engine(EngineOptions(model_spec(family, params, "tensorflow", train), shape,
                                                        args.classes))
        steps[TWO_CALLS] = SplitStep(twin)
    return steps, keras_engine.num_parameters


def run_block(step: Callable, batches: list, count: int, start: int) -> float:
    """Seconds per step over `count` steps, cycling through `batches` from `start`."""
    began = time.perf_counter()
    for i in range(start, start + count):
        x, y = batches[i % len(batches)]
        step(x, y)
    return (time.perf_counter() - began) / count


def measure(steps: dict, batches: list, args: argparse.Namespace) -> tuple[dict, dict]:
    """Warm-up, then `repeats` interleaved blocks per contender (order rotated each repetition);
    returns each contender's seconds per step per block, and each split contender's per-block
    seconds per step of ``compute_gradients`` and of ``apply_gradients``."""
    for step in steps.values():
        loss = [step(*batches[i % len(batches)]) for i in range(args.warmup)]
        if not all(np.isfinite(loss)):
            raise SystemExit(f"engines: a contender's warm-up loss is not finite: {loss}")
    names, blocks = list(steps), {name: [] for name in steps}
    splits = {name: ([], []) for name, step in steps.items() if isinstance(step, SplitStep)}
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            gc.collect()
            step = steps[name]
            if name in splits:
                step.split[:] = [0.0, 0.0]
            blocks[name].append(run_block(step, batches, args.steps, rep * args.steps))
            if name in splits:
                for part, seconds in zip(splits[name], step.split):
                    part.append(seconds / args.steps)
    return blocks, splits


def bench_family(family: str, params: dict, args: argparse.Namespace, mods) -> dict:
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((args.batch, *args.shape)).astype(np.float32),
                rng.integers(0, args.classes, args.batch).astype(np.int64)) for _ in range(args.batches)]
    steps, count = contenders(family, params, args, mods)
    blocks, splits = measure(steps, batches, args)
    ms = {name: 1e3 * statistics.median(values) for name, values in blocks.items()}
    fastest = {name: 1e3 * min(values) for name, values in blocks.items()}
    return {
        "family": family, "params": params, "num_parameters": count, "ms_per_step": ms,
        "blocks_ms": {name: [1e3 * v for v in values] for name, values in blocks.items()},
        "split_ms": {name: {"compute_gradients": 1e3 * statistics.median(compute),
                            "apply_gradients": 1e3 * statistics.median(apply)}
                     for name, (compute, apply) in splits.items()},
        "fleet_over_plain_keras": ms["fleet keras"] / ms["plain keras"],
        "fleet_over_plain_keras_fastest_blocks": fastest["fleet keras"] / fastest["plain keras"],
        "torch_over_keras": ms["fleet torch"] / ms["fleet keras"],
    }


def print_family(result: dict, args: argparse.Namespace) -> None:
    ratio = result["fleet_over_plain_keras"]
    print(f"\n{result['family']} {json.dumps(result['params'])}: {result['num_parameters']:,} parameters, "
          f"batch {args.batch} of {tuple(args.shape)}, {args.threads} thread(s)")
    print(f"  {'contender':<21}{'ms/step':>9}   {'blocks min-max':<16}{'compute + apply'}")
    for name, values in result["blocks_ms"].items():
        split = result["split_ms"].get(name)
        parts = f"{split['compute_gradients']:.2f} + {split['apply_gradients']:.2f}" if split else ""
        print(f"  {name:<21}{result['ms_per_step'][name]:>9.2f}   {min(values):>7.2f}-{max(values):<8.2f}{parts}")
    print(f"  fleet keras / plain keras: {ratio:.3f}x (target <= {TARGET:.2f}: {'met' if ratio <= TARGET else 'NOT met'}; "
          f"fastest blocks {result['fleet_over_plain_keras_fastest_blocks']:.3f}x)")
    print(f"  fleet torch / fleet keras: {result['torch_over_keras']:.3f}x")


def print_summary(results: list[dict]) -> None:
    print(f"\n{'family':<10}{'fleet keras':>13}{'plain keras':>13}{'fleet/plain':>13}{'target':>9}"
          f"{'fleet torch':>13}{'torch/keras':>13}   (ms/step, median of blocks)")
    for r in results:
        ms, ratio = r["ms_per_step"], r["fleet_over_plain_keras"]
        print(f"{r['family']:<10}{ms['fleet keras']:>13.2f}{ms['plain keras']:>13.2f}{ratio:>12.3f}x"
              f"{'met' if ratio <= TARGET else 'NOT met':>9}{ms['fleet torch']:>13.2f}{r['torch_over_keras']:>12.3f}x")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(PARAMS), choices=list(PARAMS))
    parser.add_argument("--params", default="{}", help='JSON of params per family replacing PARAMS\', '
                        'e.g. \'{"resnet": {"blocks": [2, 2, 2, 2], "width": 16}}\'')
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block")
    parser.add_argument("--repeats", type=int, default=15, help="blocks per contender (median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per contender first")
    parser.add_argument("--threads", type=int, default=1, help="torch's and TF's (intra and inter op) threads")
    parser.add_argument("--shape", type=int, nargs=3, default=[3, 32, 32], metavar=("C", "H", "W"))
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=8, help="distinct batches, cycled")
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--onednn", action="store_true", help="TF's oneDNN rewrites on (fleet turns them off)")
    parser.add_argument("--detail", action="store_true",
                        help=f"also time '{DETAIL}' (the plain step without its optimizer) and '{TWO_CALLS}'")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    if min(args.steps, args.repeats, args.threads, args.batch, args.batches) < 1 or args.warmup < 0:
        parser.error("--steps, --repeats, --threads, --batch and --batches must be positive, --warmup >= 0")
    return args


def main() -> None:
    args = parse_args()
    overrides = json.loads(args.params)
    mods = setup_frameworks(args.threads, args.onednn)
    tf, keras, torch = mods
    print(f"engines: {os.cpu_count()} cores, {args.threads} thread(s) per framework; TF {tf.__version__} "
          f"(Keras {keras.__version__}, oneDNN {'on' if args.onednn else 'off'}), torch {torch.__version__}; "
          f"{args.optimizer}; {args.repeats} blocks of {args.steps} steps per contender (median), "
          f"{args.warmup} warm-up steps, contenders interleaved")
    results = []
    for family in args.families:
        results.append(bench_family(family, overrides.get(family, PARAMS[family]), args, mods))
        print_family(results[-1], args)
        keras.backend.clear_session()
        gc.collect()
    print_summary(results)
    if args.json:
        meta = {"cores": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                "tensorflow": tf.__version__, "keras": keras.__version__, "torch": torch.__version__,
                "onednn": args.onednn, "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                "torch_threads": torch.get_num_threads()}
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "params")}
        Path(args.json).write_text(json.dumps({"settings": settings, "meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
