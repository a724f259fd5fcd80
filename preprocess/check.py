"""`fleet data info --check`: read and decode every sample as training would; name the bad ones.

A data set is read in blocks through its reader; each block goes through a *judge*: the
spec's own pipeline (evaluation transforms) when the data set is named by a spec, else the
decode step alone (as ``decode`` decodes a file in training). A block that fails is read
and judged again one sample at a time, so that every bad sample is named, with the
reader's or the decoder's one-line reason (``file: cannot decode image (...)``,
``file.h5[12]: cannot read images (...)``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from fleet.errors import UserError
from fleet.spec import load_spec
from preprocess.output import progress_bar
from preprocess.readers import RawBatch, Reader
from preprocess.transforms import Pipeline, decode_image

BLOCK = 256  # samples read and judged at a time
PROGRESS_EVERY_S = 5.0  # a progress line this often where stderr is not a terminal
SPEC_SUFFIXES = (".yaml", ".yml")

Judge = Callable[[RawBatch], None]


@dataclass(frozen=True)
class CheckResult:
    """What a check found: how many samples it read, and one line per bad sample."""

    checked: int
    bad: tuple[str, ...]

    def summary(self) -> str:
        if not self.bad:
            return f"check: all {self.checked} samples read and decode"
        return f"check: {len(self.bad)} of {self.checked} samples cannot be used (listed above)"


def decode_only(raw: RawBatch) -> None:
    """The decode step alone: encoded files must decode (arrays arrive decoded)."""
    if raw.encoded:
        for data, name in zip(raw.items, raw.names):
            decode_image(data, name, 3, None)


def spec_judge(spec_path: str | Path) -> Judge:
    """The spec's pipeline with its evaluation transforms (no randomness), as training decodes."""
    spec = load_spec(spec_path)
    pipeline = Pipeline(spec.preprocess, spec.data)

    def judge(raw: RawBatch) -> None:
        pipeline(raw, np.random.default_rng(spec.seed), train=False)

    return judge


def judge_for(path_or_spec: str) -> Judge:
    """`spec_judge` for ``*.yaml``/``*.yml`` files, `decode_only` for a data set's path."""
    if Path(path_or_spec).suffix.lower() in SPEC_SUFFIXES:
        return spec_judge(path_or_spec)
    return decode_only


def _judged(reader: Reader, indices: np.ndarray, judge: Judge) -> str | None:
    """None when the samples at `indices` read and pass `judge`, else the first failure's line."""
    try:
        judge(reader.read(indices))
    except UserError as exc:
        return str(exc)
    return None


def check_samples(reader: Reader, judge: Judge, progress: Callable[[int, int], None] = lambda done, bad: None,
                  block: int = BLOCK) -> CheckResult:
    """Read and judge every sample of `reader`, in blocks; `progress(done, bad)` after each."""
    bad: list[str] = []
    total = len(reader)
    for start in range(0, total, block):
        indices = np.arange(start, min(start + block, total))
        if _judged(reader, indices, judge) is not None:  # again one at a time, to name each bad one
            bad += [line for j in range(len(indices)) if (line := _judged(reader, indices[j : j + 1], judge))]
        progress(int(indices[-1]) + 1, len(bad))
    return CheckResult(total, tuple(bad))


class CheckProgress:
    """A bar on a terminal; elsewhere (a batch log) a line every `every_s` seconds, on `stream`."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, every_s: float = PROGRESS_EVERY_S):
        self.total, self.stream, self.every_s = total, stream, every_s
        self.bar = progress_bar(total, "check") if stream.isatty() else None
        self.shown, self.last = 0, time.monotonic()

    def __call__(self, done: int, bad: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.shown)
            self.bar.set_postfix(bad=bad, refresh=False)
        elif time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            print(f"fleet: checked {done} of {self.total} samples ({bad} bad)", file=self.stream, flush=True)
        self.shown = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
