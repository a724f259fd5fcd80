"""A run's predicted makespan and its range, from the rate table it plans with (pure).

A job records what it expected before it spends the allocation, so that what happened can be
set beside it (results.json's ``prediction``): the policy's simulated makespan on the run's
scenario, and a range from the rates' uncertainty -- the 10th and 90th percentiles of the
makespan over simulations whose per-model rates are the table's times a factor drawn from
U(1 - spread, 1 + spread). A measured profile is good to a few percent on the machine that
measured it; rates estimated from FLOPs are rougher. The policy plans with the table in each
draw, as the run will, so the draws also pay for planning on wrong rates: the range lies
mostly above the simulated makespan, not around it. The range covers the rates only: costs
the simulator does not model (start-up, the validation pass, a node's cores shared by decoding
and training) are what the measured makespan will show beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from fleet.schedule._base import Policy
from fleet.schedule.costs import Overheads
from fleet.schedule.early_stop import EarlyStopSettings
from fleet.schedule.rates import ModelProfile, RateTable
from fleet.schedule.scenario import Scenario
from fleet.schedule.sim_records import Timeline
from fleet.schedule.simulator import simulate

MEASURED_SPREAD = 0.1
"""Per-model rate uncertainty of a profile measured on the run's machine."""
ESTIMATED_SPREAD = 0.5
"""Per-model rate uncertainty of rates estimated from FLOPs per sample."""


@dataclass(frozen=True)
class RunForecast:
    """What a run expects of itself before it starts.

    Attributes:
        policy: the policy the run runs.
        makespan_s: its simulated makespan on the run's scenario, seconds.
        low_s, high_s: the 10th and 90th percentiles over `draws` simulations with rates
            scaled per model by U(1 - spread, 1 + spread) (both `makespan_s` without draws).
        spread: the per-model rate uncertainty of the draws.
        draws: simulations made for the range (fewer than asked when they ran past their time).
        candidates: ``policy: auto``'s predicted makespan of each candidate ({} otherwise).
        timeline: the simulated run's rounds and members (the predicted Gantt).
    """

    policy: str
    makespan_s: float
    low_s: float
    high_s: float
    spread: float
    draws: int
    candidates: dict[str, float] = field(default_factory=dict)
    timeline: Timeline | None = None

    def to_record(self) -> dict:
        return {"policy": self.policy, "makespan_s": self.makespan_s, "range_s": [self.low_s, self.high_s],
                "rate_spread": self.spread, "draws": self.draws, "candidates": dict(self.candidates)}

    def gantt_record(self) -> dict:
        """The predicted Gantt (forecast.json): every member's stay on its GPUs, seconds from
        the run's first step, and the rounds."""
        timeline = self.timeline
        members = [{"model": m.model, "round": m.round, "gpus": list(m.gpus), "launched": m.launched,
                    "start": m.start, "end": m.end,
                    "released": m.released, "outcome": m.outcome.value, "epochs": [m.epochs_start, m.epochs_end]}
                   for m in (timeline.members if timeline else ())]
        rounds = [{"index": r.index, "start": r.start, "end": r.end} for r in (timeline.rounds if timeline else ())]
        return {"schema": 1, **self.to_record(), "members": members, "rounds": rounds}


def scaled_rates(rates: RateTable, factors: np.ndarray) -> RateTable:
    """`rates` with model i's rates times ``factors[i]``."""
    models = tuple(ModelProfile(p.id, tuple(r * float(f) for r in p.rates), p.epochs, p.param_bytes, p.extra)
                   for p, f in zip(rates.models, factors))
    return RateTable(models, rates.gpus_per_node, rates.samples_per_epoch, rates.extra)


def forecast_run(make_policy: Callable[[], Policy], scenario: Scenario, overheads: Overheads, spread: float,
                 draws: int = 8, seed: int = 0, budget_s: float = 10.0, early_stop: EarlyStopSettings | None = None,
                 candidates: dict[str, float] | None = None) -> RunForecast:
    """The forecast of running `make_policy()`'s policy on `scenario` (`candidates`: ``policy:
    auto``'s prediction for each). The draws stop once they have taken `budget_s` seconds (a
    large ensemble's simulations are slow)."""
    name = make_policy().name
    expected = simulate(make_policy(), scenario, overheads, early_stop=early_stop)
    makespan_s = expected.makespan
    rng = np.random.default_rng(seed)
    spans, began = [], time.monotonic()
    for _ in range(draws):
        if spans and time.monotonic() - began > budget_s:
            break
        factors = rng.uniform(1.0 - spread, 1.0 + spread, len(scenario.rates.models))
        planned = scenario.planning_rates or scenario.rates  # the policy plans with the table; the truth differs
        noisy = replace(scenario, rates=scaled_rates(scenario.rates, factors), planning_rates=planned)
        spans.append(simulate(make_policy(), noisy, overheads, early_stop=early_stop).makespan)
    low, high = (float(np.percentile(spans, 10)), float(np.percentile(spans, 90))) if spans else (makespan_s,) * 2
    return RunForecast(name, float(makespan_s), low, high, spread, len(spans), dict(candidates or {}),
                       expected.timeline)
