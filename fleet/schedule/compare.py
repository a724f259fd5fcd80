"""Side-by-side comparison of policies on one ensemble: the numbers behind ``fleet simulate``.

For each GPU count and seed, every policy is simulated on the same scenario; Baseline and
Homogeneous are always run as references (`mop`, Cerebro's scheduler, on partitioned data). Rows carry the raw numbers; :func:`summarize`
averages them over seeds (speedups are averaged per seed, as ratios of the same scenario).

``auto`` runs as ``policy: auto`` does (`fleet.schedule.adapting.simulate_auto`): the candidate
predicted first on the planning rates, handing over to another where measured rates say so.
With ``adapt``, every policy weighs the rates it measures, as the runtime does (the scenario's
true ``rates`` where it plans with ``planning_rates``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fleet.schedule.adapting import simulate_auto, simulation_adapter
from fleet.schedule.bounds import lower_bounds
from fleet.schedule.choice import AUTO
from fleet.schedule.costs import Overheads
from fleet.schedule.early_stop import EarlyStopSettings
from fleet.schedule.planners import create_policy
from fleet.schedule.sim_records import GpuTime, SimResult, SwitchRecord
from fleet.schedule.scenario import Scenario
from fleet.schedule.simulator import simulate

REFERENCES = ("baseline", "homogeneous")
HOPPING_REFERENCES = ("mop",)


def references(scenario: Scenario) -> tuple[str, ...]:
    """The reference policies of a scenario: those that can run on its data."""
    return HOPPING_REFERENCES if scenario.partition_sizes else REFERENCES


@dataclass(frozen=True)
class Row:
    """One simulated run of one policy.

    Attributes:
        gpus: ``M``.
        policy: policy name.
        seed: seed of the scenario and of the policy.
        makespan: seconds.
        lb1, lb2: the lower bounds of the scenario, seconds.
        rounds: rounds of the run.
        mean_gpu_wait: mean idle seconds per GPU.
        decoded_ratio: samples decoded relative to Baseline (``sum_i E_i n``).
        plan_ms: mean planning time per planning call, milliseconds.
        plan_ms_max: longest planning call, milliseconds.
        checkpoints: model checkpoints taken.
        gpu_time: GPU-seconds by activity.
        speedup_baseline, speedup_homogeneous, speedup_mop: reference makespan / this
            makespan (NaN where the reference cannot run on the scenario's data).
        hops: visits of partitioned data that ended with a hop.
        chosen: for ``auto``, the policy it chose first; else the policy.
        switches: the policy switches ``auto`` made.
        model_epochs: epochs the models trained, all together.
        gpu_hours: GPU-hours the models held (the run's GPUs x makespan, less idle time).
        early_stop: the early-stopping method the run used ("" for none).
    """

    gpus: int
    policy: str
    seed: int
    makespan: float
    lb1: float
    lb2: float
    rounds: int
    mean_gpu_wait: float
    decoded_ratio: float
    plan_ms: float
    plan_ms_max: float
    checkpoints: int
    gpu_time: GpuTime
    speedup_baseline: float = float("nan")
    speedup_homogeneous: float = float("nan")
    speedup_mop: float = float("nan")
    hops: int = 0
    chosen: str = ""
    switches: tuple[SwitchRecord, ...] = ()
    model_epochs: float = 0.0
    gpu_hours: float = 0.0
    early_stop: str = ""


ScenarioFactory = Callable[[int, int], Scenario]
"""``(total_gpus, seed) -> Scenario``."""


def compare(
    scenarios: ScenarioFactory,
    gpu_counts: Sequence[int],
    policies: Sequence[str],
    seeds: Iterable[int],
    overheads: Overheads = Overheads(),
    adapt: bool = False,
    early_stop: Callable[[Scenario], EarlyStopSettings] | None = None,
) -> list[Row]:
    """Simulate every policy (and the references) for every GPU count and seed; with `adapt`,
    each run weighs the rates it measures; with `early_stop` (the settings for a scenario), each
    policy runs once more with them (rows ``policy+method``; the references without)."""
    rows: list[Row] = []
    for gpus in gpu_counts:
        for seed in seeds:
            scenario = scenarios(gpus, seed)
            runs = list(dict.fromkeys([*policies, *references(scenario)]))
            bounds = lower_bounds(scenario.rates, scenario.true_epochs, gpus)
            results = {name: run_policy(name, scenario, overheads, seed, adapt) for name in runs}
            refs = {name: results[name][0].makespan for name in references(scenario)}
            for name in policies:
                rows.append(_row(name, *results[name], scenario, seed, bounds.lb1, bounds.lb2, refs))
                if early_stop is not None:
                    method = early_stop(scenario)
                    stopped = run_policy(name, scenario, overheads, seed, adapt, method)
                    rows.append(replace(_row(name, *stopped, scenario, seed, bounds.lb1, bounds.lb2, refs),
                                        policy=f"{name}+{method.method}", early_stop=method.method))
    return rows


def run_policy(name: str, scenario: Scenario, overheads: Overheads, seed: int, adapt: bool = False,
               early_stop: EarlyStopSettings | None = None) -> tuple[SimResult, str]:
    """One simulated run of the policy `name` (or ``auto``), its policies seeded with `seed`,
    and the policy it started with (``auto``'s choice; else `name`)."""

    def named(policy: str):
        return create_policy(policy, seed=seed)

    if name == AUTO:
        choice, result = simulate_auto(named, scenario, overheads, early_stop=early_stop)
        return result, choice.name
    adapter = simulation_adapter(named) if adapt else None
    return simulate(named(name), scenario, overheads, adapt=adapter, early_stop=early_stop), name


def summarize(rows: Sequence[Row]) -> list[dict]:
    """Mean over seeds per (GPU count, policy), in the order rows first appear."""
    groups: dict[tuple[int, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.gpus, row.policy), []).append(row)
    out = []
    for (gpus, policy), group in groups.items():

        def mean(metric, group=group) -> float:
            return float(np.mean([metric(r) for r in group]))

        out.append(
            {
                "gpus": gpus,
                "policy": policy,
                "seeds": len(group),
                "makespan_s": mean(lambda r: r.makespan),
                "speedup_baseline": mean(lambda r: r.speedup_baseline),
                "speedup_homogeneous": mean(lambda r: r.speedup_homogeneous),
                "speedup_mop": mean(lambda r: r.speedup_mop),
                "hops": mean(lambda r: r.hops),
                "makespan_lb2": mean(lambda r: r.makespan / r.lb2),
                "makespan_lb2_max": max(r.makespan / r.lb2 for r in group),
                "makespan_lb1": mean(lambda r: r.makespan / r.lb1),
                "rounds": mean(lambda r: r.rounds),
                "mean_gpu_wait_s": mean(lambda r: r.mean_gpu_wait),
                "decoded_vs_baseline": mean(lambda r: r.decoded_ratio),
                "decoded_vs_baseline_max": max(r.decoded_ratio for r in group),
                "plan_ms": mean(lambda r: r.plan_ms),
                "plan_ms_max": max(r.plan_ms_max for r in group),
                "checkpoints": mean(lambda r: r.checkpoints),
                "model_epochs": mean(lambda r: r.model_epochs),
                "gpu_hours": mean(lambda r: r.gpu_hours),
                "chosen": sorted({r.chosen for r in group}),
                "switches": [[{"at_s": w.at, "from": w.current, "to": w.to} for w in r.switches] for r in group],
                "gpu_time": {
                    k: mean(lambda r, k=k: getattr(r.gpu_time, k))
                    for k in ("training", "pacing", "overhead", "idle")
                },
            }
        )
    return out


def _row(name: str, result: SimResult, chosen: str, scenario: Scenario, seed: int, lb1: float, lb2: float, refs: dict) -> Row:
    trained = sum(scenario.true_epochs) * scenario.rates.samples_per_epoch
    planning = result.planning_s or (0.0,)
    return Row(
        gpus=result.total_gpus,
        policy=name,
        chosen=chosen,
        switches=result.switches,
        seed=seed,
        makespan=result.makespan,
        lb1=lb1,
        lb2=lb2,
        rounds=result.rounds,
        mean_gpu_wait=result.mean_gpu_wait,
        decoded_ratio=result.samples_decoded / trained,
        plan_ms=1000 * float(np.mean(planning)),
        plan_ms_max=1000 * max(planning),
        checkpoints=result.checkpoints,
        gpu_time=result.gpu_time,
        speedup_baseline=refs.get("baseline", float("nan")) / result.makespan,
        speedup_homogeneous=refs.get("homogeneous", float("nan")) / result.makespan,
        speedup_mop=refs.get("mop", float("nan")) / result.makespan,
        hops=result.hops,
        model_epochs=float(sum(result.epochs_trained)),
        gpu_hours=(result.total_gpus * result.makespan - result.gpu_time.idle) / 3600,
    )
