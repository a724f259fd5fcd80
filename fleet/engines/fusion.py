"""Which models may train as one fused bundle (`fleet.engines.torch.fused.FusedTorchEngine`),
and why not: pure functions of `ModelSpec`s, no framework imported.

A bundle stacks its members' weights and runs one vectorised forward and backward
(``torch.func.vmap``) over the batch they share, so its members must be one network: the same
zoo family with the same parameters (after the family's defaults are filled in), on torch. They
also share one optimizer step over the stacked tensors, so one optimizer kind, and one batch
(the same batch size). What may differ: learning rate, momentum, weight decay, LR schedule,
epochs, stop rule and seed (each member keeps its own).

Each function returns None when fusion is allowed, else one line saying why not, for the
console and for a planner's record (the planner itself imports no engine: the runtime asks
here and hands it the answer).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.errors import UserError
from fleet.spec.families import family_params, is_user_family
from fleet.spec.search import ModelSpec

FUSED_FRAMEWORK = "torch"
FUSABLE_FAMILIES = ("mlp", "cnn", "resnet", "densenet")
UNFUSABLE_FAMILIES = {
    "lstm": "torch.func.vmap has no batching rule for aten::lstm (the fused LSTM kernel), so a bundle "
            "of LSTMs cannot run as one vectorised forward",
}


def family_refusal(family: str) -> str | None:
    """Why models of `family` never fuse (None: they may, with their own kind).

    User models (``package.module:function``) are refused: their code is not known to be
    vmap-safe, nor to draw its randomness from the per-model generator a bundle gives each member.
    """
    if is_user_family(family):
        return (f"family {family!r} is a user model: its code is not known to run under torch.func.vmap "
                "or to draw randomness only from fleet's per-model generator")
    if family in UNFUSABLE_FAMILIES:
        return f"family {family!r}: {UNFUSABLE_FAMILIES[family]}"
    if family not in FUSABLE_FAMILIES:
        return f"family {family!r} is not one of the fusable families ({', '.join(FUSABLE_FAMILIES)})"
    return None


def model_refusal(model: ModelSpec) -> str | None:
    """Why `model` can join no bundle at all (its framework or its family), else None."""
    if model.framework != FUSED_FRAMEWORK:
        return f"model {model.id!r} runs on {model.framework}: only torch models fuse"
    reason = family_refusal(model.family)
    return f"model {model.id!r}: {reason}" if reason else None


def architecture(model: ModelSpec) -> tuple:
    """The model's network as a hashable value: family and its params with defaults filled in.

    Raises:
        UserError: the params are not valid for the family.
    """
    params = family_params(model.family, model.params)
    return model.family, tuple(sorted((key, repr(value)) for key, value in params.items()))


def fusion_key(model: ModelSpec) -> tuple | None:
    """What members of one bundle share (architecture, optimizer kind, batch size); None when
    the model fuses with no other (see `model_refusal`)."""
    if model_refusal(model):
        return None
    return architecture(model), model.train.optimizer.value, model.train.batch_size


def fusion_text(model: ModelSpec) -> str:
    """`fusion_key` as a line for people: ``cnn(channels=[8, 16], hidden=32), sgd, batch 32``."""
    family, params = architecture(model)
    shown = ", ".join(f"{key}={value}" for key, value in params)
    return f"{family}({shown}), {model.train.optimizer.value}, batch {model.train.batch_size}"


def pair_refusal(first: ModelSpec, other: ModelSpec) -> str | None:
    """Why `other` cannot join a bundle with `first` (each fusable on its own), else None."""
    if first.family != other.family:
        return f"models {first.id!r} and {other.id!r} are of families {first.family!r} and {other.family!r}"
    ours, theirs = dict(architecture(first)[1]), dict(architecture(other)[1])
    differing = sorted(key for key in ours if ours[key] != theirs.get(key))
    if differing:
        return f"models {first.id!r} and {other.id!r} differ in params: {', '.join(differing)}"
    if first.train.optimizer is not other.train.optimizer:
        return (f"models {first.id!r} and {other.id!r} use optimizers {first.train.optimizer.value} and "
                f"{other.train.optimizer.value}")
    if first.train.batch_size != other.train.batch_size:
        return (f"models {first.id!r} and {other.id!r} have batch sizes {first.train.batch_size} and "
                f"{other.train.batch_size}")
    return None


def bundle_refusal(models: Sequence[ModelSpec]) -> str | None:
    """Why `models` cannot train as one bundle, else None (a bundle of one is allowed)."""
    if not models:
        return "a bundle needs at least one member"
    ids = [model.id for model in models]
    repeated = sorted({model_id for model_id in ids if ids.count(model_id) > 1})
    if repeated:
        return f"model {repeated[0]!r} appears twice in the bundle"
    for model in models:
        reason = model_refusal(model)
        if reason:
            return reason
    try:
        return next((reason for other in models[1:] if (reason := pair_refusal(models[0], other))), None)
    except UserError as exc:
        return str(exc)


def fusable_groups(models: Sequence[ModelSpec]) -> list[list[str]]:
    """The models' ids grouped by what fusion needs them to share, in first-seen order; a model
    that fuses with no other is a group of its own."""
    groups: dict[object, list[str]] = {}
    for model in models:
        key = fusion_key(model)
        groups.setdefault(key if key is not None else ("alone", model.id), []).append(model.id)
    return list(groups.values())
