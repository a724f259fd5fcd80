"""The ensemble spec's sections, except `models` (see `search.py`)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fleet.runtime.train.collectives import kinds as collective_kinds
from fleet.schedule import Policy
from fleet.schedule.choice import AUTO
from fleet.schedule.early_stop import METHODS as EARLY_STOP_METHODS, EarlyStopSettings
from fleet.schedule.options import OptionError
from fleet.schedule.planners import POLICIES as POLICY_REGISTRY, create_policy, policy_class, policy_options
from fleet.spec._base import Section, at_most, field_error, shown, valid_keys

POLICIES = tuple(POLICY_REGISTRY)  # the registry's names: `scheduler.policy` takes one of them
AUTO_CHUNK_BYTES = 2 << 20  # a chunk this size amortises the per-chunk work of the data path
MAX_SIDE = 4096  # pixels a side of an image may have (a 4096x4096 RGB sample is 200 MB as float32)
DIGITS_SIZE, DIGITS_SAMPLES = (8, 8), 1797  # scikit-learn's digits: 1,797 images of 8x8


class Source(str, Enum):
    """The `data.source` names: the one list, each with its reader in `preprocess.readers.READERS`."""

    SYNTHETIC = "synthetic"
    IMAGEFOLDER = "imagefolder"
    HDF5 = "hdf5"
    DIGITS = "digits"


class Device(str, Enum):
    CUDA = "cuda"
    CPU = "cpu"
    EMULATED = "emulated"


def _size_pair(value: Any) -> tuple[int, int]:
    """An image size: one positive integer (square) or [height, width], each at most `MAX_SIDE`."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        pair = (value, value)
    elif (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        pair = (value[0], value[1])
    else:
        raise ValueError(f"expected a positive integer or [height, width], got {shown(value)}")
    if max(pair) > MAX_SIDE:
        raise ValueError(f"at most {MAX_SIDE} pixels a side (a larger image is beyond what a model is built "
                         f"for here), got {pair[0]}x{pair[1]}")
    return pair


MIN_GROUP_SAMPLES = 20
"""`data.min_group_samples`' default: a smaller group is skipped (too few to split and train)."""


class GroupBy(Section):
    """`data.group_by: {dataset: NAME}`: each sample's group key, from the HDF5 dataset NAME."""

    dataset: str = Field(min_length=1)


class DataSpec(Section):
    """Where the samples come from and what the models see (`image_size` x `channels`)."""

    source: Source
    path: str | None = None
    image_size: tuple[int, int] | None = None
    channels: Literal[1, 3] | None = None
    classes: Annotated[int, at_most(1_000_000, "every model's output layer has one unit per class")] | None = \
        Field(None, ge=2)
    samples: Annotated[PositiveInt, at_most(10_000_000, "synthetic samples are drawn in memory")] | None = None
    val_fraction: float = Field(0.1, gt=0.0, lt=1.0)
    test_fraction: float = Field(0.0, ge=0.0, lt=0.5)
    partitioned: bool = False
    validation: Literal["all", "local"] = "all"
    group_by: GroupBy | Literal["directory"] | None = None
    min_group_samples: PositiveInt = MIN_GROUP_SAMPLES

    @field_validator("image_size", mode="before")
    @classmethod
    def _image_size(cls, value: Any) -> tuple[int, int] | None:
        return None if value is None else _size_pair(value)

    @field_validator("validation")
    @classmethod
    def _local_needs_partitions(cls, value: str, info: ValidationInfo) -> str:
        if value == "local" and not info.data.get("partitioned"):
            raise ValueError("'local' applies to partitioned data only (data.partitioned: true)")
        return value

    @model_validator(mode="after")
    def _source_fields(self) -> "DataSpec":
        needs_path = self.source in (Source.IMAGEFOLDER, Source.HDF5)
        if needs_path and not self.path:
            raise ValueError(f"source {self.source.value!r} needs data.path")
        if not needs_path and self.path:
            raise ValueError(f"source {self.source.value!r} takes no path (got {self.path!r})")
        if self.samples is not None and self.source is not Source.SYNTHETIC:
            raise ValueError("data.samples applies to source 'synthetic' only")
        return self

    @field_validator("group_by", mode="before")
    @classmethod
    def _group_form(cls, value: Any) -> Any:
        """``directory``, or ``{dataset: NAME}`` with a name."""
        if value is None or value == "directory":
            return value
        name = value.get("dataset") if isinstance(value, dict) and set(value) == {"dataset"} else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"expected directory or {{dataset: NAME}}, got {shown(value)}")
        return GroupBy(dataset=name)

    @model_validator(mode="after")
    def _group_source(self) -> "DataSpec":
        """`group_by: {dataset: NAME}` reads an HDF5 dataset; `directory`, an image folder's top level."""
        wanted = {None: None, "directory": Source.IMAGEFOLDER}.get(self.group_by, Source.HDF5)  # type: ignore[arg-type]
        if wanted is not None and self.source is not wanted:
            form = "directory" if self.group_by == "directory" else "{dataset: NAME}"
            raise field_error("group_by", f"{form} needs source {wanted.value!r}, got {self.source.value!r}")
        return self

    def defaults_filled(self) -> "DataSpec":
        """Fill the per-source defaults (digits: 8x8 grey, 10 classes; others 32x32 RGB)."""
        digits = self.source is Source.DIGITS
        fill = {
            "image_size": self.image_size or ((8, 8) if digits else (32, 32)),
            "channels": self.channels or (1 if digits else 3),
        }
        if self.classes is None and self.source in (Source.DIGITS, Source.SYNTHETIC):
            fill["classes"] = 10
        if self.source is Source.SYNTHETIC and self.samples is None:
            fill["samples"] = 2000
        return self.model_copy(update=fill)

    def source_size(self) -> tuple[int, int] | None:
        """(H, W) of the images the source gives, where the spec knows it (digits, synthetic)."""
        if self.source is Source.DIGITS:
            return DIGITS_SIZE
        return self.image_size if self.source is Source.SYNTHETIC else None

    def source_samples(self) -> int | None:
        """How many samples the data set holds, where the spec knows it (digits, synthetic)."""
        if self.source is Source.DIGITS:
            return DIGITS_SAMPLES
        return self.samples if self.source is Source.SYNTHETIC else None


