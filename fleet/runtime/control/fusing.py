"""Which models of a job train as bundles (issue 49), decided on rank 0 before planning, and how
each bundle trains.

`runtime.fuse` says where: ``measure`` on any real device, ``auto`` on CUDA devices only (on CPU
fused steps measured 0.75-1.00x of one by one, and a bundle kept one by one is not split yet),
``always`` on any device (the emulated one too), ``never`` nowhere; never with partitioned data
or learning over groups. An ``always`` bundle trains fused; a ``measure`` (or ``auto``) bundle
times fused against its models one by one in its first steps and keeps the faster (`fleet.schedule.bundle_ways`): its trainer says what it
kept (`BundleDecided`), `BundleWays` books it (events.jsonl's ``bundle_decided``, the console)
and the planner plans the bundle at the kept way's measured rate from then on; a resumed job
reuses the decisions recorded in events.jsonl (`recorded_decisions`). Which models may fuse is
`fleet.engines.fusion`'s
(same family and params, torch, one optimizer kind, one batch size); a search's placeholder
never does (its architecture is asked when it starts), nor models at different positions in
their epochs (a bundle's models end their epochs together). The groups become bundles by
their share of the trainer slots (`fleet.schedule.bundling.form_bundles`), which the policy
then plans as units (`Bundled`). What was decided, and why models were left apart, is said in
the run's first lines and in events.jsonl (`bundle_refused`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet.engines.fusion import fusable_groups, model_refusal, pair_refusal
from fleet.runtime.control.console import Console
from fleet.runtime.events import EventLog, read_events
from fleet.runtime.protocol import BundleDecided
from fleet.schedule.bundle_ways import Way, WayDecision, decided_factors, recorded_decision
from fleet.schedule.bundling import form_bundles
from fleet.schedule.rates import RateTable, reestimated
from fleet.spec import Fuse, Spec

SHOWN_REFUSALS = 5  # console lines of models left apart (events.jsonl has them all)


@dataclass(frozen=True)
class Fusion:
    """A job's bundles and the models left apart.

    Attributes:
        bundles: the bundles (model ids, 2 or more each).
        refused: (models, reason) of the models that may fuse with no other here.
        note: the run's first line about fusion ("" with `runtime.fuse: never`).
        decided: under ``auto``, the recorded decisions of earlier jobs about these bundles'
            models (`recorded_decisions`): those bundles train the way kept there, untimed.
    """

    bundles: tuple[tuple[str, ...], ...] = ()
    refused: tuple[tuple[tuple[str, ...], str], ...] = ()
    note: str = ""
    decided: tuple[WayDecision, ...] = ()

    def lines(self) -> list[str]:
        """What the console says: the note, then the first refusals."""
        lines = [self.note] if self.note else []
        lines += [f"not fused: {', '.join(models)}: {reason}" for models, reason in self.refused[:SHOWN_REFUSALS]]
        if len(self.refused) > SHOWN_REFUSALS:
            lines.append(f"not fused: {len(self.refused) - SHOWN_REFUSALS} more (bundle_refused in events.jsonl)")
        return lines


def plan_fusion(spec: Spec, models: Sequence[str], positions: Mapping[str, int], slots: int,
                recorded: Sequence[WayDecision] = ()) -> Fusion:
    """The bundles of the `models` left to train (`positions`: samples into its epoch of each
    resumed one) on `slots` trainer slots, as `runtime.fuse` asks on the spec's device;
    `recorded`: earlier jobs' decisions of how bundles train (``auto``)."""
    mode, device = spec.runtime.fuse, spec.cluster.device.value
    if mode is Fuse.NEVER:
        return Fusion()
    parts, refused = fusable_parts(spec, models, positions)
    if not parts and mode.measures:  # nothing to fuse: nothing to say
        return Fusion()
    if not parts:
        return Fusion(refused=tuple(refused), note="runtime.fuse always: no two models left may fuse")
    if mode.measures and device == "emulated":
        return Fusion(note=f"runtime.fuse {mode.value}: no bundles on emulated trainers (an emulated bundle's step is "
                           "its models' steps one after another: nothing to measure; runtime.fuse: always forms them)")
    if mode is Fuse.AUTO and device != "cuda":
        return Fusion(note=f"runtime.fuse auto: no bundles on {device} trainers (fused steps measured 0.75-1.00x of one "
                           "by one there, and a bundle kept one by one is not split yet; runtime.fuse: measure times "
                           "both ways)")
    if spec.data.partitioned or spec.data.group_by is not None:
        what = "partitioned data (model hopping)" if spec.data.partitioned else "learning over groups"
        return Fusion(note=f"runtime.fuse {mode.value}: no bundles for {what}")
    bundles = tuple(form_bundles(parts, len(models), slots))
    bundled = {m for b in bundles for m in b}
    shared = [(tuple(p), f"its {len(p)} models of one architecture have a trainer slot each")
              for p in parts if len(p) > 1 and not bundled & set(p)]
    found = [recorded_decision(recorded, b) for b in bundles] if mode.measures else []
    decided = tuple(d for d in found if d is not None)
    return Fusion(bundles, tuple(refused + shared), _note(mode, device, bundles, len(models), len(decided)), decided)


