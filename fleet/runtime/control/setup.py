"""Rank 0's set-up before the coordinator starts, and its write-up after the run.

Set-up: the run directory (a run started again in the same directory resumes it, but only
with the same ensemble), the rate table (profile.json, or an estimate from FLOPs), the
policy, and the books (models already converged are left out; checkpointed ones are
PAUSED with their epochs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from fleet.atomic import atomic_write_json, atomic_write_text
from fleet.errors import UserError
from fleet.host import node_cores
from fleet.inspect import describe_ensemble
from fleet.prediction import candidates_for, costs_of, lead_samples, model_groups, planned_rates, simulated_early_stop
from fleet.profiling.document import decode_limit, epochs_estimate, preprocessor_count, reuse_verdict, shared_cores
from fleet.profiling.plan import predicted_profiling_s, profiling_verdict, timed_as
from fleet.profiling.timed_steps import (corrections, group_costs, group_counts, group_rates, group_representatives,
                                         representatives)
from fleet.report.results import EARLY_STOP_REASON, ModelResult, RunResult, write_results
from fleet.runtime.control.accounting import ModelRecord
from fleet.runtime.control.fusing import Fusion, decided_rates, plan_fusion, recorded_decisions
from fleet.runtime.control.host_use import core_share
from fleet.runtime.control.rates_source import (STEPS_FILE, emulated_epochs, estimated_profile, load_run_profile,
                                                load_timed_steps)
from fleet.runtime.control.rungs import ResumedRungs, start_early_stopping
from fleet.runtime.events import first_batch_s, read_events
from fleet.runtime.train.checkpoint import CheckpointStore
from fleet.schedule import Cluster, Policy, RateTable, Scenario, whole_epochs
from fleet.schedule.bundling import Bundled
from fleet.schedule.calibration import Calibration, predicted_wall_s
from fleet.schedule.choice import (AUTO, PREDICTION_COSTS, PolicyChoice, PolicySwitch, choose_policy,
                                   switch_targets)
from fleet.schedule.cores import SharedCores
from fleet.schedule.costs import Overheads
from fleet.schedule.early_stop import EarlyStopping, Verdict
from fleet.schedule.ledger import Ledger
from fleet.schedule.partitions import Partitions
from fleet.schedule.planners import policy_class
from fleet.schedule.predicted import ESTIMATED_SPREAD, MEASURED_SPREAD, RunForecast, forecast_run
from fleet.schedule.rates import is_positive_number
from fleet.schedule_io import load_calibration, load_profile, pilot_calibration
from fleet.spec import Spec, parse_spec
from fleet.spec.asked import read_asked, with_asked
from preprocess.partition import job_partitions


@dataclass(frozen=True)
class PredictionBasis:
    """What a run's predictions take besides its rates: its nodes' cores as trainers and
    preprocessors share them (CPU nodes), and what an earlier run measured."""

    cores: SharedCores | None = None
    calibration: Calibration | None = None
    base: Overheads = PREDICTION_COSTS  # as the profile or the timed steps measured the saves (`costs_of`)

    def costs(self) -> Overheads:
        """The checkpoint, restore and start costs predictions assume: measured by an earlier
        run where there is one, else `base`."""
        return self.calibration.overheads(self.base) if self.calibration else self.base


@dataclass
class RunPlan:
    """Everything rank 0 prepares before the ranks start working."""

    rates: RateTable
    rates_source: str
    policy: Any
    ledger: Ledger
    records: dict[str, ModelRecord]
    resumed: list[str]
    already_converged: list[str]
    choice: PolicyChoice | None = None  # policy auto: what it chose and why
    policy_name: str = ""
    early: EarlyStopping | None = None  # early stopping across models, restored from the run directory
    forecast: RunForecast | None = None  # what the run expects of itself (results.json's prediction)
    basis: PredictionBasis = PredictionBasis()  # what the predictions take besides the rates
    fusion: Fusion = Fusion()  # the job's bundles (`runtime.fuse`): `policy` plans each as one unit

    def choice_record(self, switches: Sequence[PolicySwitch] = ()) -> dict:
        """What results.json says of `policy: auto`'s choice ({} for a policy the spec named),
        with the switches the running job made."""
        if self.choice is None:
            return {}
        record = {"by": AUTO, "chosen": self.choice.name, "predicted_makespan_s": self.choice.predicted_s}
        if self.choice.skipped:  # too large to simulate within the prediction budget
            record["not_predicted"] = list(self.choice.skipped)
        if switches:
            record["switched"] = [{"from": w.current, "to": w.to, "predicted_remaining_s": w.predicted_s,
                                   "cost_s": w.cost_s} for w in switches]
        return record


def check_same_ensemble(run_dir: Path, spec: Spec) -> None:
    """A run directory holds one ensemble: resuming it with another spec is an error."""
    saved = run_dir / "spec.yaml"
    if not saved.exists():
        return
    try:
        document = yaml.safe_load(saved.read_text())
        if isinstance(document, dict):
            # only the models and the data must match; a scheduler section written by an older
            # fleet (alpha and delta beside every policy) need not parse today
            document.pop("scheduler", None)
        previous = with_asked(parse_spec(document, check_paths=False), read_asked(run_dir))
    except UserError as exc:
        raise UserError(f"{saved}: cannot read the spec of the earlier run: {exc}") from None
    if previous.models != spec.models or previous.data.model_copy(update={"path": None}) != spec.data.model_copy(
        update={"path": None}
    ):
        raise UserError(
            f"{run_dir}: holds a run of a different ensemble ({saved}); use another --run-dir to start afresh"
        )


def prepare_run_dir(spec: Spec) -> Path:
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    check_same_ensemble(run_dir, spec)
    atomic_write_text(run_dir / "spec.yaml", spec.to_yaml())
    return run_dir


@dataclass(frozen=True)
class RatesDecision:
    """Rank 0's choice before anything runs: profile first or not; an emulated device's rates."""

    measure: bool
    emulated_rates: RateTable | None
    note: str = ""
    time_steps: tuple[str, ...] = ()  # not profiling: the models to time a few steps of first
    time_groups: tuple[str, ...] = ()  # of them, those timed on groups of trainers too


def rates_decision(spec: Spec, run_dir: Path, profile_only: bool, samples_per_epoch: int) -> RatesDecision:
    """Profile when asked to (`fleet profile`) or when the run directory has no profile.json
    that matches the spec: with `scheduler.profile` true, always; with auto (the default),
    never for a policy that reads no rate, else when profiling is predicted to cost little
    beside the training it plans (`profiling_worth`)."""
    path = run_dir / "profile.json"
    document = _read_json(path) if path.exists() else None
    emulated = None
    if spec.cluster.device.value == "emulated":
        if spec.cluster.emulated_profile:
            emulated = load_profile(spec.cluster.emulated_profile)
        elif profile_only:
            raise UserError("cluster.emulated_profile: profiling an emulated device needs the rates its steps take")
        elif not path.exists():
            raise UserError(_NO_EMULATED_RATES.format(path=path))
        else:
            return RatesDecision(False, load_profile(path))
    if profile_only:
        return RatesDecision(True, emulated, "profiling only (a dry run): nothing is trained")
    if not spec.scheduler.profile:
        return RatesDecision(False, emulated)
    reuse, why = reuse_verdict(document, spec)
    if reuse:
        return RatesDecision(False, emulated, f"rates from {path}: {why}")
    named = spec.scheduler.policy
    if spec.scheduler.profile == AUTO and named != AUTO and not policy_class(named).reads_rates:
        timed, groups = steps_to_time(spec, run_dir) if emulated is None else ((), ())
        note = f"not profiling: policy {named} never reads a rate" + (
            "; timing a few steps of each model family for its forecast" if timed else "")
        return RatesDecision(False, emulated, note, timed, groups)
    if spec.scheduler.profile == AUTO and emulated is None and not spec.data.partitioned:
        worth, why = profiling_worth(spec, samples_per_epoch)
        timed, groups = ((), ()) if worth else steps_to_time(spec, run_dir)
        return RatesDecision(worth, emulated, why, timed, groups)
    return RatesDecision(True, emulated, f"profiling first: {why}")


def profiling_worth(spec: Spec, samples_per_epoch: int) -> tuple[bool, str]:
    """Whether profiling pays for itself, and why: its predicted seconds against the training's
    predicted makespan, both from rates estimated from FLOPs (`profiling_verdict`)."""
    rates = estimated_rates(spec, samples_per_epoch)
    cluster = spec.cluster
    profiling_s, pairs = predicted_profiling_s(spec.models, rates.rate, spec.scheduler.profile_batches,
                                               cluster.gpus_per_node, cluster.gpus,
                                               cluster.nodes * cluster.preprocessors_per_node)
    estimates = epochs_estimate(rates, spec)
    scenario = Scenario(rates, whole_epochs(estimates), tuple(estimates), Cluster(cluster.gpus, rates.gpus_per_node))
    choice = choose_policy(lambda name: policy_for(spec, name), scenario)
    return profiling_verdict(profiling_s, pairs, choice.predicted_s[choice.name])


_NO_EMULATED_RATES = "cluster.device: emulated needs {path} with rates for every model (or cluster.emulated_profile)"


def _read_json(path: Path) -> dict | None:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read it: {exc}") from None


def steps_to_time(spec: Spec, run_dir: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The models whose steps a job that does not profile times first (a few per family,
    `fleet.profiling.timed_steps`), and of them those timed on groups of 2 .. a node's trainers
    as well (the fewest and the most parameter bytes, where such groups can form); none where
    steps.json already holds this ensemble's."""
    if load_timed_steps(run_dir, spec) is not None:
        return (), ()
    flops, param_bytes = ensemble_costs(spec)
    same = timed_as(spec.models, emulated=False)
    timed = tuple(representatives({m: max(1, f) for m, f in flops.items()}, families_of(spec),
                                  sorted(set(same.values()))))
    if not group_counts(spec.cluster.gpus_per_node, spec.cluster.gpus):
        return timed, ()
    return timed, tuple(group_representatives(param_bytes, timed))


