"""Telling a Ctrl-C from a `KeyboardInterrupt` that user code raised itself.

`install` (the CLI does, in the main thread) replaces Python's SIGINT handler with one that
notes the signal before raising `KeyboardInterrupt` as the default handler does. Code that
runs a user's functions then asks `pressed()`: a `KeyboardInterrupt` with no SIGINT noted came
from the user's code, and is reported as that code's error rather than as an interruption.
Where the handler is not installed (fleet used as a library), every `KeyboardInterrupt` counts
as pressed.
"""

from __future__ import annotations

import signal
import threading

_noted = threading.Event()


def _on_sigint(signum, frame) -> None:
    _noted.set()
    raise KeyboardInterrupt


def install() -> None:
    """Note SIGINT before it interrupts, from now on (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is threading.main_thread():
        _noted.clear()
        signal.signal(signal.SIGINT, _on_sigint)


def pressed() -> bool:
    """Whether a `KeyboardInterrupt` now may come from a Ctrl-C (SIGINT) rather than from code."""
    return _noted.is_set() or signal.getsignal(signal.SIGINT) is not _on_sigint