def _note(mode: Fuse, device: str, bundles: Sequence[tuple[str, ...]], models: int, decided: int) -> str:
    """The run's first line about its bundles."""
    bundled = sum(len(b) for b in bundles)
    sizes = ", ".join(str(len(b)) for b in bundles) or "none"
    note = f"runtime.fuse {mode.value}: {len(bundles)} bundle(s) of {sizes} models on one {device} trainer each"
    if mode is Fuse.ALWAYS:
        return f"{note}, each trained as one fused model; {models - bundled} model(s) apart"
    how = f"{decided} as an earlier job decided, " if decided else ""
    return (f"{note}, {how}each timed fused against its models one by one in its first steps, the faster kept; "
            f"{models - bundled} model(s) apart")


def fusable_parts(spec: Spec, models: Sequence[str], positions: Mapping[str, int]
                  ) -> tuple[list[list[str]], list[tuple[tuple[str, ...], str]]]:
    """The groups of models that may train as one (by architecture, then by position in their
    epochs), and (models, reason) for each model that may fuse with none."""
    specs = [spec.model(m) for m in models]
    refused = [((m.id,), "its values are asked when it starts (adaptive search)") for m in specs if m.search]
    candidates = [m for m in specs if not m.search]
    first_of: dict[str, object] = {}
    for m in candidates:
        first_of.setdefault(m.family, m)
    parts: list[list[str]] = []
    for group in fusable_groups(candidates):
        by_position: dict[int, list[str]] = {}
        for model in group:
            by_position.setdefault(positions.get(model, 0), []).append(model)
        for part in by_position.values():
            if len(part) > 1:
                parts.append(part)
            elif len(group) > 1:
                refused.append(((part[0],), "resumed at another position in its epoch than the other models of its "
                                            "architecture (a bundle's models end their epochs together)"))
            else:
                refused.append(((part[0],), _alone(spec, part[0], first_of)))
    return parts, refused


def _alone(spec: Spec, model: str, first_of: Mapping) -> str:
    """Why `model`, alone of its kind, fuses with no other model left."""
    own = spec.model(model)
    reason = model_refusal(own)
    if reason:
        return reason
    other = first_of.get(own.family)
    why = pair_refusal(other, own) if other is not None and other.id != model else None
    return why or f"no other model left is a {own.family} of its params, optimizer and batch size"


def recorded_decisions(run_dir: str | Path) -> list[WayDecision]:
    """The bundle decisions (``bundle_decided``) earlier jobs recorded in the run directory's
    events.jsonl, in the order made. A record that is not one is left out: its bundle is timed
    again."""
    decisions = []
    for event in read_events(Path(run_dir) / "events.jsonl"):
        if event.get("event") != "bundle_decided":
            continue
        try:
            decisions.append(WayDecision.from_record(event))
        except (KeyError, ValueError, TypeError):
            continue  # not a decision this version wrote: the bundle times both ways again
    return decisions


def decided_rates(spec: Spec, rates: RateTable, fusion: Fusion) -> RateTable:
    """`rates` with each bundle that has a recorded decision planned at the kept way's measured
    rate (`fleet.schedule.bundle_ways.decided_factors`)."""
    factors: dict[str, float] = {}
    for bundle in fusion.bundles:
        decision = recorded_decision(fusion.decided, bundle)
        if decision is not None:
            factors.update(decided_factors(rates, bundle, decision, spec.model(bundle[0]).train.batch_size))
    return reestimated(rates, factors) if factors else rates


class BundleWays:
    """Rank 0's book of how each bundle trains (see the module docstring).

    Args:
        spec: the run's spec (`runtime.fuse`, the models' batch sizes).
        decided: decisions already made (earlier jobs', `Fusion.decided`).
        log, console: where a new decision is recorded and said.
    """

    def __init__(self, spec: Spec, decided: Sequence[WayDecision], log: EventLog, console: Console):
        self.spec, self.decisions, self.log, self.console = spec, list(decided), log, console

    def way(self, models: Sequence[str]) -> str | None:
        """How a bundle of `models` trains: ``fused`` under ``always``; under ``auto`` and
        ``measure`` the way kept for them, else None (its trainer times both ways)."""
        if not self.spec.runtime.fuse.measures:
            return Way.FUSED.value
        decision = recorded_decision(self.decisions, models)
        return None if decision is None else decision.kept.value

    def decided(self, report: BundleDecided, rates: RateTable) -> dict[str, float]:
        """A bundle's trial decided (`report`): recorded (events.jsonl, synced) and said;
        returns the factors of its models' rates that plan it at the kept way's rate."""
        decision = WayDecision(tuple(report.models), report.fused_step_s, report.one_by_one_step_s, Way(report.kept))
        self.decisions.append(decision)
        self.log.write("bundle_decided", **decision.record(), stream=report.stream)
        self.log.sync()
        self.console.bundle_decided(decision.models, decision.fused_step_s, decision.one_by_one_step_s,
                                    decision.kept.value)
        return decided_factors(rates, decision.models, decision, self.spec.model(decision.models[0]).train.batch_size)