def rate_table(spec: Spec, run_dir: Path, samples_per_epoch: int) -> tuple[RateTable, str]:
    measured = load_run_profile(run_dir, spec)
    if measured is not None:
        return measured, f"measured ({run_dir / 'profile.json'})"
    if spec.cluster.device.value == "emulated":
        if spec.cluster.emulated_profile:

            return load_profile(spec.cluster.emulated_profile), f"the emulated device's ({spec.cluster.emulated_profile})"
        raise UserError(_NO_EMULATED_RATES.format(path=run_dir / "profile.json"))

    steps = load_timed_steps(run_dir, spec)
    if steps is not None and steps.get("rates"):
        return corrected_rates(spec, samples_per_epoch, steps), (
            f"estimated from FLOPs, corrected by {len(steps['rates'])} timed model(s) ({run_dir / STEPS_FILE})")
    return estimated_rates(spec, samples_per_epoch), "estimated from FLOPs"


def ensemble_costs(spec: Spec) -> tuple[dict[str, int], dict[str, int]]:
    """Each model's FLOPs per sample and parameter bytes, counted by its framework's zoo."""
    rows = describe_ensemble(spec).rows
    return {r.id: r.stats.flops_per_sample for r in rows}, {r.id: r.stats.param_bytes for r in rows}


