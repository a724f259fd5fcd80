"""The rate table the coordinator plans with: measured (profile.json) or estimated from FLOPs."""

from __future__ import annotations

import math
from pathlib import Path

from fleet.errors import UserError
from fleet.profiling.plan import timed_as
from fleet.schedule_io import load_profile
from fleet.spec import Spec

ASSUMED_FLOPS = {"cpu": 2e10, "cuda": 5e12}  # sustained FLOP/s of a trainer slot, for estimates only
SCALING = 0.9  # r(m) = r(1) * m ** SCALING in estimates


def estimated_profile(spec: Spec, samples_per_epoch: int, flops_per_sample: dict[str, int]) -> dict:
    """A profile-shaped dict with rates guessed from FLOPs (training = 3x the forward pass)."""
    device_flops = ASSUMED_FLOPS["cuda" if spec.cluster.device.value == "cuda" else "cpu"]
    gpus = spec.cluster.gpus
    same = timed_as(spec.models, spec.cluster.device.value == "emulated")
    models = []
    for model in spec.models:
        r1 = device_flops / max(1, 3 * flops_per_sample[model.id])
        entry = {"id": model.id, "rates": {str(m): r1 * m**SCALING for m in range(1, gpus + 1)}}
        if same[model.id] != model.id:  # trains at the same speed: measured as one, as the profiler would
            entry["timed_as"] = same[model.id]
        models.append(entry)
    return {
        "schema": 1,
        "gpus_per_node": spec.cluster.gpus_per_node,
        "samples_per_epoch": samples_per_epoch,
        "models": models,
        "source": "estimated from FLOPs per sample (no profile.json; run `fleet profile` to measure)",
    }


def load_run_profile(run_dir: str | Path, spec: Spec):
    """The RateTable of `run_dir/profile.json` when it covers every model of `spec`, else None."""
    path = Path(run_dir) / "profile.json"
    if not path.exists():
        return None
    rates = load_profile(path)
    failed = {f.get("id") for f in rates.extra.get("failures", []) if isinstance(f, dict)}
    missing = [m.id for m in spec.models if m.id not in set(rates.ids) and m.id not in failed]
    if missing:
        raise UserError(f"{path}: has no rates for {len(missing)} model(s) of the spec, e.g. {missing[0]!r}")
    return rates


def emulated_epochs(rates, model_id: str, spec: Spec) -> int:
    epochs = getattr(rates.models[rates.index(model_id)], "epochs", None)
    return max(1, math.ceil(epochs)) if epochs else spec.model(model_id).train.max_epochs
