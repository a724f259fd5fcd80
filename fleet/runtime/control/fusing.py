"""Which models of a job train as fused bundles (issue 49), decided on rank 0 before planning.

`runtime.fuse` says where: ``always`` on any device, ``never`` nowhere, ``auto`` on CUDA devices
only for now (a bundle pays where one small model leaves a GPU mostly idle; on a CPU slot it
does the same work as its models one after another, 0.75-1.0x in `bench/fused.py`); never with
partitioned data or learning over groups. Which models may fuse is `fleet.engines.fusion`'s
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

from fleet.engines.fusion import fusable_groups, model_refusal, pair_refusal
from fleet.schedule.bundling import form_bundles
from fleet.spec import Fuse, Spec

SHOWN_REFUSALS = 5  # console lines of models left apart (events.jsonl has them all)


@dataclass(frozen=True)
class Fusion:
    """A job's bundles and the models left apart.

    Attributes:
        bundles: the bundles (model ids, 2 or more each).
        refused: (models, reason) of the models that may fuse with no other here.
        note: the run's first line about fusion ("" with `runtime.fuse: never`).
    """

    bundles: tuple[tuple[str, ...], ...] = ()
    refused: tuple[tuple[tuple[str, ...], str], ...] = ()
    note: str = ""

    def lines(self) -> list[str]:
        """What the console says: the note, then the first refusals."""
        lines = [self.note] if self.note else []
        lines += [f"not fused: {', '.join(models)}: {reason}" for models, reason in self.refused[:SHOWN_REFUSALS]]
        if len(self.refused) > SHOWN_REFUSALS:
            lines.append(f"not fused: {len(self.refused) - SHOWN_REFUSALS} more (bundle_refused in events.jsonl)")
        return lines


def plan_fusion(spec: Spec, models: Sequence[str], positions: Mapping[str, int], slots: int) -> Fusion:
    """The bundles of the `models` left to train (`positions`: samples into its epoch of each
    resumed one) on `slots` trainer slots, as `runtime.fuse` asks on the spec's device."""
    mode, device = spec.runtime.fuse, spec.cluster.device.value
    if mode is Fuse.NEVER:
        return Fusion()
    parts, refused = fusable_parts(spec, models, positions)
    if not parts and mode is Fuse.AUTO:  # nothing to fuse: nothing to say
        return Fusion()
    if not parts:
        return Fusion(refused=tuple(refused), note="runtime.fuse always: no two models left may fuse")
    if mode is Fuse.AUTO and device != "cuda":
        return Fusion(note=f"runtime.fuse auto: no bundles on {device} trainers (a fused bundle pays on CUDA GPUs; "
                           "runtime.fuse: always fuses here too)")
    if spec.data.partitioned or spec.data.group_by is not None:
        what = "partitioned data (model hopping)" if spec.data.partitioned else "learning over groups"
        return Fusion(note=f"runtime.fuse {mode.value}: no bundles for {what}")
    bundles = tuple(form_bundles(parts, len(models), slots))
    bundled = {m for b in bundles for m in b}
    shared = [(tuple(p), f"its {len(p)} models of one architecture have a trainer slot each")
              for p in parts if len(p) > 1 and not bundled & set(p)]
    sizes = ", ".join(str(len(b)) for b in bundles) or "none"
    note = (f"runtime.fuse {mode.value}: {len(bundles)} bundle(s) of {sizes} models, each trained as one fused "
            f"model on one {device} trainer; {len(models) - len(bundled)} model(s) apart")
    return Fusion(bundles, tuple(refused + shared), note)


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