def families_of(spec: Spec) -> dict[str, str]:
    return {m.id: m.family for m in spec.models}


def estimated_rates(spec: Spec, samples_per_epoch: int) -> RateTable:
    """Every model's rates guessed from its FLOPs per sample (no profile.json)."""
    return RateTable.from_dict(estimated_profile(spec, samples_per_epoch, *ensemble_costs(spec)))


def corrected_rates(spec: Spec, samples_per_epoch: int, steps: dict) -> RateTable:
    """The estimates from FLOPs corrected by the timed steps of steps.json (its measured
    decoding and node beside them, as a profile's)."""
    flops, param_bytes = ensemble_costs(spec)
    document = estimated_profile(spec, samples_per_epoch, flops, param_bytes)
    single = {entry["id"]: entry["rates"]["1"] for entry in document["models"]}
    factors = corrections(single, steps["rates"], {m: max(1, f) for m, f in flops.items()}, families_of(spec))
    timed = {key: steps.get(key) if isinstance(steps.get(key), dict) else {} for key in ("checkpoint_s", "eval_rate")}
    costs = group_costs(_group_steps(steps), param_bytes)
    for entry in document["models"]:
        entry["rates"] = {m: rate * factors[entry["id"]] for m, rate in entry["rates"].items()}
        if costs:  # the timed groups' costs up to a node's trainers, Eq. 5 beyond
            model = spec.model(entry["id"])
            grouped = group_rates(entry["rates"]["1"], model.train.batch_size, param_bytes.get(model.id, 0), costs)
            entry["rates"] = {"1": entry["rates"]["1"], **{str(m): rate for m, rate in grouped.items()}}
        source = entry.get("timed_as", entry["id"])  # a model that trains as a timed one: its figures
        for key, values in timed.items():  # the timed models' saves and validation passes
            if is_positive_number(values.get(source)):
                entry[key] = values[source]
    document["preprocessing"], document["hardware"] = steps["preprocessing"], steps["hardware"]
    document["source"] = "estimated from FLOPs per sample, corrected by timed steps (steps.json)"
    return RateTable.from_dict(document)


