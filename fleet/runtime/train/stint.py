"""What a trainer counts over one stint of a model on its group (from its start to its leave):
the current epoch's samples, loss, compute and CPU time (`EpochTotals`, the same on every
trainer of the group; an epoch resumed from a checkpoint mid-way starts from its sums,
`resumed_totals`), and the costs its master reports once each (`MemberCosts`). Shared by a
model's `GroupTraining` and a bundle's `BundleTraining`."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fleet.runtime.data.queues import Batch, Batcher
from fleet.runtime.data.stream import StreamThread
from fleet.runtime.waiting import DATA_WAITS, WaitTimeout


_APART: dict[int, float] = {}  # CPU clocks of this process's threads that do other work -> their last reading


def set_apart(thread: threading.Thread) -> None:
    """Leave the CPU of `thread` (started: a trainer's own decoder, whose decoding the
    preprocessors' books count) out of `trainer_cpu_s` from now on."""
    if hasattr(time, "pthread_getcpuclockid") and thread.ident is not None:
        clock = time.pthread_getcpuclockid(thread.ident)
        _APART[clock] = _read(clock, 0.0)


def trainer_cpu_s() -> float:
    """This trainer process's CPU seconds, less all those of the threads `set_apart`."""
    apart = 0.0
    for clock, last in _APART.items():
        _APART[clock] = reading = _read(clock, last)
        apart += reading
    return time.process_time() - apart


def _read(clock: int, last: float) -> float:
    """The CPU seconds of a thread's clock; `last` once the thread has ended."""
    try:
        return time.clock_gettime(clock)
    except OSError:
        return last


@dataclass
class EpochTotals:
    """What the group did in the current epoch (the same on every trainer of the group)."""

    samples: int = 0
    loss_sum: float = 0.0
    compute_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    resumed: int = 0  # of `samples`, those trained before a checkpoint, by an earlier stint
    step_cpu_s: float = 0.0  # CPU seconds of this trainer's thread in its steps (this stint)
    cpu_started: float = field(default_factory=trainer_cpu_s)  # the process's CPU seconds then (`trainer_cpu_s`)
    waits_started: tuple[float, float] = field(default_factory=DATA_WAITS.totals)  # its data waits' books then

    def consumed_per_s(self, epoch_s: float) -> float:
        """Samples per second the group took from its stream since `started`."""
        return (self.samples - self.resumed) / max(epoch_s, 1e-9)


class MemberCosts:
    """What a member's master reports of its own costs, each once: its start (from its
    `StartMember` to its first batch: set-up, restore, the stream's first data) in the first
    report after that batch, and the seconds of its saves since its last report (the
    coordinator sums the reports, so each save counts once)."""

    def __init__(self, created: float | None = None):
        self.created = time.monotonic() if created is None else created
        self.first_batch: float | None = None
        self.start_reported = False
        self.checkpoint_s = 0.0

    def first_batch_came(self, when: float | None = None) -> None:
        if self.first_batch is None:
            self.first_batch = time.monotonic() if when is None else when

    def saved(self, seconds: float) -> None:
        self.checkpoint_s += seconds

    def take_start_s(self) -> float:
        """The start, once; 0 before the first batch (a leave before any data) and after."""
        if self.first_batch is None or self.start_reported:
            return 0.0
        self.start_reported = True
        return self.first_batch - self.created

    def take_checkpoint_s(self) -> float:
        seconds, self.checkpoint_s = self.checkpoint_s, 0.0
        return seconds


def resumed_totals(epoch_samples: int, is_master: bool, sums: tuple[float, float], size: int) -> EpochTotals:
    """The epoch a checkpoint stopped in: its position, and (on the master, which saved them)
    the loss sum and compute time so far (`sums`), so that the epoch's loss and rate cover all
    of it. The epoch's sums are allreduced over the `size` trainers, so workers start at zero."""
    if not epoch_samples or not is_master:
        return EpochTotals(samples=epoch_samples, resumed=epoch_samples)
    loss_sum, compute_s = sums
    return EpochTotals(samples=epoch_samples, loss_sum=loss_sum, compute_s=compute_s * size, resumed=epoch_samples)


def next_batch(ctx: Any, batcher: Batcher, stream: StreamThread) -> Batch:
    """The trainer's next batch; a wait that times out says what the stream thread (and any
    draining one of the trainer's last group) waited for, and the stream thread's own error
    comes out as it is."""
    try:
        batch = batcher.get()
    except WaitTimeout as exc:
        if stream.error is not None:
            raise stream.error
        draining = [t for t in ctx.draining if t.waiting_for]
        also = "".join(f"; the draining {t.name} of its last group waits for {t.waiting_for}" for t in draining)
        raise WaitTimeout(f"{exc}; {stream.describe()}{also}") from None
    if batch.leave and stream.error is not None:
        raise stream.error
    return batch
