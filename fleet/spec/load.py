"""YAML -> frozen, validated `Spec`. Every problem becomes one `SpecError` line naming its field."""

from __future__ import annotations

import os
import sys
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from fleet.spec._base import Section, SpecError, format_validation_error, shown, valid_keys, yaml_path
from fleet.schedule.early_stop import EarlyStopSettings
from fleet.spec.checks import (
    check_data,
    check_data_path,
    check_early_stop,
    check_fusion,
    check_groups,
    check_grouped_policy,
    check_hopping,
    check_models,
    check_pipeline,
    check_run_dir,
    check_search,
)
from fleet.spec.families import FAMILIES, family_error, is_user_family
from fleet.engines.registry import DEFAULT_FRAMEWORK
from fleet.spec.search import (
    ID_PATTERN,
    MAX_MODELS,
    ModelEntry,
    ModelSpec,
    check_framework,
    model_ids,
    model_seed,
    split_train_keys,
)
from fleet.spec.sections import (
    OPS,
    ClusterSpec,
    DataSpec,
    EarlyStopSpec,
    EnsembleSpec,
    Op,
    RuntimeSpec,
    SchedulerSpec,
    TrainSpec,
)
from fleet.spec.yamlfile import read_yaml


def validate(model: type[Section], data: Any, loc: tuple[Any, ...]) -> Any:
    """`model.model_validate(data)`, with errors as one `SpecError` line under `loc`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, loc)) from None


class RawSpec(Section):
    """The document as written: `models` and `preprocess` still unexpanded."""

    name: str
    seed: int = Field(0, ge=0, le=2**32 - 1)  # numpy's generators take seeds of 32 bits
    run_dir: str | None = None
    framework: str = DEFAULT_FRAMEWORK
    data: dict[str, Any]
    preprocess: list[Any] = []
    models: list[Any]
    train: dict[str, Any] = {}
    scheduler: dict[str, Any] = {}
    cluster: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    ensemble: dict[str, Any] | None = None

    _framework = field_validator("framework")(lambda cls, v: check_framework(v))


class Spec(Section):
    """A whole ensemble, validated and expanded. Build it with `load_spec` or `parse_spec`.

    `framework` is the ensemble's default; each model's own is `ModelSpec.framework`.
    """

    name: str
    seed: int
    run_dir: str
    framework: str
    data: DataSpec
    preprocess: tuple[Op, ...]
    models: tuple[ModelSpec, ...]
    train: TrainSpec
    scheduler: SchedulerSpec
    cluster: ClusterSpec
    runtime: RuntimeSpec
    ensemble: EnsembleSpec | None = None
    entries: tuple[int, ...] = Field((), exclude=True, repr=False)
    """Each model's item in the written spec's `models` list (error messages name it); not part
    of what the spec means: equal specs may write their models differently."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Spec):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]  # holds mappings

    def entry(self, index: int) -> str:
        """Where the spec wrote model `index` of `models`: ``models[2]``."""
        return f"models[{self.entries[index] if index < len(self.entries) else index}]"

    def model(self, model_id: str) -> ModelSpec:
        for m in self.models:
            if m.id == model_id:
                return m
        raise KeyError(model_id)

    def early_stop_settings(self) -> EarlyStopSettings:
        """The run's early stopping: `scheduler.early_stop` (method ``none`` where the spec has
        none) over rungs below the largest `max_epochs` of the models."""
        section = self.scheduler.early_stop or EarlyStopSpec()
        return section.settings(max(model.train.max_epochs for model in self.models))

    def resolved(self) -> dict[str, Any]:
        """A plain document that `parse_spec` turns back into this very spec."""
        doc = self.model_dump(mode="json", by_alias=True, exclude={"models"})
        doc["models"] = [
            {"name": m.id, "family": m.family, "params": m.params, "train": m.train.model_dump(mode="json"),
             **({"framework": m.framework} if m.framework != self.framework else {}),
             **({"group": m.group} if m.group is not None else {}),
             **({"slot": m.search.model_dump(mode="json", by_alias=True, exclude_none=True)} if m.search else {})}
            for m in self.models
        ]
        return doc

    def with_models(self, models: dict[str, ModelSpec]) -> "Spec":
        """This spec with the models of `models`' ids replaced (a search's asked models)."""
        return self.model_copy(update={"models": tuple(models.get(m.id, m) for m in self.models)})

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.resolved(), sort_keys=False)