def _group_steps(steps: dict) -> dict[str, dict[int, float]]:
    """steps.json's `group_steps` (model: {trainers: seconds per step}, checked by
    `load_timed_steps`; an older steps.json has none) with integer counts, for the models
    timed on one trainer and on a group."""
    out: dict[str, dict[int, float]] = {}
    for model, by_m in (steps.get("group_steps") or {}).items():
        kept = {int(m): s for m, s in by_m.items()}
        if 1 in kept and len(kept) > 1:
            out[model] = kept
    return out


def check_partitions(spec: Spec) -> Partitions | None:
    """Where the partitions of partitioned data live (None: whole data); they must fit the
    job's nodes (one line, exit 2, before any work).

    Raises:
        UserError: its manifest is missing or malformed, or its partitions do not fit.
    """
    return job_partitions(spec.data, spec.cluster.nodes, spec.cluster.gpus_per_node)


def policy_for(spec: Spec, name: str | None = None) -> Policy:
    """Policy `name` (by default the spec's), with the spec's options where it is the spec's
    own (see `SchedulerSpec.create_policy`)."""
    return spec.scheduler.create_policy(spec.seed, name)


def planned_policy(spec: Spec, fusion: Fusion) -> Callable[[str | None], Policy]:
    """Policy `name` (`policy_for`) as this job runs it: planning its bundles as units (`Bundled`)."""
    if not fusion.bundles:
        return lambda name=None: policy_for(spec, name)
    return lambda name=None: Bundled(policy_for(spec, name), fusion.bundles)


def chosen_policy(spec: Spec, todo: RateTable, estimates: list[float], decode_rate: float | None,
                  epochs_done: dict[str, int], ledger: Ledger, basis: PredictionBasis = PredictionBasis(),
                  fusion: Fusion = Fusion()) -> tuple[Policy, PolicyChoice | None]:
    """The policy to run (planning the job's bundles, `fusion`, as units) and, for `policy:
    auto`, the choice: the candidate predicted to finish the models still to train first (from
    where the checkpointed ones stand); on partitioned data, among the hopping policies."""
    candidates = candidates_for(spec)
    planned = planned_policy(spec, fusion)
    if spec.scheduler.policy != AUTO:
        return planned(None), None
    if not todo.models:
        return planned(candidates[0]), None
    scenario = run_scenario(spec, todo, estimates, decode_rate, epochs_done, ledger, basis)
    choice = choose_policy(planned, scenario, basis.costs(), candidates=candidates,
                           early_stop=simulated_early_stop(spec))
    return planned(choice.name), choice


def run_scenario(spec: Spec, todo: RateTable, estimates: list[float], decode_rate: float | None,
                 epochs_done: dict[str, int], ledger: Ledger, basis: PredictionBasis = PredictionBasis()) -> Scenario:
    """What the run predicts itself on: the models still to train at the rates it plans with,
    from where the checkpointed ones stand, decoding as measured (each stream from the
    preprocessors the runtime gives it), on partitioned data where it is, and on CPU nodes the
    cores they share (`basis`)."""
    parts = ledger.partitions
    cluster = spec.cluster
    return Scenario(todo, whole_epochs(estimates), tuple(estimates), Cluster(cluster.gpus, todo.gpus_per_node),
                    decode_rate=decode_rate, own_decode_rate=decode_limit(todo.extra, 1, 1), cores=basis.cores,
                    partition_sizes=parts.sizes if parts else (), partition_groups=parts.groups if parts else (),
                    visited=tuple(ledger.model(p.id).visited for p in todo.models) if parts else (),
                    resumed=tuple(_resumed_epochs(ledger, p.id, epochs_done) for p in todo.models),
                    lead_samples=lead_samples(spec), preprocessors_per_node=node_preprocessors(spec, todo))


