"""The rate table the coordinator plans with: measured (profile.json) or estimated from FLOPs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fleet.errors import UserError
from fleet.profiling.document import fingerprint
from fleet.profiling.plan import timed_as
from fleet.schedule.rates import is_positive_number
from fleet.schedule_io import load_profile
from fleet.spec import Spec

ASSUMED_FLOPS = {"cpu": 2e10, "cuda": 5e12}  # sustained FLOP/s of a trainer slot, for estimates only
SCALING = 0.9  # r(m) = r(1) * m ** SCALING in estimates


def estimated_profile(spec: Spec, samples_per_epoch: int, flops_per_sample: dict[str, int],
                      param_bytes: dict[str, int] | None = None) -> dict:
    """A profile-shaped dict with rates guessed from FLOPs (training = 3x the forward pass),
    and each model's parameter bytes where given (the size of its checkpoints)."""
    device_flops = ASSUMED_FLOPS["cuda" if spec.cluster.device.value == "cuda" else "cpu"]
    gpus = spec.cluster.gpus
    same = timed_as(spec.models, spec.cluster.device.value == "emulated")
    models = []
    for model in spec.models:
        r1 = device_flops / max(1, 3 * flops_per_sample[model.id])
        entry = {"id": model.id, "rates": {str(m): r1 * m**SCALING for m in range(1, gpus + 1)}}
        if same[model.id] != model.id:  # trains at the same speed: measured as one, as the profiler would
            entry["timed_as"] = same[model.id]
        if (param_bytes or {}).get(model.id):
            entry["param_bytes"] = int(param_bytes[model.id])
        models.append(entry)
    return {
        "schema": 1,
        "gpus_per_node": spec.cluster.gpus_per_node,
        "samples_per_epoch": samples_per_epoch,
        "models": models,
        "source": "estimated from FLOPs per sample (no profile.json; run `fleet profile` to measure)",
    }


STEPS_FILE = "steps.json"


def load_timed_steps(run_dir: str | Path, spec: Spec) -> dict | None:
    """`run_dir/steps.json` (a job's timed steps, `fleet.profiling.timed_steps`) when it was
    timed for this ensemble (the profile's fingerprint), else None.

    Raises:
        UserError: it is there but not what a job writes (one line naming the file and field).
    """
    path = Path(run_dir) / STEPS_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(document, dict) or document.get("fingerprint") != fingerprint(spec):
        return None  # another ensemble's, or another device's: timed again
    rates = document.get("rates")
    ids = {m.id for m in spec.models}
    if not isinstance(rates, dict) or not all(k in ids and is_positive_number(v) for k, v in rates.items()):
        raise UserError(f"{path}: rates: expected {{model id: samples/s > 0}} for models of the spec")
    for key in ("preprocessing", "hardware"):
        if not isinstance(document.get(key), dict):
            raise UserError(f"{path}: {key}: expected an object")
    _check_group_steps(path, document.get("group_steps"), ids)
    return document


def _check_group_steps(path: Path, block, ids: set[str]) -> None:
    """steps.json's `group_steps`, where there is one (an older steps.json has none): {model id
    of the spec: {trainers >= 1: seconds per step > 0}}."""
    if block is None:
        return
    expected = "expected {model id: {trainers: seconds per step > 0}} for models of the spec"
    if not isinstance(block, dict):
        raise UserError(f"{path}: group_steps: {expected}")
    for model, by_m in block.items():
        if model not in ids or not isinstance(by_m, dict) or not all(
                str(m).isdigit() and int(m) >= 1 and is_positive_number(v) for m, v in by_m.items()):
            raise UserError(f"{path}: group_steps.{str(model)[:60]}: {expected}")


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
