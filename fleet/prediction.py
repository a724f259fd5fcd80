"""Runs predicted from a profile: the plan the spec's policy makes, makespans per policy, the
preprocessors a plan needs, and the dry run's report (plan, predictions, a what-if over GPU
counts).

Everything here is predicted by the simulator from ``profile.json`` (the measured rates)
and each model's epochs (``max_epochs``, or the profile's ``epochs`` where a user put one).
It sits below the runtime and the profiler: `fleet plan`, `fleet profile`, `fleet submit` and
the end of a job (`fleet.runtime.finish`) read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from fleet.errors import UserError
from fleet.profiling.document import (decode_rates, epochs_estimate, join_samples, measured_saves, preprocessor_count,
                                     stream_demand, summarize_failures)
from fleet.profiling.plan import needed_preprocessors
from fleet.report.gantt import write_gantt
from fleet.report.plan_text import render_plan
from fleet.report.table import format_duration, format_table
from fleet.schedule import RateTable, lower_bounds, simulate, whole_epochs
from fleet.schedule.choice import AUTO, CANDIDATES, PREDICTION_COSTS, pick
from fleet.schedule.cores import ASSUMED_SHARE, ASSUMED_TRAINER_OVERHEAD_S
from fleet.schedule.early_stop import rung_epochs
from fleet.schedule.epoch_ends import validation_per_sample, with_epoch_ends
from fleet.schedule.planners import GROUP_POLICIES, HOPPING_POLICIES
from fleet.schedule.grouping import with_groups
from fleet.spec.search import searches_of
from fleet.schedule_io import load_profile, pilot_calibration, plan_document, profile_scenario, write_json
from preprocess.grouped import epoch_scales
from preprocess.partition import job_partitions

POLICIES = ("fleet-g", "fleet-l", "baseline", "homogeneous")
CHECKPOINT_LATENCY_S = PREDICTION_COSTS.latency_s  # modelled: 0.5 s + 3 x parameter bytes at 1 GB/s per checkpoint


def epoch_equivalent(table: RateTable, scales: Mapping[str, float], groups: Mapping[str, str] | None = None) -> RateTable:
    """`table` with each model's rates times its epoch scale (`scales`, 1 for a model not in
    it) and each model of `groups` told its group (`fleet.schedule.grouping.with_groups`):
    models of groups (`data.group_by`) train an epoch of their group's n_g samples, and the
    planners, the ledger and the forecasts count every epoch as `samples_per_epoch` (N), so their
    rates times N / n_g make an epoch last n_g / r; the grouped policies keep each group's models
    in streams of their own. Profiles and measured rates stay in real samples/s; the
    coordinator scales each measured rate before the driver hears it."""
    return with_groups(table, scales, groups)


def planned_rates(rates: RateTable, spec, calibration, scales: Mapping[str, float]) -> RateTable:
    """`rates` (real samples/s) as predictions and plans take them: each model's epochs' ends
    in its rates as the profile or the timed steps timed them (`with_epoch_ends`; where
    `calibration` measured their share, it lowers the rates instead), and models of groups
    epoch-equivalent (`epoch_equivalent`, by `scales`)."""
    if calibration is None or not calibration.epoch_end_share:
        rates = with_epoch_ends(rates, validation_per_sample(spec.data.val_fraction, spec.data.test_fraction), scales)
    return epoch_equivalent(rates, scales, model_groups(spec))


def lead_samples(spec) -> float:
    """How far a member of a stream runs ahead of its slowest member (`Scenario.lead_samples`):
    the chunks decoded but not yet released by every member -- the slowest member's Qp and Qt
    (`runtime.qp_samples`, `runtime.qt_samples`) and the preprocessors' window in flight (about
    one Qp again). Where an epoch is many times this, members move nearly in lockstep; on a
    small data set they train apart, each at its own pace."""
    return 2.0 * spec.runtime.qp_samples + spec.runtime.qt_samples


def model_groups(spec) -> dict[str, str]:
    """Each model's id and the raw key of its group ({} without `data.group_by`): results.json's
    ``groups``, and what the planners are told."""
    return {m.id: m.group for m in spec.models if m.group is not None}


def _scenario(rates, spec, gpus: int, epochs: Mapping[str, float] | None = None):
    """The run to predict: the spec's epochs (a model's `epochs` where given), decoding
    limited to what the spec's preprocessors were measured to decode (when the profile measured
    it), partitioned data on its nodes (`gpus` must then fit them), models of groups at their
    epoch-equivalent rates, and what the profile's pilot run measured where it has one."""
    calibration = pilot_calibration(rates, spec.cluster.device.value)
    rates = planned_rates(rates, spec, calibration, epoch_scales(spec))
    estimates = tuple(float((epochs or {}).get(p.id) or e) for p, e in zip(rates.models, epochs_estimate(rates, spec)))
    per_node = spec.cluster.preprocessors_per_node
    scenario = with_partitions(profile_scenario(rates, whole_epochs(estimates), estimates, gpus, per_node,
                                                spec.cluster.virtual_nodes), spec)
    scenario = replace(scenario, lead_samples=lead_samples(spec))
    if calibration is None:
        return scenario
    return calibration.scenario(scenario, preprocessor_count(per_node, rates.extra, scenario.cluster.nodes))


