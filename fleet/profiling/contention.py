"""How much slower a CPU node's cores work the more threads take turns on them (pure).

A model's steps on a CPU node cost more CPU time per sample beside other busy ranks than with
cores to spare: each switch between threads leaves the next one cold caches. Runs on a 2-core
VM measured a model alone 1.25-1.35 times as fast, in CPU time, as beside three others. The
profile and the timed steps measure every model beside the others of its wave, so their rates
are the slow ones, and the simulator speeds a node's work up where its load is lower
(`fleet.schedule.cores.SharedCores.contention`).

The probe: one model timed on every trainer of a machine at once, then alone. Its slope is
the part the CPU time per sample grew by, per unit of load per core above one:
``(alone / beside - 1) / (load - 1)``, the load being the busy trainers' cores over the
machine's. It is written to the profile's ``hardware.contention``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.schedule.rates import is_number, is_positive_number

MIN_LOAD = 1.25
"""Load per core below which the probe measures nothing (the cores hardly switch)."""
MAX_SLOPE = 2.0
"""A slope above this is taken as noise of the probe's few steps, and capped."""
PROBE_SECONDS = 0.5
"""CPU seconds of steps the probe times at least, alone (a fast model's 20 steps take a few ms,
shorter than the turns its threads take on a core)."""


def probe_model(rates: Mapping[str, float]) -> str | None:
    """The model the probe times: the median of `rates` (one trainer's samples/s), so that
    the probe takes neither long nor too few CPU seconds to time; None without rates."""
    timed = sorted((rate, model) for model, rate in rates.items() if is_positive_number(rate))
    return timed[len(timed) // 2][1] if timed else None


def probe_steps(rate: float, batch_size: int, timed: int) -> int:
    """Steps the probe times of a model of `rate` samples/s at `batch_size`: `timed`, or more
    where they take less than `PROBE_SECONDS`."""
    return max(timed, math.ceil(PROBE_SECONDS * rate / max(1, batch_size))) if is_positive_number(rate) else timed


def busiest_host(trainer_hosts: Sequence[str]) -> list[int]:
    """The trainers (indices into `trainer_hosts`, each trainer's host) of the host that has
    the most of them: the probe loads one machine."""
    counts: dict[str, int] = {}
    for host in trainer_hosts:
        counts[host] = counts.get(host, 0) + 1
    if not counts:
        return []
    host = max(counts, key=lambda h: (counts[h], h))
    return [k for k, h in enumerate(trainer_hosts) if h == host]


def probe_load(trainers: int, threads: float, cores: float) -> float:
    """Load per core of `trainers` busy trainers of `threads` threads each on `cores` cores."""
    return trainers * min(threads, cores) / cores if cores > 0 else 0.0


def slope(alone: float, beside: Sequence[float], load: float) -> float | None:
    """The probe's slope (see the module) from its rate `alone` and its rates `beside` each
    other at `load`; None where the load is too low to tell or a rate is missing."""
    rates = [r for r in beside if is_positive_number(r)]
    if load < MIN_LOAD or not rates or not is_positive_number(alone):
        return None
    grown = alone / statistics.median(rates) - 1.0
    return min(MAX_SLOPE, max(0.0, grown / (load - 1.0)))


def record(model: str, alone: float, beside: Sequence[float], load: float) -> dict[str, Any]:
    """``hardware.contention`` of a profile: what the probe timed and its slope."""
    found = slope(alone, beside, load)
    block: dict[str, Any] = {"model": model, "load": round(load, 4), "alone_rate": round(alone, 2),
                             "beside_rates": [round(r, 2) for r in beside]}
    if found is not None:
        block["slope"] = round(found, 4)
    return block


def read(hardware: Any) -> tuple[float, float] | None:
    """``(slope, load)`` from a profile's hardware block; None where it has no usable probe."""
    block = hardware.get("contention") if isinstance(hardware, Mapping) else None
    if not isinstance(block, Mapping):
        return None
    found, load = block.get("slope"), block.get("load")
    if not (is_number(found) and 0 <= found <= MAX_SLOPE):
        return None
    if not (is_positive_number(load) and load >= MIN_LOAD):
        return None
    return float(found), float(load)