def run_forecast(spec: Spec, plan: "RunPlan", estimates: list[float], decode_rate: float | None,
                 epochs_done: dict[str, int]) -> RunForecast | None:
    """The run's forecast of itself (`fleet.schedule.predicted`): the policy it runs on the
    models left (its bundles as units, at the rates it plans them with), with a range from the
    rates' uncertainty (None with no model left)."""
    if not plan.rates.models:
        return None
    scenario = run_scenario(spec, plan.ledger.rates, estimates, decode_rate, epochs_done, plan.ledger, plan.basis)
    measured = plan.rates_source.startswith("measured") or plan.basis.calibration is not None
    spread = MEASURED_SPREAD if measured else ESTIMATED_SPREAD
    choice, planned = plan.choice, planned_policy(spec, plan.fusion)
    return forecast_run(lambda: planned(plan.policy_name), scenario, plan.basis.costs(), spread,
                        seed=spec.seed, early_stop=simulated_early_stop(spec),
                        candidates=choice.predicted_s if choice else None)


def switch_candidates(spec: Spec, plan: "RunPlan") -> tuple[str, ...]:
    """The policies a running ``policy: auto`` job may hand its rest to when measured rates
    change the ranking: its candidates, except those that decode each model in its own trainer
    unless it started with one (those decoders start with the job); none on partitioned data
    (visits are re-planned at every hop anyway) or for a policy the spec named."""
    if plan.choice is None or plan.ledger.partitions is not None or spec.data.group_by is not None:
        return ()
    if plan.fusion.bundles:  # the candidates' predictions know no bundles
        return ()
    return switch_targets(plan.policy)


def _resumed_epochs(ledger: Ledger, model: str, epochs_done: dict[str, int]) -> float | None:
    """Epochs a resumed model trained (with the partitions it visited in its epoch), or None."""
    if model not in epochs_done:
        return None
    parts = ledger.partitions
    seen = parts.share(ledger.model(model).visited) if parts else 0.0
    return float(epochs_done[model]) + seen


