"""What rank 0 prints while a run goes: round banners, a line per model epoch, the summary."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from fleet.report.table import format_gpus


class Console:
    """Prints on rank 0 only; `quiet` keeps banners and the summary (for batch logs)."""

    def __init__(self, quiet: bool = False, stream: TextIO = sys.stdout):
        self.quiet, self.stream = quiet, stream
        self.started = time.monotonic()

    def _print(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:8.1f}s] {text}", file=self.stream, flush=True)

    def banner(self, text: str) -> None:
        self._print(f"== {text} ==")

    def info(self, text: str) -> None:
        self._print(text)

    def member(self, model: str, gpus: tuple[int, ...], stream: int, resume: bool) -> None:
        if not self.quiet:
            how = "resumes" if resume else "starts"
            self._print(f"   {model:<18} {how} on GPU {format_gpus(gpus)} (stream {stream})")

    def epoch(self, model: str, epoch: int, loss: float, accuracy: float, rate: float, stream_rate: float) -> None:
        if not self.quiet:
            self._print(
                f"   {model:<18} epoch {epoch:>3}  loss {loss:7.4f}  val acc {accuracy:6.3f}  "
                f"{rate:9,.0f} samples/s (stream {stream_rate:,.0f})"
            )

    def left(self, model: str, text: str) -> None:
        if not self.quiet:
            self._print(f"   {model:<18} {text}")