class OpName(str, Enum):
    DECODE = "decode"
    RESIZE = "resize"
    CENTER_CROP = "center_crop"
    RANDOM_CROP = "random_crop"
    FLIP = "flip"
    NORMALIZE = "normalize"


class DecodeOp(Section):
    op: Literal[OpName.DECODE] = OpName.DECODE


class ResizeOp(Section):
    op: Literal[OpName.RESIZE] = OpName.RESIZE
    size: tuple[int, int] | None = None

    _size = field_validator("size", mode="before")(lambda cls, v: None if v is None else _size_pair(v))


class CenterCropOp(Section):
    op: Literal[OpName.CENTER_CROP] = OpName.CENTER_CROP
    size: tuple[int, int] | None = None

    _size = field_validator("size", mode="before")(lambda cls, v: None if v is None else _size_pair(v))


class RandomCropOp(Section):
    """Pad by `padding` pixels, then crop `size` at a random place (training only)."""

    op: Literal[OpName.RANDOM_CROP] = OpName.RANDOM_CROP
    size: tuple[int, int] | None = None
    padding: NonNegativeInt = 0

    _size = field_validator("size", mode="before")(lambda cls, v: None if v is None else _size_pair(v))


class FlipOp(Section):
    """Horizontal flip with probability `p` (training only)."""

    op: Literal[OpName.FLIP] = OpName.FLIP
    p: float = Field(0.5, ge=0.0, le=1.0)


class NormalizeOp(Section):
    """Scale to [0, 1], then (x - mean) / std per channel."""

    op: Literal[OpName.NORMALIZE] = OpName.NORMALIZE
    mean: tuple[float, ...] = (0.5,)
    std: tuple[PositiveFloat, ...] = (0.25,)


OPS: dict[str, type[Section]] = {
    OpName.DECODE.value: DecodeOp,
    OpName.RESIZE.value: ResizeOp,
    OpName.CENTER_CROP.value: CenterCropOp,
    OpName.RANDOM_CROP.value: RandomCropOp,
    OpName.FLIP.value: FlipOp,
    OpName.NORMALIZE.value: NormalizeOp,
}

Op = DecodeOp | ResizeOp | CenterCropOp | RandomCropOp | FlipOp | NormalizeOp


