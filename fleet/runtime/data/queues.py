"""Bounded queues between the threads of a trainer rank, sized in samples (Qt) or batches (Qd).

`put` and `get` block on a condition variable (no spinning) and raise `WaitTimeout`
naming the queue when a deadline passes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from fleet.rows import Pieces, Rows, join
from fleet.runtime.waiting import WaitTimeout


MAX_PIECES = 4  # shares a batch may span before the batcher joins its rows


@dataclass
class Share:
    """Rows of one chunk for one trainer, with the in-band markers."""

    x: np.ndarray
    y: np.ndarray
    chunk: int
    epoch_end: bool = False
    leave: bool = False

    @property
    def count(self) -> int:
        return len(self.y)


class SampleQueue:
    """FIFO of `Share`s holding at most `capacity` samples (markers with no rows always fit)."""

    def __init__(self, capacity: int, name: str):
        self.capacity, self.name = capacity, name
        self._items: deque[Share] = deque()
        self._samples = 0
        self._cond = threading.Condition()
        self._closed = False

    def put(self, share: Share, timeout_s: float) -> None:
        with self._cond:
            fits = lambda: self._closed or self._samples == 0 or self._samples + share.count <= self.capacity  # noqa: E731
            if not self._cond.wait_for(fits, timeout=timeout_s):
                raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for room in {self.name} (trainer too slow?)")
            if self._closed:
                return
            self._items.append(share)
            self._samples += share.count
            self._cond.notify_all()

    def get(self, timeout_s: float) -> Share:
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self._closed, timeout=timeout_s):
                raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for samples in {self.name}")
            if not self._items:
                return Share(np.empty(0), np.empty(0, np.int64), -1, leave=True)
            share = self._items.popleft()
            self._samples -= share.count
            self._cond.notify_all()
            return share

    def close(self) -> None:
        """Wake every waiter; later gets return a LEAVE marker, later puts are dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def samples(self) -> int:
        with self._cond:
            return self._samples


@dataclass
class Batch:
    x: Rows  # the rows as they arrived, in pieces: the engine joins them where it uses them
    y: np.ndarray
    epoch_end: bool
    leave: bool

    @property
    def count(self) -> int:
        return len(self.y)


class Batcher:
    """Turns a trainer's Qt into batches of its batch size (Qd), in a thread of its own.

    A batch never crosses an epoch end: the last batch of an epoch may be short, and one
    with a single sample is dropped (BatchNorm cannot train on one sample). A LEAVE marker
    ends the stream of batches.

    A batch's rows stay in the pieces they came in (the engine joins them where it uses them),
    unless they span more than `MAX_PIECES` shares: a piece may keep a whole chunk's buffer
    alive, so those are joined here and Qd holds at most `MAX_PIECES` chunks a batch.
    """

    def __init__(self, qt: SampleQueue, batch_size: int, depth: int, timeout_s: float, name: str):
        self.qt, self.batch_size, self.timeout_s = qt, batch_size, timeout_s
        self.qd: deque[Batch] = deque()
        self.depth = depth
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-batcher", daemon=True)
        self._thread.start()

    def get(self) -> Batch:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while not self.qd and self._error is None:
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise WaitTimeout(f"timed out after {self.timeout_s:g} s waiting for a batch (Qd)")
            if self._error is not None:
                raise self._error
            batch = self.qd.popleft()
            self._cond.notify_all()
            return batch

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.qt.close()
        self._thread.join(timeout=self.timeout_s)

    def _emit(self, batch: Batch) -> None:
        with self._cond:
            self._cond.wait_for(lambda: len(self.qd) < self.depth or self._stop)
            self.qd.append(batch)
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            self._assemble()
        except BaseException as exc:  # handed to the trainer thread, which reports it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _assemble(self) -> None:
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        held = 0
        while not self._stop:
            share = self.qt.get(self.timeout_s)
            if share.leave:
                self._emit(Batch(np.empty(0), np.empty(0, np.int64), epoch_end=False, leave=True))
                return
            start = 0
            while start < share.count:
                take = min(self.batch_size - held, share.count - start)
                xs.append(share.x[start : start + take])
                ys.append(share.y[start : start + take])
                held += take
                start += take
                if held == self.batch_size and not (share.epoch_end and start == share.count):
                    self._emit(Batch(rows(xs), join(ys), False, False))
                    xs, ys, held = [], [], 0
            if share.epoch_end:
                x = rows(xs) if held > 1 else np.empty((0,) + share.x.shape[1:], np.float32)
                y = join(ys) if held > 1 else np.empty(0, np.int64)
                self._emit(Batch(x, y, epoch_end=True, leave=False))
                xs, ys, held = [], [], 0


def rows(parts: list[np.ndarray]) -> Rows:
    """A batch's rows: the pieces as they came, or one array when there are too many."""
    return Pieces(tuple(parts)) if len(parts) <= MAX_PIECES else join(parts)