def plan_run(spec: Spec, run_dir: Path, samples_per_epoch: int, partitions: Partitions | None = None,
             calibrate_from: str | None = None, cores: float | None = None,
             epoch_scales: Mapping[str, float] | None = None) -> RunPlan:
    """Rates, policy and books for the models still to train (`partitions`: where partitioned
    data lives; each resumed model's checkpoint says which it visited in its epoch), predicted
    and planned with what an earlier run measured (`calibrate_from`, else this run directory's
    own earlier job where it left its measures); `cores`: one node's, where no profile says
    (default: this process's); `epoch_scales`: grouped data's models' N / n_g, by which their
    rates become epoch-equivalent (`group_rates`)."""
    rates, source = rate_table(spec, run_dir, samples_per_epoch)
    calibration = run_calibration(spec, run_dir, calibrate_from, rates)
    table = rates  # the rates the calibration corrects
    if calibration is not None:
        rates, source = calibration.rates_for(rates), f"{source}, calibrated by {calibration.source}"
    rates = planned_rates(rates, spec, calibration, epoch_scales or {})
    store = CheckpointStore(run_dir)
    infos = {m.id: store.latest_info(m.id) for m in spec.models}
    records = {m.id: ModelRecord(family=m.family) for m in spec.models}
    for failure in rates.extra.get("failures", []):
        if failure.get("id") in records and failure["id"] not in set(rates.ids):
            records[failure["id"]].stop_reason = f"not trained: profiling failed ({failure.get('reason')})"
    visited = _load_checkpoints(store, [i for i, info in infos.items() if info], records)
    converged = [i for i, info in infos.items() if info and info.get("converged")]
    rungs = _early_stopping(spec, run_dir, records, converged)
    converged += [m.id for m in spec.models if rungs and m.id in rungs.stopped and m.id not in converged]
    remaining = [p for p in rates.models if p.id in {m.id for m in spec.models} and p.id not in converged]
    todo = rates.subset([p.id for p in remaining])
    resumed = [p.id for p in remaining if infos.get(p.id)]
    epochs_done = {i: int(infos[i]["epochs"]) for i in resumed}

    decode_rate = decode_limit(rates.extra, spec.cluster.nodes, spec.cluster.preprocessors_per_node)
    if calibration is not None:
        decode_rate = calibration.decode_rate(
            preprocessor_count(spec.cluster.preprocessors_per_node, rates.extra, spec.cluster.nodes), decode_rate)
    basis = PredictionBasis(run_cores(spec, table, calibration, cores), calibration, costs_of(rates))
    estimates = epochs_estimate(todo, spec)
    ledger = Ledger(todo, estimates, spec.cluster.gpus, spec.cluster.gpus_per_node, epochs_done, paused=resumed,
                    decode_rate=decode_rate, partitions=partitions, visited=visited,
                    held=rungs.held if rungs else ())
    positions = {i: int(infos[i]["epoch_samples"]) for i in resumed}
    fusion = plan_fusion(spec, [p.id for p in remaining], positions, spec.cluster.gpus, recorded_decisions(run_dir))
    ledger.rates = decided_rates(spec, ledger.rates, fusion)  # bundles an earlier job timed: as measured
    policy, choice = chosen_policy(spec, ledger.rates, estimates, decode_rate, epochs_done, ledger, basis, fusion)
    candidates = candidates_for(spec)
    name = choice.name if choice else (candidates[0] if spec.scheduler.policy == AUTO else spec.scheduler.policy)
    plan = RunPlan(todo, source, policy, ledger, records, resumed, converged, choice, name,
                   rungs.early if rungs else None, basis=basis, fusion=fusion)
    plan.forecast = run_forecast(spec, plan, estimates, decode_rate, epochs_done)
    return plan


def run_cores(spec: Spec, rates: RateTable, calibration: Calibration | None, cores: float | None) -> SharedCores | None:
    """The cores a CPU run's trainers and preprocessors share: the profile's node's (else
    `cores`, else this process's; virtual nodes share one machine's), at the costs an earlier
    run measured where there is one (`rates`: the table its measured rates correct)."""
    cluster = spec.cluster
    sharing = shared_cores(rates.extra, cluster.device.value, cluster.threads_per_trainer, cores or node_cores(),
                           cluster.nodes if cluster.virtual_nodes else 1)
    return calibration.cores(sharing, rates) if calibration else sharing


def run_calibration(spec: Spec, run_dir: Path, calibrate_from: str | None, rates: RateTable) -> Calibration | None:
    """What the predictions learn from: the run in `calibrate_from` (its results.json must hold
    what it measured), else this run directory's earlier job where it left its measures, else
    the pilot run of the profile `rates` came from (``fleet profile --pilot``)."""
    device = spec.cluster.device.value
    if calibrate_from is not None:
        return load_calibration(Path(calibrate_from), device, required=True)
    return load_calibration(run_dir, device, required=False) or pilot_calibration(rates, device)


def _load_checkpoints(store: CheckpointStore, models: list[str], records: dict[str, ModelRecord]) -> dict:
    """Each checkpointed model's record from its latest checkpoint; returns the partitions each
    visited in its epoch (partitioned data)."""
    visited: dict[str, tuple[int, ...]] = {}
    for model_id in models:
        checkpoint = store.load(model_id)
        record = records[model_id]
        record.epochs, record.history = checkpoint.epochs, list(checkpoint.history)
        record.converged, record.stop_reason = checkpoint.converged, checkpoint.stop_reason
        record.gpu_seconds = checkpoint.gpu_seconds
        visited[model_id] = tuple(int(k) for k in checkpoint.meta.get("visited", ()))
    return visited