def with_partitions(scenario, spec):
    """`scenario` on the spec's partitioned data, where it has some (its GPUs must fit them).

    Raises:
        UserError: the partitions do not fit the scenario's nodes, or their manifest is unreadable.
    """
    rates = scenario.rates
    parts = job_partitions(spec.data, scenario.cluster.nodes, rates.gpus_per_node)
    if parts is None:
        return scenario
    scale = rates.samples_per_epoch / parts.samples  # a profile's epoch is every partition's training samples
    return replace(scenario, partition_sizes=tuple(s * scale for s in parts.sizes), partition_groups=parts.groups)


def candidates_for(spec) -> tuple[str, ...]:
    """The policies that can run the spec's data (``auto`` chooses among them): on grouped
    data, those that never share a stream between groups."""
    if spec.data.group_by is not None:
        return ("grouped",) if spec.data.partitioned else GROUP_POLICIES
    return HOPPING_POLICIES if spec.data.partitioned else CANDIDATES


def predict(spec, scenario, policies=POLICIES, early: bool = True) -> dict:
    """Simulated runs of `policies` and the spec's policy on `scenario` (``auto``: every policy
    it chooses from): ``{policy: SimResult}``; the spec's policy runs with the spec's options,
    the others with their defaults. On partitioned data, only the hopping policies run. With
    the spec's early stopping unless `early` is False (a scenario of the epochs models really
    trained)."""
    own = list(candidates_for(spec)) if spec.scheduler.policy == AUTO else [spec.scheduler.policy]
    if spec.data.partitioned or spec.data.group_by is not None:
        policies = [p for p in policies if p in candidates_for(spec)] or candidates_for(spec)
    return {name: simulate(spec.scheduler.create_policy(spec.seed, name), scenario, _prediction_costs(spec, scenario.rates),
                           early_stop=simulated_early_stop(spec) if early else None)
            for name in dict.fromkeys([*policies, *own])}


def costs_of(rates):
    """The checkpoint and restore costs of predictions on `rates` (as the profile measured its
    saves, else `PREDICTION_COSTS`) and a join's wait for its stream's chunks."""
    return replace(measured_saves(rates) or PREDICTION_COSTS, join_samples=join_samples(rates.extra))


def _prediction_costs(spec, rates):
    """The checkpoint, restore and start costs of the dry run's predictions: as the profile's
    pilot run measured them where it has one, else `costs_of`."""
    calibration = pilot_calibration(rates, spec.cluster.device.value)
    return calibration.overheads(costs_of(rates)) if calibration else costs_of(rates)


def costs_text(spec, rates) -> str:
    """How the predictions cost a checkpoint (and what calibrates them), for the dry run's heading."""
    calibration = pilot_calibration(rates, spec.cluster.device.value)
    if calibration is not None:
        return f"rates and costs calibrated by {calibration.source}"
    saves = measured_saves(rates)
    if saves is not None:
        return f"checkpoints as the profile measured them: {saves.latency_s:.3g} s each"
    return f"checkpoints modelled at {CHECKPOINT_LATENCY_S} s + parameters at 1 GB/s"


