"""What an ensemble holds: per-model size and cost, for `fleet validate` and the planner."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from fleet.engines import ModelStats, get_framework
from fleet.errors import UserCodeError, UserError
from fleet.spec import FAMILIES, ModelSpec, Spec, TrainSpec
from fleet.spec.load import asked_model
from fleet.spec.search import TRAIN_PREFIX, searches_of
from preprocess.readers import class_notices, open_reader

GIB = 2**30

# Each architecture's size and cost, counted once per process: a sweep's models often share
# one (the same net at several learning rates), and a job's rank 0 asks twice (`describe_model`).
_COUNTED: dict[str, ModelStats] = {}


@dataclass(frozen=True)
class ModelRow:
    id: str
    family: str
    key_params: str
    stats: ModelStats


@dataclass(frozen=True)
class EnsembleSummary:
    num_classes: int
    input_shape: tuple[int, int, int]
    rows: list[ModelRow]
    notices: tuple[str, ...] = ()  # what the data set's reader says of its classes (`class_notices`)

    def as_dict(self) -> dict:
        return {
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "models": [
                {"id": r.id, "family": r.family, "key_params": r.key_params, **asdict(r.stats)} for r in self.rows
            ],
        }


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ".".join(str(v) for v in value)
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def family_defaults(family: str) -> dict[str, Any]:
    schema = FAMILIES.get(family)
    return schema().model_dump(mode="json") if schema else {}


def key_params(model: ModelSpec, base_train: TrainSpec) -> str:
    """The parameters and training settings that set this model apart, compactly."""
    defaults = family_defaults(model.family)
    parts = [f"{k}={_fmt(v)}" for k, v in model.params.items() if defaults.get(k, object()) != v]
    base = base_train.model_dump(mode="json")
    train = model.train.model_dump(mode="json")
    parts += [f"{k}={_fmt(v)}" for k, v in train.items() if base.get(k) != v]
    return " ".join(parts) or "(defaults)"


def input_shape(spec: Spec) -> tuple[int, int, int]:
    h, w = spec.data.image_size
    return (spec.data.channels, h, w)


def num_classes(spec: Spec) -> int:
    """Declared in the spec, else read from the data set's labels."""
    return classes_and_notices(spec)[0]


def classes_and_notices(spec: Spec) -> tuple[int, tuple[str, ...]]:
    """The class count (declared in the spec, else read from the data set's labels) and, when
    the data set was read for it, what the user should hear of it (`class_notices`)."""
    if spec.data.classes is not None:
        return spec.data.classes, ()
    reader = open_reader(spec.data, seed=spec.seed)
    try:
        return reader.num_classes, tuple(class_notices(reader))
    finally:
        reader.close()


def available_memory() -> int | None:
    """Bytes of memory this machine can give now without swapping (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _check_fits(model: ModelSpec, shape: tuple[int, int, int], classes: int) -> None:
    """A model whose parameters alone outgrow this machine's memory is refused before it is built."""
    size = get_framework(model.framework).zoo.parameter_bytes(model.family, model.params, shape, classes)
    free = available_memory()
    if size is not None and free is not None and size > free:
        raise UserError(f"its parameters alone take {size / GIB:,.1f} GiB, more than the {free / GIB:,.1f} GiB of "
                        f"memory available here (input {'x'.join(map(str, shape))}, {classes:,} classes)")


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text


def describe_model(spec: Spec, index: int, shape: tuple[int, int, int], classes: int) -> ModelRow:
    """Model `index` of the spec, built once by its framework's zoo to count its size and cost;
    a problem is one line naming the model (``models[2] (tiny-000, mynets:tiny): ...``)."""
    model = spec.models[index]
    try:
        if _count_key(model, shape, classes) not in _COUNTED:  # counted: it fits
            _check_fits(model, shape, classes)
        stats = _counted(model, shape, classes)
    except UserCodeError as exc:
        raise UserError(f"{spec.entry(index)} ({model.id}, {model.family}): {exc.problem}") from None
    except UserError as exc:
        raise UserError(f"{spec.entry(index)} ({model.id}): {exc}") from None
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        raise UserError(f"{spec.entry(index)} ({model.id}): out of memory while building it here") from None
    return ModelRow(model.id, model.family, key_params(model, spec.train), stats)