def parse_op(item: Any, index: int) -> Op:
    """`decode`, `{resize: {size: 32}}` or `{op: resize, size: 32}` -> an Op."""
    loc = ("preprocess", index)
    if isinstance(item, str):
        name, params = item, {}
    elif isinstance(item, dict) and "op" in item:
        name, params = item["op"], {k: v for k, v in item.items() if k != "op"}
    elif isinstance(item, dict) and len(item) == 1:
        name, params = next(iter(item.items()))
        params = {} if params is None else params
        loc += (name,)
    else:
        raise SpecError(f"{yaml_path(loc)}: expected an op name or {{op_name: {{params}}}}, got {shown(item)}")
    if name not in OPS:
        raise SpecError(f"{yaml_path(loc)}: unknown op {name!r} (valid: {', '.join(OPS)})")
    if not isinstance(params, dict):
        raise SpecError(f"{yaml_path(loc)}: expected a mapping of parameters, got {shown(params)}")
    return validate(OPS[name], params, loc)


def _check_family(entry: ModelEntry, index: int) -> None:
    if entry.family not in FAMILIES and not is_user_family(entry.family):
        raise SpecError(f"models[{index}].family: {family_error(entry.family)}")


def _concrete_params(entry: ModelEntry, index: int, drawn: dict[str, Any]) -> dict[str, Any]:
    params = {**entry.params, **drawn}
    if is_user_family(entry.family):
        return params
    schema = FAMILIES[entry.family]
    try:
        return schema.model_validate(params).model_dump(mode="json")
    except ValidationError as exc:
        key = exc.errors()[0]["loc"][:1]
        where = "search" if key and key[0] in drawn else "params"
        message = format_validation_error(exc, ("models", index, where))
        raise SpecError(message + (" (drawn from the search space)" if where == "search" else "")) from None


def _model_train(entry: ModelEntry, index: int, base: TrainSpec, drawn: dict[str, Any]) -> TrainSpec:
    overrides = {**entry.train, **drawn}
    if not overrides:
        return base
    merged = {**base.model_dump(mode="json"), **overrides}
    where = "search" if drawn else "train"
    return validate(TrainSpec, merged, ("models", index, where))


def expand_models(
    raw_models: list[Any], train: TrainSpec, seed: int, framework: str = DEFAULT_FRAMEWORK
) -> tuple[tuple[ModelSpec, ...], tuple[int, ...]]:
    """Expand every entry's search space into concrete, validated models with unique ids
    (`framework`: the ensemble's, for entries that name none); with each model's entry."""
    if not raw_models:
        raise SpecError("models: the ensemble is empty; list at least one model")
    if len(raw_models) > MAX_MODELS:
        raise SpecError(f"models: {len(raw_models)} entries (at most {MAX_MODELS} models)")
    entries = [validate(ModelEntry, item, ("models", i)) for i, item in enumerate(raw_models)]
    for i, entry in enumerate(entries):
        _check_family(entry, i)
    sizes = [entry.size() for entry in entries]
    if sum(sizes) > MAX_MODELS:
        raise SpecError(f"models: the search spaces expand to {sum(sizes)} models (at most {MAX_MODELS})")
    seen: dict[str, int] = {}
    out, origins = [], []
    all_ids = model_ids(entries, sizes)
    studies = _study_names(entries, all_ids)
    for i, (entry, ids) in enumerate(zip(entries, all_ids)):
        for k, (model_id, drawn) in enumerate(zip(ids, entry.draws(seed, i))):
            if model_id in seen:
                raise SpecError(f"models[{i}].name: id {model_id!r} is already used by models[{seen[model_id]}]")
            seen[model_id] = i
            origins.append(i)
            params_drawn, train_drawn = split_train_keys(drawn)
            out.append(
                ModelSpec(
                    id=model_id,
                    family=entry.family,
                    params=_concrete_params(entry, i, params_drawn),
                    train=_model_train(entry, i, train, train_drawn),
                    seed=model_seed(seed, model_id),
                    framework=entry.framework or framework,
                    group=entry.group,
                    search=entry.slot_of(studies[i], k) if entry.adaptive else entry.slot,
                )
            )
    return tuple(out), tuple(origins)


