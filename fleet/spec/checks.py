"""Cross-checks between a spec's sections, once each section is valid on its own.

Each names the field to change: a crop larger than the image it crops, a pipeline that ends at
another size than `data.image_size`, a batch larger than the data set, a CNN kernel larger than
the image, a run directory that is a file, early stopping over models that stop on different
metrics or with rungs that do not fit their epochs.
"""

from __future__ import annotations

import os
from pathlib import Path

from fleet.schedule.early_stop import EarlyStopError
from fleet.schedule.planners import GROUP_POLICIES, HOPPING_POLICIES
from fleet.spec._base import SpecError
from fleet.spec.search import ModelSpec, missing_package
from fleet.spec.sections import (
    CenterCropOp,
    DataSpec,
    Fuse,
    NormalizeOp,
    Op,
    RandomCropOp,
    ResizeOp,
    RuntimeSpec,
    Source,
    SchedulerSpec,
    StopMetric,
    TrainSpec,
)


def _pixels(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def _crop_error(i: int, op: Op, before: tuple[int, int], came_from: str) -> SpecError | None:
    """Why crop op `i` cannot cut its size out of a `before` image, or None."""
    size = op.size  # type: ignore[union-attr]
    padding = op.padding if isinstance(op, RandomCropOp) else 0
    room = (before[0] + 2 * padding, before[1] + 2 * padding)
    if size[0] <= room[0] and size[1] <= room[1]:
        return None
    padded = f" padded by {padding}" if padding else ""
    return SpecError(f"preprocess[{i}].size: {op.op.value} of {_pixels(size)} from an image of {_pixels(before)}"
                     f"{padded} ({came_from}); crop at most {_pixels(room)} or resize first")


def _track_sizes(data: DataSpec, ops: tuple[Op, ...]) -> None:
    """Follow the image size through the pipeline, where the source's size is known."""
    size, came_from = data.source_size(), f"the size of source {data.source.value!r}"
    for i, op in enumerate(ops):
        if isinstance(op, ResizeOp):
            size, came_from = op.size or data.image_size, f"the resize at preprocess[{i}]"
            continue
        if not isinstance(op, (CenterCropOp, RandomCropOp)):
            continue
        op = op.model_copy(update={"size": op.size or data.image_size})
        if size is not None and (error := _crop_error(i, op, size, came_from)):
            raise error
        size, came_from = op.size, f"the {op.op.value} at preprocess[{i}]"
    if size is not None and size != data.image_size:
        raise SpecError(f"preprocess: the pipeline ends at {_pixels(size)} ({came_from}) but data.image_size is "
                        f"{_pixels(data.image_size)}; add a resize op")


def check_pipeline(data: DataSpec, ops: tuple[Op, ...]) -> None:
    """Cross-checks between `data` and `preprocess`."""
    if data.source is Source.IMAGEFOLDER and (not ops or ops[0].op.value != "decode"):
        raise SpecError("preprocess: source 'imagefolder' holds encoded images; the first op must be decode")
    sized = [(i, op.size) for i, op in enumerate(ops) if getattr(op, "size", None) is not None]
    if sized and sized[-1][1] != data.image_size:
        (i, (h, w)), (dh, dw) = sized[-1], data.image_size
        raise SpecError(f"preprocess[{i}].size: the pipeline ends at {h}x{w} but data.image_size is {dh}x{dw}")
    _track_sizes(data, ops)
    for i, op in enumerate(ops):
        if not isinstance(op, NormalizeOp):
            continue
        for field in ("mean", "std"):
            count = len(getattr(op, field))
            if count not in (1, data.channels):
                raise SpecError(
                    f"preprocess[{i}].{field}: expected 1 or {data.channels} values (data.channels), got {count}"
                )


def check_data(data: DataSpec) -> None:
    """The data section with its defaults filled: enough synthetic samples for its classes, a
    training split left by the held-out ones, no test split of partitioned data."""
    if data.source is Source.SYNTHETIC and data.samples < data.classes:  # type: ignore[operator]
        raise SpecError(f"data.samples: {data.samples} samples cannot cover {data.classes} classes (data.classes)")
    if data.val_fraction + data.test_fraction >= 1.0:
        raise SpecError(f"data.test_fraction: {data.test_fraction:g} with val_fraction {data.val_fraction:g} leaves "
                        "no sample to train on (their sum must be below 1)")
    if data.test_fraction > 0 and data.partitioned:
        raise SpecError("data.test_fraction: not supported with partitioned data (data.partitioned: true): each node "
                        "splits its own partition; hold a test set out of the data set before partitioning it")


def check_data_path(data: DataSpec) -> DataSpec:
    """The path must exist; store it absolute so a run directory's spec is position-free."""
    if data.path is None:
        return data
    path = Path(os.path.expanduser(data.path))
    if not path.exists():
        raise SpecError(f"data.path: no such file or directory: {data.path}")
    if data.source is Source.IMAGEFOLDER and not path.is_dir():
        raise SpecError(f"data.path: source 'imagefolder' needs a directory of class folders, got a file: {data.path}")
    return data.model_copy(update={"path": str(path.resolve())})


def check_run_dir(run_dir: str, field: str) -> None:
    """The run directory, or the nearest of its parents that exists, must be a directory."""
    path = Path(os.path.expanduser(run_dir))
    for place in (path, *path.parents):
        if place.exists() or place.is_symlink():
            if not place.is_dir():
                what = "is a file" if place == path else f"lies in {place}, which is a file"
                raise SpecError(f"{field}: {run_dir}: {what}, not a directory")
            return


def _check_batch(train: TrainSpec, where: str, data: DataSpec) -> None:
    samples = data.source_samples()
    if samples is not None and train.batch_size > samples:
        raise SpecError(f"{where}.batch_size: {train.batch_size} is more than the {samples} samples of the data set "
                        f"(source {data.source.value!r})")


def _check_kernel(model: ModelSpec, where: str, data: DataSpec) -> None:
    kernel, side = model.params.get("kernel_size"), min(data.image_size)  # type: ignore[type-var]
    if model.family == "cnn" and kernel is not None and kernel > side:
        raise SpecError(f"{where}.params.kernel_size: {kernel} is larger than the {_pixels(data.image_size)} "
                        "image (data.image_size)")


def check_models(data: DataSpec, train: TrainSpec, models: tuple[ModelSpec, ...], entries: tuple[int, ...]) -> None:
    """Each model against the data: its batch size, a CNN's kernel (`entries`: each model's
    item in the spec's `models` list)."""
    _check_batch(train, "train", data)
    for model, entry in zip(models, entries):
        if model.train.batch_size != train.batch_size:
            _check_batch(model.train, f"models[{entry}].train", data)
        _check_kernel(model, f"models[{entry}]", data)


PARTITIONED_GROUP_POLICIES = ("grouped", "auto")
"""The policies that train models of groups on data partitioned by its groups: ``grouped``
(small groups on their part, a sharded group's models visiting its parts), and ``auto``,
which then chooses it."""


def check_hopping(data: DataSpec, scheduler: SchedulerSpec) -> None:
    """Partitioned data needs a policy that plans visits of it (model hopping), or auto; a
    hopping policy needs partitioned data; data partitioned by its groups needs
    `PARTITIONED_GROUP_POLICIES`."""
    if data.partitioned and data.group_by is not None:
        if scheduler.policy not in PARTITIONED_GROUP_POLICIES:
            raise SpecError(f"scheduler.policy: {scheduler.policy!r} does not plan visits of data partitioned by its "
                            f"groups (data.partitioned with data.group_by); use {' or '.join(PARTITIONED_GROUP_POLICIES)}")
        return
    if data.partitioned and scheduler.policy != "auto" and scheduler.policy not in HOPPING_POLICIES:
        raise SpecError(f"scheduler.policy: {scheduler.policy!r} trains on whole data; partitioned data "
                        f"(data.partitioned) needs a hopping policy: {', '.join(HOPPING_POLICIES)}")
    if not data.partitioned and scheduler.policy in HOPPING_POLICIES:
        raise SpecError(f"scheduler.policy: {scheduler.policy!r} moves models between partitions of the data, and "
                        "data.partitioned is false (split the data with: fleet data partition; or choose another "
                        "policy)")


def check_fusion(data: DataSpec, runtime: RuntimeSpec) -> None:
    """`runtime.fuse: always` where no bundle is built: model hopping (partitioned data) and
    learning over groups (`data.group_by`)."""
    if runtime.fuse is not Fuse.ALWAYS:
        return
    if data.partitioned:
        raise SpecError("runtime.fuse: always: bundles are not built for partitioned data (model hopping); use auto "
                        "or never")
    if data.group_by is not None:
        raise SpecError("runtime.fuse: always: bundles are not built for learning over groups (data.group_by); use "
                        "auto or never")


GROUPED_POLICIES = (*GROUP_POLICIES, "baseline")
"""The policies that may train models of groups (`data.group_by`): those of learning over
groups (`GROUP_POLICIES`: ``grouped`` and its baselines ``group-task``, ``model-task``,
``group-parallel``; ``auto`` chooses among these) and ``baseline`` (``model-task`` by its other
name); none ever puts two groups' models in one stream."""


def check_groups(data: DataSpec, models: tuple[ModelSpec, ...], entries: tuple[int, ...]) -> None:
    """A model's `group` (as a resolved spec writes them) needs `data.group_by`, and either
    every model names its group or none does (the configurations are then expanded over the
    groups when the data is read)."""
    grouped = [(model, entry) for model, entry in zip(models, entries) if model.group is not None]
    if grouped and data.group_by is None:
        raise SpecError(f"models[{grouped[0][1]}].group: {grouped[0][0].group!r} needs data.group_by")
    if grouped and len(grouped) < len(models):
        entry = next(e for m, e in zip(models, entries) if m.group is None)
        raise SpecError(f"models[{entry}].group: missing; every model names its group or none does (then each "
                        "configuration is trained on every group of data.group_by)")


def check_grouped_policy(data: DataSpec, scheduler: SchedulerSpec) -> None:
    """Models of groups run only under a policy that never puts two groups in one stream (early
    stopping compares the models of one group at each rung, `fleet.schedule.early_stop`'s
    cohorts; an `ensemble` section makes one ensemble per group)."""
    if data.group_by is not None and scheduler.policy not in (*GROUPED_POLICIES, "auto"):
        raise SpecError(f"scheduler.policy: {scheduler.policy!r} may share a stream between models of different "
                        f"groups; with data.group_by use {', '.join(GROUPED_POLICIES)} or auto")


def _check_one_metric(metric: StopMetric, given: bool, models: tuple[ModelSpec, ...], entries: tuple[int, ...]) -> None:
    """Every model stops on `metric` (`given`: written as `scheduler.early_stop.metric`)."""
    for model, entry in zip(models, entries):
        theirs = model.train.stop.metric
        if theirs is metric:
            continue
        if given:
            raise SpecError(f"scheduler.early_stop.metric: {metric.value}, but models[{entry}] ({model.id}) stops on "
                            f"{theirs.value} (train.stop.metric): early stopping compares every model on one metric")
        raise SpecError(f"models[{entry}].train.stop.metric: {model.id!r} stops on {theirs.value}, but "
                        f"models[{entries[0]}] ({models[0].id}) on {metric.value}: early stopping "
                        "(scheduler.early_stop) compares every model on one metric")


def check_early_stop(scheduler: SchedulerSpec, models: tuple[ModelSpec, ...], entries: tuple[int, ...]) -> SchedulerSpec:
    """Early stopping against the models: one stop metric for all (`early_stop.metric` where
    written), rungs below the largest `max_epochs`, Hyperband's `brackets` within range.

    Returns:
        `scheduler`, its `early_stop.metric` filled in with the models' metric where left out.
    """
    section = scheduler.early_stop
    if section is None or section.method == "none":
        return scheduler
    metric = section.metric or models[0].train.stop.metric
    _check_one_metric(metric, section.metric is not None, models, entries)
    try:
        section.settings(max(model.train.max_epochs for model in models))
    except EarlyStopError as exc:
        raise SpecError(f"scheduler.early_stop.{exc.field}: {exc.problem}") from None
    return scheduler.model_copy(update={"early_stop": section.model_copy(update={"metric": metric})})


SEARCH_EARLY_STOP = ("none", "asha", "median")
"""Early stopping an adaptive search may run with: a rung of ``sha`` or ``hyperband`` would
never fill while the study keeps adding models."""


def check_search(scheduler: SchedulerSpec, models: tuple[ModelSpec, ...], entries: tuple[int, ...]) -> None:
    """An adaptive search (a model with a `search` slot) runs with early stopping of asha or
    median only (over groups: one study per group, `preprocess.grouped`)."""
    searched = [entry for model, entry in zip(models, entries) if model.search is not None]
    if not searched:
        return
    for model, entry in zip(models, entries):
        missing = None if model.search is None else missing_package(model.search.sampler)
        if missing is not None:
            raise SpecError(f"models[{entry}].sampler: {model.search.sampler} needs the package {missing}, which is "
                            f"not installed (pip install {missing})")
    early = scheduler.early_stop
    if early is not None and early.method not in SEARCH_EARLY_STOP:
        raise SpecError(f"scheduler.early_stop: {early.method!r} waits for full rungs, which never fill while an "
                        f"adaptive search adds models; use {', '.join(SEARCH_EARLY_STOP[1:])}")