def _early_stopping(spec: Spec, run_dir: Path, records: dict[str, ModelRecord],
                    converged: list[str]) -> ResumedRungs | None:
    """The run's early stopping, restored from the run directory (None without it); the models
    it stopped are recorded as ended there."""
    settings = spec.early_stop_settings()
    metric = spec.models[0].train.stop.metric.value  # one metric for all (the spec's cross-checks)
    curves = {m: r.history for m, r in records.items() if r.history}
    ended = {m: records[m].epochs for m in converged}
    rungs = start_early_stopping(run_dir, settings, [m.id for m in spec.models], metric, curves, ended,
                                 model_groups(spec))
    for decision in rungs.early.decisions if rungs else ():
        if decision.model in rungs.stopped and decision.verdict is Verdict.STOPPED:
            records[decision.model].stopped_early(rungs.early.rungs(decision.model).index(decision.rung))
    return rungs


def epoch_limits(spec: Spec, rates: RateTable) -> dict[str, int]:
    """The emulated device converges each model after the profile's epochs."""
    if spec.cluster.device.value != "emulated":
        return {}
    return {p.id: emulated_epochs(rates, p.id, spec) for p in rates.models}


def model_result(model_id: str, record: ModelRecord, metric: str) -> ModelResult:
    history = record.history
    values = [h.get(metric) for h in history]
    accuracies = [h.get("val_accuracy") for h in history if h.get("val_accuracy") is not None]
    best_epoch, best = 0, None
    for k, value in enumerate(values, start=1):
        if value is None:
            continue
        better = best is None or (value > best if metric == "val_accuracy" else value < best)
        if better:
            best, best_epoch = value, k
    return ModelResult(
        id=model_id, family=record.family, parameters=record.parameters, epochs=record.epochs,
        converged=record.converged, stop_reason=record.stop_reason, metric=metric, best_metric=best,
        best_epoch=best_epoch, best_val_accuracy=max(accuracies) if accuracies else None,
        final_train_loss=history[-1]["train_loss"] if history else None, gpu_seconds=record.gpu_seconds,
        history=history, rung=record.rung,
    )


def write_run(spec: Spec, run_dir: Path, coordinator, makespan: float, startup_s: float,
              plan: RunPlan) -> RunResult:
    """results.json, leaderboard.csv and plan.json of a finished run."""
    account, membership = coordinator.account, coordinator.membership
    models = [model_result(m.id, account.records[m.id], m.train.stop.metric.value) for m in spec.models]
    policy = coordinator.driver.name if coordinator.switches else plan.policy_name
    result = RunResult(
        name=spec.name, policy=policy, gpus=spec.cluster.gpus, makespan_s=makespan,
        rounds=coordinator.ledger.round + 1, samples_decoded=membership.samples_decoded,
        overhead_s={"planning": coordinator.planning_s, "checkpoint": account.checkpoint_s,
                    "checkpoint_gpu": account.checkpoint_gpu_s, "startup": startup_s,
                    "first_batch": first_batch_s(read_events(run_dir / "events.jsonl")) or 0.0},
        validation_samples_decoded=account.val_decoded,
        chunks_in_shared_memory=membership.chunks_shared,
        interrupted=coordinator.interrupted,
        models=models,
        policy_choice=plan.choice_record(coordinator.switches),
        early_stop=asdict(plan.early.settings) if plan.early else {},
        prediction=prediction_record(plan, makespan, coordinator.interrupted,
                                     measured_record(spec, plan, coordinator, makespan), startup_s, len(models)),
        groups=model_groups(spec),
    )
    write_results(run_dir, result)
    rounds = {"policy": policy, "gpus_per_node": spec.cluster.gpus_per_node, "rounds": account.plan_rounds}
    atomic_write_json(run_dir / "plan.json", rounds)
    return result


def measured_record(spec: Spec, plan: RunPlan, coordinator, makespan: float) -> dict:
    """results.json's ``prediction.measured``: the run's measured costs, and where rank 0
    sampled its ranks' CPU (`host_use`), that CPU per rank role beside what the costs account for."""
    record = coordinator.account.measured_costs(makespan, measured_core_share(spec, plan, coordinator, makespan))
    roles = coordinator.host_use.cpu_by_role() if coordinator.host_use is not None else {}
    if roles:
        record["host_cpu"] = coordinator.account.costs.host_cpu(roles)
    return record