def _study_names(entries: list[ModelEntry], ids: list[list[str]]) -> dict[int, str]:
    """Each adaptive entry's study: its models' id prefix (``tpe`` of ``tpe-000``), unique."""
    names: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.adaptive:
            name = ids[i][0].rsplit("-", 1)[0]
            if name in names:
                raise SpecError(f"models[{i}].name: the searches of models[{names[name]}] and models[{i}] would share "
                                f"study {name!r}; name each entry")
            names[name] = i
    return {i: name for name, i in names.items()}


def asked_model(model: ModelSpec, values: dict[str, Any]) -> ModelSpec:
    """Placeholder `model` with the searched `values` its study asked (``train.<field>`` keys
    set its training); raises `SpecError` where the family refuses them."""
    params_drawn, train_drawn = split_train_keys(values)
    params = {**model.params, **params_drawn}
    if not is_user_family(model.family):
        try:
            params = FAMILIES[model.family].model_validate(params).model_dump(mode="json")
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc, (model.id, "search")) + " (asked by its study)") from None
    train = model.train
    if train_drawn:
        train = validate(TrainSpec, {**train.model_dump(mode="json"), **train_drawn}, (model.id, "search"))
    return model.model_copy(update={"params": params, "train": train})


def parse_spec(doc: Any, *, run_dir: str | None = None, check_paths: bool = True) -> Spec:
    """Validate a parsed YAML document into a `Spec` (raises `SpecError`)."""
    if not isinstance(doc, dict):
        raise SpecError(f"spec: expected a mapping with keys {', '.join(valid_keys(RawSpec))}, got {shown(doc)}")
    raw = validate(RawSpec, doc, ())
    if not ID_PATTERN.match(raw.name):
        raise SpecError(f"name: {raw.name!r}: use letters, digits, '_', '.', '-' (it names files)")
    data = validate(DataSpec, raw.data, ("data",)).defaults_filled()
    check_data(data)
    run_dir_used = run_dir or raw.run_dir or os.path.join("runs", raw.name)
    if check_paths:
        data = check_data_path(data)
        check_run_dir(run_dir_used, "--run-dir" if run_dir else "run_dir")
    ops = tuple(parse_op(item, i) for i, item in enumerate(raw.preprocess))
    check_pipeline(data, ops)
    train = validate(TrainSpec, raw.train, ("train",))
    models, entries = expand_models(raw.models, train, raw.seed, raw.framework)
    check_models(data, train, models, entries)
    check_groups(data, models, entries)
    scheduler = check_early_stop(validate(SchedulerSpec, raw.scheduler, ("scheduler",)), models, entries)
    check_hopping(data, scheduler)
    check_search(scheduler, models, entries)
    check_grouped_policy(data, scheduler)
    runtime = validate(RuntimeSpec, raw.runtime, ("runtime",))
    check_fusion(data, runtime)
    return Spec(
        name=raw.name,
        seed=raw.seed,
        run_dir=run_dir_used,
        framework=raw.framework,
        data=data,
        preprocess=ops,
        models=models,
        train=train,
        scheduler=scheduler,
        cluster=validate(ClusterSpec, raw.cluster, ("cluster",)),
        runtime=runtime,
        ensemble=None if raw.ensemble is None else validate(EnsembleSpec, raw.ensemble, ("ensemble",)),
        entries=entries,
    )


def load_spec(path: str | os.PathLike, *, run_dir: str | None = None, check_paths: bool = True) -> Spec:
    """Read and validate a spec file; `run_dir` overrides the spec's own.

    The spec's folder and the working directory become importable (`make_importable`), so that
    a user model (``family: mynets:tiny``) in a ``mynets.py`` beside the spec, or in the folder
    fleet runs from, is found in every process that reads the spec: each rank, the profiler,
    a batch job's ranks (which read the spec by its absolute path).
    """
    make_importable(os.path.dirname(os.path.abspath(path)), os.getcwd())
    return parse_spec(read_yaml(path), run_dir=run_dir, check_paths=check_paths)


def make_importable(*folders: str) -> None:
    """Append `folders` to ``sys.path`` where they are not on it yet.

    Appended, not put first: a user's module never shadows a module of the standard library
    or of an installed package (`python -m` puts the working directory first; the `fleet`
    console script puts its own bin/ folder there, and the working directory nowhere).
    """
    for folder in folders:
        if folder not in sys.path and os.path.abspath(folder) not in map(os.path.abspath, filter(None, sys.path)):
            sys.path.append(folder)
