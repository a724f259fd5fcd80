"""How a bundle trains (issue 49): fused, or its models one after another on each batch.

A bundle's models share one stream and one trainer either way: **fused** (one forward and
backward of all of them over the batch, `FusedTorchEngine`) or **one by one** (each model's own
engine stepped in turn on the batch, `SequentialBundle`). Each model sees the same batches and
ends with the same weights either way (within float rounding; the engines' states are the same
bytes), so the only difference is speed: fused pays on a GPU, which one small model leaves
mostly idle; on a CPU the fused model does its models' work one after another plus the layout
changes of its vectorised operators, and is often slower.

`runtime.fuse: auto` measures it on the bundle's own trainer (`WayTrial`): from a bundle's first
step, `TRIAL_WARMUP` untimed and then `TRIAL_STEPS` timed steps one by one, then the same fused,
each step a real step on the stream's next batch (every model trains on every batch once,
whichever way). The medians decide (`kept_way`: fused where it is at least `min_speedup` times
faster), and the bundle trains the kept way from then on. The decision (`WayDecision`) is
recorded (events.jsonl's ``bundle_decided``) and a resumed job reuses it for the same models or
what is left of them (`recorded_decision`) instead of timing again; the planner plans the
bundle at the kept way's measured rate (`decided_factors`).
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet.schedule.bundling import bundle_rate
from fleet.schedule.rates import RateTable

TRIAL_WARMUP = 2
"""Untimed steps of each way before its timed ones (the first steps of new engines allocate)."""

TRIAL_STEPS = 6
"""Timed steps of each way (on whole batches); the median counts."""


class Way(str, enum.Enum):
    """How a bundle's step trains its models."""

    FUSED = "fused"
    ONE_BY_ONE = "one_by_one"


TRIAL_ORDER = (Way.ONE_BY_ONE, Way.FUSED)
"""The ways in the order a trial times them (fused last: on a GPU, where it is kept, the trial
ends on the engine it keeps)."""


def kept_way(fused_step_s: float, one_by_one_step_s: float, min_speedup: float = 1.0) -> Way:
    """Fused where its step is at least `min_speedup` times faster than the models' steps one by
    one (``one_by_one_step_s >= min_speedup * fused_step_s``), else one by one."""
    return Way.FUSED if one_by_one_step_s >= min_speedup * fused_step_s else Way.ONE_BY_ONE


@dataclass(frozen=True)
class WayDecision:
    """What a bundle's trial measured and kept.

    Attributes:
        models: the bundle's models when it was timed.
        fused_step_s: the median seconds of a fused step of all of them.
        one_by_one_step_s: the median seconds of a step of each of them, one after another.
        kept: the way it trains from then on.
    """

    models: tuple[str, ...]
    fused_step_s: float
    one_by_one_step_s: float
    kept: Way

    def step_s(self, count: int) -> float:
        """Seconds of a step of the kept way for `count` of its models (its models' even share,
        `count` times: what a bundle of what is left of them takes)."""
        seconds = self.fused_step_s if self.kept is Way.FUSED else self.one_by_one_step_s
        return seconds / len(self.models) * count

    def record(self) -> dict:
        """The decision as its ``bundle_decided`` event's fields."""
        return {"models": list(self.models), "fused_step_s": self.fused_step_s,
                "one_by_one_step_s": self.one_by_one_step_s, "kept": self.kept.value}

    @classmethod
    def from_record(cls, record: Mapping) -> WayDecision:
        """A decision from its event's fields (`record`).

        Raises:
            KeyError, ValueError, TypeError: a record without them.
        """
        return cls(tuple(str(m) for m in record["models"]), float(record["fused_step_s"]),
                   float(record["one_by_one_step_s"]), Way(record["kept"]))


def recorded_decision(decisions: Iterable[WayDecision], models: Sequence[str]) -> WayDecision | None:
    """The newest of `decisions` (in the order made) about a bundle that held every one of
    `models` (the same bundle, or what is left of it), else None."""
    wanted = set(models)
    found = None
    for decision in decisions:
        if wanted <= set(decision.models):
            found = decision
    return found


def decided_factors(rates: RateTable, models: Sequence[str], decision: WayDecision,
                    batch_size: int) -> dict[str, float]:
    """Per model of a bundle, the factor by which its rate is scaled so that the bundle's rate
    (`bundle_rate`: one step costs the sum of its models' steps) becomes the kept way's measured
    one: `batch_size` samples per kept step of these models."""
    measured = batch_size / decision.step_s(len(models))
    factor = measured / bundle_rate(rates, models)
    return {model: factor for model in models}


class WayTrial:
    """A bundle's trial of both ways (see the module docstring): which way its next step trains,
    from the times of the steps done so far, until it decides.

    Args:
        models: the bundle's models.
        min_speedup: `kept_way`'s.
        warmup: untimed steps of each way before its timed ones.
        steps: timed steps of each way.
    """

    def __init__(self, models: Sequence[str], min_speedup: float = 1.0, warmup: int = TRIAL_WARMUP,
                 steps: int = TRIAL_STEPS):
        self.min_speedup, self.warmup, self.steps = min_speedup, warmup, steps
        self.restart(models)

    @property
    def way(self) -> Way:
        """The way the next step trains."""
        return TRIAL_ORDER[self.phase]

    def restart(self, models: Sequence[str]) -> None:
        """Time both ways again from the first, for `models` (a model left mid-trial: the steps
        timed so far trained more)."""
        self.models = tuple(models)
        self.phase, self.untimed = 0, 0
        self.times: dict[Way, list[float]] = {way: [] for way in TRIAL_ORDER}

    def stepped(self, seconds: float, whole: bool) -> WayDecision | None:
        """A step of `way` took `seconds` (`whole`: on a whole batch; only those are timed).
        Returns the decision once both ways are timed, else None."""
        if self.untimed < self.warmup:
            self.untimed += 1
            return None
        times = self.times[self.way]
        if whole:
            times.append(seconds)
        if len(times) < self.steps:
            return None
        if self.phase + 1 < len(TRIAL_ORDER):
            self.phase, self.untimed = self.phase + 1, 0
            return None
        fused = statistics.median(self.times[Way.FUSED])
        one_by_one = statistics.median(self.times[Way.ONE_BY_ONE])
        return WayDecision(self.models, fused, one_by_one, kept_way(fused, one_by_one, self.min_speedup))