class Optimizer(str, Enum):
    SGD = "sgd"
    ADAM = "adam"
    ADAMW = "adamw"


class ScheduleKind(str, Enum):
    CONSTANT = "constant"
    COSINE = "cosine"
    STEP = "step"


class LRSchedule(Section):
    """Learning-rate schedule over epochs; `step` multiplies by `gamma` every `step_epochs`."""

    kind: ScheduleKind = ScheduleKind.CONSTANT
    warmup_epochs: NonNegativeInt = 0
    step_epochs: PositiveInt = 10
    gamma: float = Field(0.1, gt=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"kind": data} if isinstance(data, str) else data


class StopMetric(str, Enum):
    VAL_ACCURACY = "val_accuracy"
    VAL_LOSS = "val_loss"


class StopRule(Section):
    """A model converges when `metric` has not improved by `min_delta` for `patience` epochs,
    or reaches `target`, or has trained `max_epochs`."""

    patience: PositiveInt = 3
    min_delta: float = Field(0.0, ge=0.0)
    metric: StopMetric = StopMetric.VAL_ACCURACY
    target: float | None = None

    @model_validator(mode="after")
    def _reachable_target(self) -> "StopRule":
        accuracy = self.metric is StopMetric.VAL_ACCURACY
        if self.target is not None and (not 0 < self.target <= 1 if accuracy else self.target < 0):
            limits = "an accuracy lies in (0, 1]" if accuracy else "a loss is not negative"
            raise field_error("target", f"{self.target:g} can never be reached: {limits} (metric {self.metric.value})")
        return self


class TrainSpec(Section):
    optimizer: Optimizer = Optimizer.SGD
    lr: PositiveFloat = 0.05
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(5e-4, ge=0.0)
    schedule: LRSchedule = LRSchedule()
    batch_size: Annotated[PositiveInt, at_most(65_536, "a batch is allocated whole on every trainer")] = 32
    max_epochs: PositiveInt = 10
    stop: StopRule = StopRule()


METHOD_KEYS = {"brackets": "hyperband", "grace_epochs": "median", "min_models": "median"}
"""The `early_stop` keys that belong to one method, and that method."""


class EarlyStopSpec(Section):
    """Early stopping across models (`fleet.schedule.early_stop`): rungs at `min_epochs` x
    `reduction`^k epochs, the method deciding who trains on past each.

    `metric` defaults to the models' stop metric (filled in by the spec's cross-checks, which
    also want every model on one metric, `min_epochs` below the largest `max_epochs` and
    `brackets` within Hyperband's range). A key of one method (`brackets`: hyperband;
    `grace_epochs`, `min_models`: median) is an error with another; left out, it takes the
    method's default (`EarlyStopSettings`). ``early_stop: asha`` is short for ``{method: asha}``.
    """

    method: str = "none"  # a name in the methods' registry (checked below)
    min_epochs: PositiveInt = 1
    reduction: float = Field(3.0, gt=1)
    metric: StopMetric | None = None
    brackets: PositiveInt | None = None
    grace_epochs: NonNegativeInt | None = None
    min_models: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"method": data}
        if not isinstance(data, (dict, EarlyStopSpec)):
            raise ValueError(f"expected a method ({', '.join(EARLY_STOP_METHODS)}) or a mapping, got {shown(data)}")
        return data

    @field_validator("method")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in EARLY_STOP_METHODS:
            raise ValueError(f"unknown method {name!r} (valid: {', '.join(EARLY_STOP_METHODS)})")
        return name

    @model_validator(mode="after")
    def _keys_of_the_method(self) -> "EarlyStopSpec":
        for key, method in METHOD_KEYS.items():
            if getattr(self, key) is not None and self.method != method:
                raise field_error(key, f"applies to method {method} only (method: {self.method})")
        return self

    @model_serializer(mode="wrap")
    def _defaults_left_out(self, handler: Any) -> dict[str, Any]:
        """Written as read: a key left at its method's default (null) is not written."""
        return {key: value for key, value in handler(self).items() if value is not None}

    def settings(self, max_epochs: int) -> EarlyStopSettings:
        """The settings the driver runs with, for an ensemble whose largest `max_epochs` is this.

        Raises:
            EarlyStopError: a value the settings refuse (naming the field).
        """
        given = {key: getattr(self, key) for key in METHOD_KEYS if getattr(self, key) is not None}
        return EarlyStopSettings(self.method, max_epochs, min_epochs=self.min_epochs, reduction=self.reduction,
                                 **given)