def measured_core_share(spec: Spec, plan: RunPlan, coordinator, makespan: float) -> float | None:
    """The part of its nodes' cores (as the predictions count them) a CPU run's measured work
    got, where its trainers and preprocessors want more than a node has: from its ranks' CPU
    as rank 0 sampled it where they share one host (`host_use`), else over the whole makespan;
    None on GPUs or where the ranks fit."""
    cores = plan.basis.cores
    if cores is None or not cores.oversubscribed(spec.cluster.gpus_per_node, node_preprocessors(spec, plan.rates)):
        return None
    simulated = cores.cores * math.ceil(spec.cluster.nodes / cores.nodes_per_host)  # every machine's cores
    costs = coordinator.account.costs
    if coordinator.host_use is not None:
        return core_share(coordinator.host_use, costs.accounted_core_s(), simulated)
    return costs.core_share_over(simulated, makespan)


def node_preprocessors(spec: Spec, rates: RateTable) -> int:
    """Preprocessor processes on one node (the most any node has)."""
    cluster = spec.cluster
    return math.ceil(preprocessor_count(cluster.preprocessors_per_node, rates.extra, cluster.nodes) / cluster.nodes)


def prediction_record(plan: RunPlan, makespan: float, interrupted: bool, measured: dict, startup_s: float = 0.0,
                      models: int = 0) -> dict:
    """results.json's ``prediction``: the run's forecast of itself beside its measured makespan
    (the ratio only for a job that finished: an interrupted one did part of the work), and what
    it measured of its costs (``measured``, for the runs that learn from it). Where an earlier
    job measured its launch and tail, the wall time too (`predicted_wall_s`, with this job's
    `startup_s`; `fleet run` puts this job's launch in it) and the tail it took (``tail_s``)."""
    if plan.forecast is None:
        return {"measured": measured}
    record = {**plan.forecast.to_record(), "rates": plan.rates_source, "measured_makespan_s": makespan,
              "measured": measured}
    calibration = plan.basis.calibration
    if calibration is not None and calibration.tail_s is not None:
        record["tail_s"] = calibration.tail_s
        record["wall_s"] = predicted_wall_s(calibration.launch_s, startup_s, plan.forecast.makespan_s, models,
                                            calibration.tail_s)
    if not interrupted:
        record["measured_over_predicted"] = makespan / max(plan.forecast.makespan_s, 1e-9)
    return record


def results_from_log(spec: Spec, run_dir: Path) -> RunResult:
    """results.json and leaderboard.csv from the event log, for a job that ended before rank 0
    could write them (a rank was killed): each model's epochs as far as its last checkpoint,
    marked interrupted. Reads no checkpoint file, only their commit records."""
    records = {m.id: ModelRecord(family=m.family) for m in spec.models}
    store = CheckpointStore(run_dir)
    kept = {m.id: (store.latest_info(m.id) or {}).get("epochs", 0) for m in spec.models}
    policy = spec.scheduler.policy
    log = run_dir / "events.jsonl"
    if not log.exists():  # a job that ended before it logged anything leaves no results either
        raise FileNotFoundError(f"{log}: no such file (the job logged nothing)")
    for event in read_events(log):
        policy = event.get("policy", policy) if event.get("event") == "run_start" else policy  # auto's choice
        record = records.get(event.get("model"))
        if record is None:
            continue
        if event["event"] == "epoch" and event["epoch"] <= kept[event["model"]]:
            entry = {k: v for k, v in event.items() if k not in ("event", "time", "model", "stop_reason", "bundle")}
            record.history = [h for h in record.history if h["epoch"] < entry["epoch"]] + [entry]
            record.epochs = entry["epoch"]
            record.converged, record.stop_reason = event["stop_reason"] is not None, event["stop_reason"]
        elif event["event"] == "member_left":
            record.gpu_seconds, record.parameters = event["gpu_seconds"], event["parameters"]
        elif event["event"] == "converged" and event.get("reason") == EARLY_STOP_REASON:
            record.stopped_early(event.get("rung"))
    models = [model_result(m.id, records[m.id], m.train.stop.metric.value) for m in spec.models]
    result = RunResult(name=spec.name, policy=policy, gpus=spec.cluster.gpus, makespan_s=0.0,
                       rounds=0, samples_decoded=0, overhead_s={}, models=models, interrupted=True,
                       groups=model_groups(spec))
    write_results(run_dir, result)
    return result
