"""What rank 0 prints while a run goes: round banners, a line per model epoch, the summary."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from fleet.report.table import format_gpus


SLOT_NAMES = {"cuda": "GPU", "cpu": "cpu slot", "emulated": "emulated GPU"}


class Console:
    """Prints on rank 0 only; `quiet` keeps banners and the summary (for batch logs).

    `device` (``cuda``, ``cpu``, ``emulated``) names the trainer slots: ``GPU 0-1``, or
    ``cpu slot 0-1`` where a slot is a CPU process.
    """

    def __init__(self, quiet: bool = False, stream: TextIO = sys.stdout, device: str = "cuda"):
        self.quiet, self.stream = quiet, stream
        self.slot = SLOT_NAMES.get(device, "GPU")
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
            self._print(f"   {model:<18} {how} on {self.slot} {format_gpus(gpus)} (stream {stream})")

    def bundle(self, models: tuple[str, ...], gpus: tuple[int, ...], key: str) -> None:
        """A bundle starts: its models train as one fused model on one trainer slot."""
        if not self.quiet:
            self._print(f"   bundle of {len(models)} on {self.slot} {format_gpus(gpus)}: {', '.join(models)} "
                        f"train as one fused model ({key})")

    def shared_stream(self, stream: int, models: list[str]) -> None:
        """A new stream of several models: they share one decoded sample stream."""
        if not self.quiet and len(models) > 1:
            self._print(f"   stream {stream}: {len(models)} models share one decoded stream: {', '.join(models)}")

    def epoch(self, model: str, epoch: int, loss: float, accuracy: float, rate: float, stream_rate: float) -> None:
        if not self.quiet:
            self._print(
                f"   {model:<18} epoch {epoch:>3}  loss {loss:7.4f}  val acc {accuracy:6.3f}  "
                f"{rate:9,.0f} samples/s (stream {stream_rate:,.0f})"
            )

    def left(self, model: str, text: str) -> None:
        if not self.quiet:
            self._print(f"   {model:<18} {text}")