def _count_key(model: ModelSpec, shape: tuple[int, int, int], classes: int) -> str:
    return json.dumps([model.framework, model.family, model.params, list(shape), classes], sort_keys=True, default=repr)


def _counted(model: ModelSpec, shape: tuple[int, int, int], classes: int) -> ModelStats:
    key = _count_key(model, shape, classes)
    if key not in _COUNTED:
        _COUNTED[key] = get_framework(model.framework).zoo.describe(model.family, model.params, shape, classes)
    return _COUNTED[key]


def ensemble_counts(spec: Spec) -> dict[str, ModelStats]:
    """Each architecture of the spec, counted (`describe_ensemble`), for another process to
    `remember`: a process that has the framework loaded counts for one that has not."""
    summary = describe_ensemble(spec)
    keys = {_count_key(m, summary.input_shape, summary.num_classes) for m in spec.models}
    return {key: _COUNTED[key] for key in keys}


def remember(counts: dict[str, ModelStats]) -> None:
    """Take `ensemble_counts` from another process: `describe_ensemble` then builds nothing."""
    _COUNTED.update(counts)


def describe_ensemble(spec: Spec) -> EnsembleSummary:
    """Each model's size and cost, counted by its framework's zoo."""
    (classes, notices), shape = classes_and_notices(spec), input_shape(spec)
    rows = [describe_model(spec, k, shape, classes) for k in range(len(spec.models))]
    return EnsembleSummary(classes, shape, rows, notices)


def search_costs(spec: Spec, classes: int | None = None) -> dict[str, dict[str, Any]]:
    """Each adaptive search's facts (`fleet.spec.search.searches_of`) with its architectures'
    forward FLOPs per sample, ``flops_per_sample``: ``middle`` (its placeholders', planned
    until asked), ``smallest`` and ``largest`` (estimated: each searched parameter at the end of
    its range, or the item of its choice, with the fewest / most FLOPs, the others at their
    middle; then those ends together); where they cannot be counted here, ``flops_note`` says
    why. `classes`: the data set's, where the caller knows it (else read as `num_classes`)."""
    out = searches_of(spec.models)
    if not out:
        return out
    shape, classes = input_shape(spec), classes or num_classes(spec)
    for facts in out.values():
        placeholder = spec.model(facts["models"][0])
        try:
            facts["flops_per_sample"] = _architecture_flops(placeholder, shape, classes)
        except (UserError, UserCodeError, MemoryError) as exc:
            facts["flops_note"] = str(exc) or type(exc).__name__
    return out


def _architecture_flops(placeholder: ModelSpec, shape: tuple[int, int, int], classes: int) -> dict[str, int]:
    """`search_costs`'s smallest, middle and largest FLOPs per sample of `placeholder`'s space."""
    def flops(values: dict[str, Any]) -> int:
        model = asked_model(placeholder, values)
        if _count_key(model, shape, classes) not in _COUNTED:  # counted: it fits
            _check_fits(model, shape, classes)
        return _counted(model, shape, classes).flops_per_sample

    smallest, largest = {}, {}
    for key, dim in placeholder.search.space.items():
        if key.startswith(TRAIN_PREFIX):
            continue  # training settings: the same architecture
        ends = dim.ends()
        costs = [(flops({key: value}), k) for k, value in enumerate(ends)]
        smallest[key], largest[key] = ends[min(costs)[1]], ends[max(costs)[1]]
    return {"smallest": flops(smallest), "middle": flops({}), "largest": flops(largest)}
