"""Argument types shared by the commands: each rejects bad text with a one-line message.

Used as ``parser.add_argument("--gpus", type=positive_int_list)``; argparse reports the
failure as ``fleet plan: error: argument --gpus: expected ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def non_negative_int(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """``"20,40,60"`` -> ``[20, 40, 60]``."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return [int(p) for p in parts]


def one_of(valid: Sequence[str]) -> Callable[[str], str]:
    """A name from `valid`; the message lists the valid ones."""
    def parse(text: str) -> str:
        if text not in valid:
            raise argparse.ArgumentTypeError(f"unknown {text!r}; valid: {', '.join(valid)}")
        return text

    return parse


def names_of(valid: Sequence[str]) -> Callable[[str], list[str]]:
    """``"a,b"`` -> ``["a", "b"]``, each from `valid`."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"expected at least one name; valid: {', '.join(valid)}")
        for name in names:
            one_of(valid)(name)
        return names

    return parse


CALIBRATE_HELP = ("predict and plan with the rates and costs that the run in DIR (a finished fleet run of the "
                  "same models) measured; a resumed job learns from its own run directory")
