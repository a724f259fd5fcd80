"""The torch engine's optimizer step (`ParamUpdate`) against torch.optim on the same parameters
and gradients, in one run: the step's time (median of timed blocks, the ratio side by side) and
what each costs before the first step (torch.optim's first step imports torch._dynamo).

Usage: .venv/bin/python bench/optim_step.py [--device cpu|cuda] [--threads 1] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from _harness import run_to_end
from fleet.engines.torch.optim import ParamUpdate
from fleet.engines.torch.zoo import build_model
from fleet.spec import TrainSpec

NETS = {"mlp [512, 256]": ("mlp", {"hidden": [512, 256]}), "cnn [32, 64]": ("cnn", {"channels": [32, 64]}),
        "resnet width 16": ("resnet", {"width": 16})}
TRAININGS = {"sgd": TrainSpec(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4),
             "adam": TrainSpec(optimizer="adam", lr=0.001, weight_decay=1e-4)}
STEPS_PER_BLOCK = 20

FIRST_STEP = """
import sys, time, torch
from fleet.engines.torch.optim import ParamUpdate
from fleet.spec import TrainSpec
params = [torch.nn.Parameter(torch.zeros(1000, device=sys.argv[2]))]
params[0].grad = torch.ones_like(params[0])
began = time.perf_counter()
train = TrainSpec(optimizer="sgd", lr=0.1, momentum=0.9)
step = ParamUpdate(params, train) if sys.argv[1] == "fleet" else torch.optim.SGD(params, lr=0.1, momentum=0.9)
step.step()
print(time.perf_counter() - began)
"""


def torch_optimizer(params, train: TrainSpec) -> torch.optim.Optimizer:
    if train.optimizer.value == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    return torch.optim.Adam(params, lr=train.lr, weight_decay=train.weight_decay)


def block_seconds(step, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(STEPS_PER_BLOCK):
        step.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - began) / STEPS_PER_BLOCK


def compare(family: str, params: dict, train: TrainSpec, device: str, repeats: int) -> tuple[int, float, float]:
    """(parameters, fleet ms, torch.optim ms): each on its own copy of the same network."""
    copies = [build_model(family, params, (3, 32, 32), 10, seed=0).to(device) for _ in range(2)]
    for net in copies:
        for p in net.parameters():
            p.grad = torch.full_like(p, 1e-3)
    ours = ParamUpdate(list(copies[0].parameters()), train)
    theirs = torch_optimizer(list(copies[1].parameters()), train)
    for step in (ours, theirs):  # warm-up: state created, kernels loaded
        block_seconds(step, device)
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for _ in range(repeats):  # interleaved, so drift hits both
        times["ours"].append(block_seconds(ours, device))
        times["theirs"].append(block_seconds(theirs, device))
    count = sum(p.numel() for p in copies[0].parameters())
    return count, 1e3 * statistics.median(times["ours"]), 1e3 * statistics.median(times["theirs"])


def first_step_seconds(kind: str, device: str) -> float:
    """A fresh process's first optimizer construction and step (imports included)."""
    done = run_to_end([sys.executable, "-c", FIRST_STEP, kind, device], f"the first {kind} step", 300)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"optimizer step on {args.device} ({torch.cuda.get_device_name(0) if args.device == 'cuda' else f'{args.threads} thread(s)'}), "
          f"torch {torch.__version__}; median of {args.repeats} blocks of {STEPS_PER_BLOCK} steps, interleaved")
    print(f"{'network':<16} {'parameters':>10} {'optimizer':<9} {'fleet ms':>9} {'torch.optim ms':>15} {'fleet / torch':>13}")
    for name, (family, params) in NETS.items():
        for optimizer, train in TRAININGS.items():
            count, ours, theirs = compare(family, params, train, args.device, args.repeats)
            print(f"{name:<16} {count:>10,} {optimizer:<9} {ours:>9.3f} {theirs:>15.3f} {ours / theirs:>12.2f}x")
    fleet_first, torch_first = first_step_seconds("fleet", args.device), first_step_seconds("torch", args.device)
    print(f"a fresh process's first SGD construction and step: fleet {fleet_first:.2f} s, torch.optim {torch_first:.2f} s")


if __name__ == "__main__":
    main()
