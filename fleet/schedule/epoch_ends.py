"""The ends of epochs in the rates that predictions plan with (pure).

A member's epoch does not end with its last step: it then validates (a forward pass over its
validation samples), saves a checkpoint and keeps its best predictions, and takes nothing from
its stream meanwhile. A profile (or a job's timed steps, `fleet.profiling.timed_steps`) times
each model's validation pass on one trainer (``eval_rate``, samples/s, on the same clock as its
steps) and its save (``checkpoint_s``). `with_epoch_ends` lowers each model's rates so that an
epoch of ``n`` training samples lasts what it does in a run::

    n / r(m)  +  n * v / eval_rate  +  checkpoint_s

with ``v`` the validation samples per training sample (the spec's split). A model with no
timed validation takes the median, over those timed, of its one-trainer rate over its
validation rate (the steps cost about the same multiple of a forward pass); one with no timed
save, the median save. Where nothing was timed (an older profile), the rates stay as they are.
An earlier run's measured share of its epochs' ends (`fleet.schedule.calibration`) stands in
for this where there is one.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from fleet.schedule.rates import ModelProfile, RateTable, is_positive_number


def validation_per_sample(val_fraction: float, test_fraction: float = 0.0) -> float:
    """Validation samples per training sample of a split that holds out `val_fraction` and
    `test_fraction` of the data."""
    return val_fraction / max(1e-9, 1.0 - val_fraction - test_fraction)


def with_epoch_ends(table: RateTable, validation: float, scales: Mapping[str, float] | None = None) -> RateTable:
    """`table` (rates in real samples/s) with each model's epoch ends in its rates (see the
    module): `validation` validation samples per training sample; `scales`, a model's
    ``samples_per_epoch`` over its own epoch's training samples (models of groups), 1 where
    absent."""
    steps_per_eval = [p.rates[0] / p.extra["eval_rate"] for p in table.models
                      if is_positive_number(p.extra.get("eval_rate")) and p.rates and p.rates[0] > 0]
    if not steps_per_eval:
        return table
    ratio = statistics.median(steps_per_eval)
    saves = [p.extra["checkpoint_s"] for p in table.models if is_positive_number(p.extra.get("checkpoint_s"))]
    save = statistics.median(saves) if saves else 0.0
    models = []
    for profile in table.models:
        samples = table.samples_per_epoch / (scales or {}).get(profile.id, 1.0)
        models.append(_ended(profile, samples, validation, ratio, save))
    return RateTable(tuple(models), table.gpus_per_node, table.samples_per_epoch, table.extra)


def _ended(profile: ModelProfile, samples: float, validation: float, ratio: float, save: float) -> ModelProfile:
    """`profile` with an epoch of `samples` ending in its validation pass and save."""
    if not profile.rates or not profile.rates[0] > 0:
        return profile
    eval_rate = profile.extra.get("eval_rate")
    eval_rate = eval_rate if is_positive_number(eval_rate) else profile.rates[0] / ratio
    checkpoint = profile.extra.get("checkpoint_s")
    end_s = samples * validation / eval_rate + (checkpoint if is_positive_number(checkpoint) else save)
    rates = tuple(samples / (samples / r + end_s) if r > 0 else r for r in profile.rates)
    return ModelProfile(profile.id, rates, profile.epochs, profile.param_bytes, profile.extra)