class SchedulerSpec(Section):
    """How models share GPUs and data: the policy, its options, and the profiling pass.

    A policy's options (its ``Options`` in `fleet.schedule.planners`, e.g. fleet-g's `alpha`
    and `delta`) are written beside `policy`; those not written take the policy's defaults,
    and an option the policy does not take is an error naming it. `options` holds them all,
    checked by the policy's own declaration. ``auto`` (the default) runs the policy predicted
    to finish first (`fleet.schedule.choice`), with its defaults: it takes no options.
    """

    policy: str = AUTO  # auto, or a name in the policies' registry (checked below, so a new entry counts)
    options: dict[str, Any] = {}
    # measure rates first when the run directory has no matching profile.json: true, always; auto,
    # when that costs little beside the training it plans (fleet.profiling.plan.profiling_verdict)
    profile: bool | Literal["auto"] = "auto"
    profile_batches: PositiveInt = 48
    profile_timed: PositiveInt = 20
    early_stop: EarlyStopSpec | None = None  # none: every model trains until its own stop rule ends it

    @field_validator("profile", mode="before")
    @classmethod
    def _profile_choice(cls, value: Any) -> Any:
        if isinstance(value, bool) or value == "auto":
            return value
        raise ValueError(f"expected true, false or auto, got {value!r}")

    @model_validator(mode="before")
    @classmethod
    def _gather_options(cls, data: Any) -> Any:
        """Move the keys beside `policy` that are not fields into `options`, checked by the
        policy (only when `policy` names one; a bad name fails on its own)."""
        if not isinstance(data, dict):
            return data
        own = set(cls.model_fields) - {"options"}
        name = data.get("policy", cls.model_fields["policy"].default)
        written = {key: value for key, value in data.items() if key not in own}
        rest = {key: value for key, value in data.items() if key in own}
        if name == AUTO and written:
            _known_keys(cls, written)
            raise field_error(next(iter(written)), "policy auto (the default) takes no options: name the policy "
                                                   "they are for (e.g. policy: fleet-g)")
        if not (isinstance(name, str) and name in POLICY_REGISTRY):
            return {**rest, "options": written}
        return {**rest, "options": _checked_options(name, written)}

    @field_validator("policy")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name != AUTO and name not in POLICY_REGISTRY:
            raise ValueError(f"unknown policy {name!r} (valid: {AUTO}, {', '.join(POLICY_REGISTRY)})")
        return name

    @model_serializer(mode="wrap")
    def _options_beside_policy(self, handler: Any) -> dict[str, Any]:
        """Written as read: the options beside `policy`, not under a key of their own."""
        data = handler(self)
        head = {"policy": data.pop("policy")} if "policy" in data else {}
        if data.get("early_stop", ...) is None:  # a spec without early stopping is written as before
            del data["early_stop"]
        return {**head, **data.pop("options", {}), **data}

    @model_validator(mode="after")
    def _timed_within_batches(self) -> "SchedulerSpec":
        if self.profile_timed >= self.profile_batches:
            raise ValueError(
                f"profile_timed ({self.profile_timed}) must be below profile_batches "
                f"({self.profile_batches}): the first batches warm up"
            )
        return self

    def create_policy(self, seed: int, name: str | None = None) -> Policy:
        """A new policy object: this section's policy with its options, or the policy
        ``name`` -- with these options when it is this section's policy, else its defaults.

        Every command that has a spec builds its policy here (``fleet run``, ``fleet
        profile``'s predictions, ``fleet plan --spec``).
        """
        name = self.policy if name is None else name
        if name == AUTO:
            raise ValueError("policy auto is a choice among policies: choose one first (fleet.schedule.choice)")
        return create_policy(name, seed=seed, **(self.options if name == self.policy else {}))


def _known_keys(section: type, written: dict[Any, Any], taken: tuple[str, ...] = ()) -> None:
    """Raise for a key beside `policy` that is no field and no policy's option."""
    for key in written:
        if not any(key in cls.Options.names() for cls in POLICY_REGISTRY.values()):
            valid = sorted({*valid_keys(section), *taken} - {"options"})
            raise PydanticCustomError("unknown_key", "unknown key (valid keys: {valid})",
                                      {"key": str(key), "valid": ", ".join(valid)})