def unmeasured_share_lines(spec, rates, scenario) -> list[str]:
    """A note where the nodes' trainers and preprocessors want more than their CPU cores and
    nothing measured the part of them their work gets (`SharedCores.share`)."""
    cores, cluster = scenario.cores, spec.cluster
    if cores is None or not cores.trainer_cores:
        return []
    preprocessors = -(-preprocessor_count(cluster.preprocessors_per_node, rates.extra, cluster.nodes) // cluster.nodes)
    calibration = pilot_calibration(rates, cluster.device.value)
    if not cores.oversubscribed(cluster.gpus_per_node, preprocessors) or (calibration and calibration.core_share):
        return []
    return [f"note: {cluster.gpus_per_node} trainer slot(s) and {preprocessors} preprocessor(s) per node want more "
            f"than its {cores.cores:g} cores, and the part of them their work gets is not measured: these "
            f"predictions assume {ASSUMED_SHARE:g} of them, and {ASSUMED_TRAINER_OVERHEAD_S:.2g} core-s per sample "
            "outside the steps (as measured in bench/predict.py); `fleet profile --pilot 30` measures both"]


def simulated_early_stop(spec):
    """The spec's early stopping for the simulator (None without it): runs stop models at
    rungs, so predictions of them (the dry run, `policy: auto`, a run's forecast) do too."""
    settings = spec.early_stop_settings()
    return None if settings.method == "none" else settings


def spec_policy(spec, results: dict) -> str:
    """The policy the spec runs: its own, or the one ``auto`` chooses on `results` (`predict`'s)."""
    if spec.scheduler.policy != AUTO:
        return spec.scheduler.policy
    return pick({name: result.makespan for name, result in results.items()}, candidates_for(spec)).name


def dry_run(spec, run_dir: Path, what_if: tuple[int, ...] = ()) -> str:
    """Write plan.json and plan-gantt.png into `run_dir`; the report to print."""
    path = run_dir / "profile.json"
    rates = load_profile(path)
    gpus = spec.cluster.gpus
    scenario = _scenario(rates, spec, gpus)
    results = predict(spec, scenario)
    chosen = spec_policy(spec, results)
    lb2 = lower_bounds(scenario.rates, scenario.true_epochs, gpus).lb2
    plan = plan_document(results[chosen], rates.gpus_per_node, "max-epochs", lb2)
    write_json(run_dir / "plan.json", plan)
    gantt = run_dir / "plan-gantt.png"
    write_gantt(plan, str(gantt))
    lines = [render_plan(plan, rates, "max-epochs", run_dir / "plan.json").replace(
        "--max-epochs for every model", "each model's max_epochs")]
    lines += ["", f"wrote {gantt}", "", f"predicted on {gpus} GPUs ({costs_text(spec, rates)}):", _policy_table(results)]
    lines += unmeasured_share_lines(spec, rates, scenario)
    if spec.scheduler.policy == AUTO:
        lines.append("policy auto: " + pick({n: r.makespan for n, r in results.items()}, candidates_for(spec)).describe())
    lines += early_stop_lines(spec, scenario, chosen, results[chosen])
    lines += search_lines(rates.extra.get("searches") or searches_of(spec.models), rates)
    failures = rates.extra.get("failures", [])
    if failures:
        lines += ["", "left out of the plan (profiling failed):"] + [f"  {f}" for f in summarize_failures(failures)]
    block = rates.extra.get("preprocessing", {})
    needed = _preprocessors_needed(plan, rates, spec)
    if needed is not None:
        need, busiest = needed
        lines += ["", f"preprocessing: {_decode_line(block)}; the plan's busiest round consumes "
                  f"{busiest:,.0f} samples/s -> {need} preprocessor(s) per node needed "
                  f"(the spec has {spec.cluster.preprocessors_per_node}, profiled with {block.get('per_node')})"]
    if scenario.decode_rate is not None:
        lines += [decode_limit_line(scenario.decode_rate)]
    if what_if:
        lines += ["", "what if (predicted makespan and GPU-hours per allocation size):", _what_if(rates, spec, what_if)]
    return "\n".join(lines)


def search_lines(searches: Mapping[str, Mapping], rates) -> list[str]:
    """What a plan says of each adaptive search (none without one), one line each: its sampler,
    budget, ids and searched keys; the one-GPU rate its placeholders are planned at (the space's
    middle values) and, where `searches` (`fleet.inspect.search_costs`, as a profile keeps them
    under ``searches``) counted its architectures' FLOPs, the rates estimated for its smallest
    and largest (the planned rate times the middle's FLOPs over theirs, as an asked model is
    planned); and that the rest is decided while the run trains."""
    alike: dict[tuple[str, str], list[tuple[str, str, str]]] = {}  # one search over several groups: one line
    for name, facts in searches.items():
        first, last = facts["models"]
        planned = [rates.rate(m, 1) for m in (first, last) if m in rates.ids]
        what = f"sampler {facts['sampler']}, budget {facts['budget']}"
        tail = (f"over {', '.join(facts['space'])}; {_search_rates(facts, min(planned) if planned else None)}; "
                "which values each trains with, and so its rate and epochs, is decided while the run trains")
        alike.setdefault((what, tail), []).append((name, first, last))
    lines = []
    for (what, tail), studies in alike.items():
        (name, first, last), (end, _, _) = studies[0], studies[-1]
        if len(studies) == 1:
            lines.append(f"search {name}: {what} models ({first} ... {last}) {tail}")
        else:
            lines.append(f"searches {name} ... {end} (one study per group, {len(studies)}): {what} models each {tail}")
    return ["", *lines] if lines else []


def _search_rates(facts: Mapping, planned: float | None) -> str:
    """`search_lines`' word on a search's rates: planned, and over its architectures."""
    flops = facts.get("flops_per_sample")
    said = "no rate planned" if planned is None else f"planned at {planned:,.0f} samples/s on one GPU (middle values)"
    if flops is None:
        note = facts.get("flops_note")
        return said + (f"; its architectures' FLOPs not counted ({note})" if note else "")
    low, middle, high = (flops[k] / 1e6 for k in ("smallest", "middle", "largest"))
    if low == high:
        return f"{said}, one architecture ({middle:,.3g} MFLOPs/sample)"
    if planned is None:
        return f"{said}; architectures of {low:,.3g} ... {high:,.3g} MFLOPs/sample"
    return (f"{said}, estimated {planned * middle / high:,.0f} (largest architecture, {high:,.3g} MFLOPs/sample) ... "
            f"{planned * middle / low:,.0f} (smallest, {low:,.3g})")


def early_stop_lines(spec, scenario, chosen: str, result) -> list[str]:
    """The dry run's prediction with the spec's early stopping (none without it): `chosen`'s
    makespan, model-epochs and GPU-hours with it (`result`, `predict`'s) beside its run without
    it. Before training there are no learning curves: the simulator predicts how many models
    survive each rung from the rung arithmetic, not which, and says so."""
    settings = simulated_early_stop(spec)
    if settings is None:
        return []
    without = simulate(spec.scheduler.create_policy(spec.seed, chosen), scenario, _prediction_costs(spec, scenario.rates))

    def gpu_hours(run) -> float:
        return (run.total_gpus * run.makespan - run.gpu_time.idle) / 3600

    rows = [(label, format_duration(run.makespan), f"{sum(run.epochs_trained):,.0f}", f"{gpu_hours(run):,.2f}")
            for label, run in ((f"{chosen}, early stopping {settings.method}", result), (f"{chosen}, none", without))]
    return ["", f"early stopping ({settings.method}, {_rungs_text(settings)}): predicted from the rung arithmetic "
            "alone -- how many models go on past each rung, not which: no learning curves exist before training",
            format_table(("run", "makespan", "model-epochs", "GPU h"), rows)]


def _rungs_text(settings) -> str:
    if settings.method == "median":
        return f"each epoch from {max(1, settings.grace_epochs)} on, at least {settings.min_models} other models"
    rungs = ", ".join(str(r) for r in rung_epochs(settings.min_epochs, settings.reduction, settings.max_epochs))
    brackets = f"{settings.brackets} brackets, " if settings.method == "hyperband" else ""
    return f"{brackets}rungs at {rungs} epochs, keeping 1 in {settings.reduction:g}"


def planned(spec, rates, epochs: Mapping[str, float] | None = None) -> dict:
    """The spec's policy's predicted plan (a ``plan.json`` dict) at `rates`, each model
    training its `epochs` where given, else its max_epochs (or the profile's ``epochs``)."""
    results = predict(spec, _scenario(rates, spec, spec.cluster.gpus, epochs), policies=(), early=not epochs)
    result = results[spec_policy(spec, results)]
    return plan_document(result, rates.gpus_per_node, "given" if epochs else "max-epochs")


def predicted_makespans(spec, rates, policies=POLICIES) -> dict[str, float]:
    """The simulator's makespan of each of `policies` for `spec` at `rates` (with the decode
    limit the profile measured for the spec's preprocessors), in seconds."""
    results = predict(spec, _scenario(rates, spec, spec.cluster.gpus), policies)
    return {name: results[name].makespan for name in policies if name in results}


def preprocessors_for(spec, rates) -> tuple[int, float] | None:
    """(preprocessors per node, samples/s of the busiest round) that the spec's policy's
    predicted plan needs to keep its streams fed, from the profile's measured decoding; None
    when the profile measured none."""
    if not rates.extra.get("preprocessing", {}).get("samples_per_s"):
        return None
    results = predict(spec, _scenario(rates, spec, spec.cluster.gpus), policies=())
    result = results[spec_policy(spec, results)]
    return _preprocessors_needed(plan_document(result, rates.gpus_per_node, "max-epochs"), rates, spec)


def _preprocessors_needed(plan: dict, rates, spec) -> tuple[int, float] | None:
    measured = decode_rates(rates.extra.get("preprocessing", {}))
    demand = stream_demand(plan, rates.rate)
    if not measured or not demand:
        return None
    return needed_preprocessors(demand, measured, spec.cluster.nodes), max(demand)


def decode_limit_line(decode_rate: float) -> str:
    return (f"predictions take decoding as measured: at most {decode_rate:,.0f} samples/s for all running "
            "streams together")


def _decode_line(block: dict) -> str:
    return ", ".join(f"{k} process(es) {float(v):,.0f}/s" for k, v in block["samples_per_s"].items())


def _policy_table(results: dict) -> str:
    # one model per GPU, as users run: baseline; model-task over groups; Cerebro's mop on partitioned data
    reference = next((name for name in ("baseline", "model-task", "mop") if name in results), next(iter(results)))
    base = results[reference].makespan
    rows = [
        [name, format_duration(r.makespan), f"{r.makespan:,.0f}", len(r.timeline.rounds),
         f"{r.total_gpus * r.makespan / 3600:.2f}", f"{base / r.makespan:.2f}x"]
        for name, r in results.items()
    ]
    return format_table(["policy", "makespan", "seconds", "rounds", "GPU-hours", f"vs {reference}"], rows)


def _what_if(rates, spec, gpu_counts: tuple[int, ...]) -> str:
    rows, names = [], []
    for gpus in gpu_counts:
        try:
            scenario = _scenario(rates, spec, gpus)
        except UserError:
            continue  # partitioned data that does not fit this many nodes
        results = predict(spec, scenario, policies=("fleet-g", "baseline"))
        names = list(results)
        best = min(results.items(), key=lambda item: item[1].makespan)
        rows.append([gpus, math.ceil(gpus / rates.gpus_per_node)]
                    + [format_duration(results[p].makespan) for p in results]
                    + [f"{gpus * best[1].makespan / 3600:.2f}", best[0]])
    return format_table(["GPUs", "nodes", *names, "GPU-hours (best)", "best"], rows)