def _checked_options(policy: str, written: dict[Any, Any]) -> dict[str, Any]:
    """The options of `policy`, `written` ones checked and the others at their defaults."""
    _known_keys(SchedulerSpec, written, tuple(policy_class(policy).Options.names()))
    try:
        return policy_options(policy, written).as_dict()
    except OptionError as exc:
        raise field_error(exc.option, exc.problem) from None


class ClusterSpec(Section):
    """The allocation: nodes x GPUs (trainer slots) plus CPU preprocessor ranks per node."""

    nodes: Annotated[PositiveInt, at_most(10_000, "the largest GPU machines have about 10,000 nodes; fleet run "
                                              "starts a rank per GPU and per preprocessor on each")] = 1
    gpus_per_node: int = Field(1, ge=1, le=64)
    preprocessors_per_node: int | str = 1
    device: Device = Device.CPU
    virtual_nodes: bool = False
    threads_per_trainer: Annotated[PositiveInt, at_most(256, "the cores of a node")] = 1
    emulated_profile: str | None = None  # device: emulated: the rates its steps take (default: profile.json)

    @field_validator("preprocessors_per_node", mode="before")
    @classmethod
    def _count_or_auto(cls, value: Any) -> int | str:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 256):
            return value
        raise ValueError(f"expected an integer from 1 to 256 (a rank each, per node) or 'auto', got {shown(value)}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


_IN_MEMORY = "held in memory on every rank"


class Fuse(str, Enum):
    """`runtime.fuse`: whether models of one architecture train as fused bundles (issue 49)."""

    AUTO = "auto"  # MEASURE on CUDA devices; no bundles on CPU and emulated trainers
    MEASURE = "measure"  # on any real device: bundles that time both ways in their first steps, keep the faster
    ALWAYS = "always"  # on any device, fused without a trial
    NEVER = "never"

    @property
    def measures(self) -> bool:
        """Whether this mode's bundles time both ways and keep the faster (auto, measure)."""
        return self in (Fuse.AUTO, Fuse.MEASURE)


class RuntimeSpec(Section):
    """Queue sizes, timeouts, the gradient collective and fused bundles of the MPI runtime."""

    collective: str = "auto"  # one of the collectives registry's kinds()
    poll: Literal["auto", "busy", "sleep"] = "auto"  # how data waits poll MPI; auto: busy if the node has the cores
    chunk_samples: Annotated[PositiveInt, at_most(65_536, _IN_MEMORY)] | Literal["auto"] = "auto"
    qp_samples: Annotated[PositiveInt, at_most(1_000_000, _IN_MEMORY)] = 2048
    qt_samples: Annotated[PositiveInt, at_most(1_000_000, _IN_MEMORY)] = 2048
    qd_batches: Annotated[PositiveInt, at_most(10_000, _IN_MEMORY)] = 10
    timeout_s: Annotated[PositiveFloat, at_most(7 * 86_400, "a week: a wait longer than that is a hang")] = 600.0
    shared_memory: bool = True  # chunks read in place by the masters of their preprocessor's node
    fuse: Fuse = Fuse.AUTO  # models of one architecture on one stream train as one fused model
    fuse_min_speedup: float = Field(1.0, ge=0.0)  # auto keeps a bundle fused where it is this many times faster

    @field_validator("collective")
    @classmethod
    def _known_collective(cls, value: str) -> str:
        if value not in collective_kinds():
            raise ValueError(f"unknown collective {value!r} (valid: {', '.join(collective_kinds())})")
        return value

    def chunk_size(self, sample_bytes: int) -> int:
        """Samples per chunk: as given, or about `AUTO_CHUNK_BYTES` (8 to 512, a multiple of 8)."""
        if self.chunk_samples != "auto":
            return self.chunk_samples
        samples = AUTO_CHUNK_BYTES // max(1, sample_bytes)
        return max(8, min(512, samples // 8 * 8))


class EnsembleSpec(Section):
    """`fleet run` ends with `fleet ensemble` (greedy selection over the models' kept predictions)."""

    size: Annotated[PositiveInt, at_most(10_000, "each step tries every candidate")]
    from_: PositiveInt | None = Field(None, alias="from")
