"""Training rates ``r_i(m)`` of each model and FLEET's extrapolation beyond the profile.

``r_i(m)`` is the number of samples per second model *i* trains when it runs data-parallel
on *m* GPUs. The profiler measures it for ``m = 1..M_t`` (see :func:`threshold_gpus`);
beyond the last measured count FLEET's Eq. 5 extrapolates it::

    r(m) = m * r(M_b)/M_b * (r(M_b)/r(M_b-1) * (M_b-1)/M_b) ** (m - M_b),   M_b = 2 * gpn

i.e. the per-GPU efficiency keeps decaying by the factor seen between ``M_b - 1`` and
``M_b`` GPUs (the first step that crosses a node boundary twice).

This module is pure: :meth:`RateTable.from_dict` and :meth:`RateTable.to_dict` convert the
rate part of ``profile.json`` to and from plain dicts; reading and writing the file lives in
``fleet/schedule_io.py``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROFILE_SCHEMA = 1
"""Version of the ``profile.json`` layout this module reads and writes."""

_KNOWN_MODEL_KEYS = frozenset({"id", "rates", "epochs", "param_bytes"})
_KNOWN_TOP_KEYS = frozenset({"schema", "gpus_per_node", "samples_per_epoch", "models"})
TIMED_AS = "timed_as"
"""A profile entry's field naming the model whose measurements stand for it: both train at one
speed (`fleet.profiling.plan.timed_as`), so they are measured as one."""


class ProfileFormatError(ValueError):
    """A profile dict that does not have the documented shape.

    Attributes:
        field: dotted path of the offending field, e.g. ``models[3].rates.2``.
        problem: what is wrong with it.
    """

    def __init__(self, field_path: str, problem: str):
        self.field = field_path
        self.problem = problem
        super().__init__(f"{field_path}: {problem}")


def threshold_gpus(single_gpu_rates: Sequence[float], gpus_per_node: int) -> int:
    """FLEET's profiling depth ``M_t = max(M_a, M_b)``.

    Args:
        single_gpu_rates: ``r_i(1)`` of every model in the ensemble.
        gpus_per_node: GPUs per node (``gpn``).

    Returns:
        ``max(ceil(max r(1) / min r(1)), 2 * gpn)``: the slowest model may need ``M_a``
        GPUs to keep pace with the fastest one, and ``M_b`` covers one node crossing.
    """
    rates = [float(r) for r in single_gpu_rates]
    if not rates:
        return 2 * gpus_per_node
    ratio = max(rates) / min(rates)
    m_a = math.ceil(ratio - 1e-12)
    return max(m_a, 2 * gpus_per_node)


def extrapolate_rate(measured: Sequence[float], m: int, gpus_per_node: int) -> float:
    """Rate on ``m`` GPUs: measured when ``m`` is profiled, FLEET's Eq. 5 beyond.

    Args:
        measured: ``r(1), r(2), ..., r(K)``.
        m: GPU count, ``m >= 1``.
        gpus_per_node: GPUs per node; Eq. 5 anchors at ``M_b = 2 * gpus_per_node``.

    Returns:
        Samples per second. When fewer than ``M_b`` counts were measured, the anchor falls
        back to the largest measured count ``K`` (``K >= 2``); with only ``r(1)`` known,
        no scaling is assumed and ``r(m) = r(1)``.
    """
    if m <= len(measured):
        return float(measured[m - 1])
    anchor = min(2 * gpus_per_node, len(measured))
    if anchor < 2:
        return float(measured[0])
    r_b, r_b1 = float(measured[anchor - 1]), float(measured[anchor - 2])
    decay = (r_b / r_b1) * (anchor - 1) / anchor
    return m * r_b / anchor * decay ** (m - anchor)


FALLING = 1e-9
"""Eq. 5 counts past which each step loses at least this share of the rate (`useful_width`): far
above the rounding of the formula's three operations, so the computed rates fall there too."""


def useful_width(measured: Sequence[float], gpus_per_node: int) -> float:
    """A GPU count past which ``extrapolate_rate(measured, m, gpus_per_node)`` never beats its
    value at a smaller count (``math.inf`` where Eq. 5 keeps rising, at a decay of 1 or more).

    Beyond the measured ``K`` counts Eq. 5 goes from ``r(m)`` to ``r(m+1)`` by the factor
    ``(m+1)/m * decay``, falling with ``m``: from the count at which it drops below
    ``1 - FALLING`` on, the rate falls at every step, so no count past ``max(K+1, that count)``
    beats every smaller one.
    """
    known = len(measured)
    anchor = min(2 * gpus_per_node, known)
    if anchor < 2:
        return known  # r(1) on any count beyond: never faster
    decay = (float(measured[anchor - 1]) / float(measured[anchor - 2])) * (anchor - 1) / anchor
    margin = 1 - FALLING - decay
    if margin <= 0:
        return math.inf
    return max(known + 1, math.floor(decay / margin) + 2)  # +2: the floor's own rounding


@dataclass(frozen=True)
class ModelProfile:
    """What the profiler knows about one model.

    Attributes:
        id: model identifier, unique in the ensemble.
        rates: measured ``r(1), ..., r(K)`` in samples per second.
        epochs: optional estimate of epochs to converge (never the truth for a planner).
        param_bytes: optional size of the parameters, used to cost checkpoints.
        extra: fields the profiler added that this module does not interpret; kept so that
            a load/save round trip loses nothing.
    """

    id: str
    rates: tuple[float, ...]
    epochs: float | None = None
    param_bytes: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def rate(self, m: int, gpus_per_node: int) -> float:
        """``r(m)``, extrapolated with Eq. 5 past the measured counts."""
        return extrapolate_rate(self.rates, m, gpus_per_node)


@dataclass(frozen=True)
class RateTable:
    """``r_i(m)`` for every model of an ensemble, plus the facts planners need with it.

    Attributes:
        models: one profile per model, in a fixed order (planners refer to models by id).
        gpus_per_node: GPUs per node of the profiled machine.
        samples_per_epoch: samples in one epoch of the training set.
        extra: top-level profile fields this module does not interpret (kept on save).
    """

    models: tuple[ModelProfile, ...]
    gpus_per_node: int
    samples_per_epoch: int
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        ids = [p.id for p in self.models]
        if len(set(ids)) != len(ids):
            duplicate = next(i for i in ids if ids.count(i) > 1)
            raise ProfileFormatError("models", f"duplicate model id {duplicate!r}")

    @property
    def ids(self) -> tuple[str, ...]:
        """Model ids in table order."""
        ids = self._cache.get("ids")
        if ids is None:
            ids = self._cache["ids"] = tuple(p.id for p in self.models)
        return ids

    def index(self, model_id: str) -> int:
        """Position of ``model_id`` in :attr:`models`."""
        lookup = self._cache.get("index")
        if lookup is None:
            lookup = {p.id: i for i, p in enumerate(self.models)}
            self._cache["index"] = lookup
        return lookup[model_id]

    def profile(self, model_id: str) -> ModelProfile:
        """The :class:`ModelProfile` of ``model_id``."""
        return self.models[self.index(model_id)]

    def subset(self, ids: Sequence[str]) -> "RateTable":
        """The table of the models `ids`, in that order (the same machine facts)."""
        return RateTable(tuple(self.profile(i) for i in ids), self.gpus_per_node, self.samples_per_epoch, self.extra)

    def rate(self, model_id: str, m: int) -> float:
        """``r_i(m)`` in samples per second."""
        return self.profile(model_id).rate(m, self.gpus_per_node)

    def matrix(self, max_gpus: int) -> np.ndarray:
        """Rates as an array ``R[i, m-1] = r_i(m)`` for ``m = 1..max_gpus`` (read-only)."""
        cached = self._cache.get(("matrix", max_gpus))
        if cached is None:
            cached = np.array(
                [_rate_row(p.rates, max_gpus, self.gpus_per_node) for p in self.models], dtype=float
            ).reshape(len(self.models), max_gpus)
            cached.setflags(write=False)
            self._cache[("matrix", max_gpus)] = cached
        return cached

    def useful_matrix(self, max_gpus: int) -> np.ndarray:
        """The first columns of ``matrix(max_gpus)``: up to the last count at which some model's
        rate still beats its rate at every smaller count (`useful_width`). A count past it is
        slower and costlier than a smaller one for every model, so no planner takes it; at 10,000
        GPUs the full matrix would hold 10^8 rates, this one some 60 per model (read-only)."""
        widest = self._cache.get("widest")
        if widest is None:
            widths = [useful_width(p.rates, self.gpus_per_node) for p in self.models]
            widest = self._cache["widest"] = max(widths, default=math.inf)
        if widest >= max_gpus:
            return self.matrix(max_gpus)
        return self.matrix(widest)[:, :max_gpus]

    def threshold_gpus(self) -> int:
        """``M_t`` for this ensemble (how many GPU counts the profiler should measure)."""
        return threshold_gpus([p.rates[0] for p in self.models], self.gpus_per_node)

    def with_epochs(self, epochs: Sequence[float | None]) -> RateTable:
        """A copy whose models carry the given epoch estimates (same order as models)."""
        models = tuple(_replace_epochs(p, e) for p, e in zip(self.models, epochs, strict=True))
        return RateTable(models, self.gpus_per_node, self.samples_per_epoch, self.extra)

    def to_dict(self) -> dict[str, Any]:
        """The ``profile.json`` dict (schema 1), extra fields included."""
        return {
            **dict(self.extra),
            "schema": PROFILE_SCHEMA,
            "gpus_per_node": self.gpus_per_node,
            "samples_per_epoch": self.samples_per_epoch,
            "models": [_model_to_dict(p) for p in self.models],
        }

    @classmethod
    def from_dict(cls, data: Any) -> RateTable:
        """Parse a ``profile.json`` dict; unknown fields are tolerated and kept.

        Raises:
            ProfileFormatError: naming the first malformed field.
        """
        if not isinstance(data, Mapping):
            raise ProfileFormatError("(top level)", "expected a JSON object")
        schema = data.get("schema", PROFILE_SCHEMA)
        if schema != PROFILE_SCHEMA:
            raise ProfileFormatError("schema", f"expected {PROFILE_SCHEMA}, got {schema!r}")
        gpn = _positive_int(data, "gpus_per_node", "gpus_per_node")
        samples = _positive_int(data, "samples_per_epoch", "samples_per_epoch")
        models = data.get("models")
        if not isinstance(models, list) or not models:
            raise ProfileFormatError("models", "expected a non-empty list")
        profiles = tuple(_model_from_dict(entry, f"models[{k}]") for k, entry in enumerate(models))
        extra = {k: v for k, v in data.items() if k not in _KNOWN_TOP_KEYS}
        return cls(profiles, gpn, samples, extra)


def timed_as_of(table: RateTable) -> dict[str, str]:
    """Each model of `table` measured as another (its `TIMED_AS`) -> that model."""
    return {p.id: p.extra[TIMED_AS] for p in table.models if TIMED_AS in p.extra}


def parted(timed_as: Mapping[str, str], models: Collection[str]) -> dict[str, str]:
    """`timed_as` (a model -> the model measured for it) with each of `models` measured on its
    own: out of its group, and a group it was measured for is measured for by its first other
    member (in `timed_as`'s order) instead."""
    out = {m: r for m, r in timed_as.items() if m not in models}
    for model in models:
        members = [m for m, r in out.items() if r == model]
        if members:
            del out[members[0]]
            out.update({m: members[0] for m in members[1:]})
    return out


def reestimated(table: RateTable, factors: Mapping[str, float]) -> RateTable:
    """`table` with each model of `factors` at its rates times its factor and measured on its
    own from now on (`parted`): an adaptive search's model, whose architecture is known once it
    is asked, no longer trains at the speed of the placeholders it was planned with.

    Raises:
        ValueError: a factor is not a finite positive number.
    """
    bad = next((m for m, f in factors.items() if not (math.isfinite(f) and f > 0)), None)
    if bad is not None:
        raise ValueError(f"{bad}: a rate factor must be finite and > 0, got {factors[bad]!r}")
    timing = parted(timed_as_of(table), factors)
    profiles = []
    for p in table.models:
        extra, rates = p.extra, p.rates
        if extra.get(TIMED_AS) != timing.get(p.id):
            extra = {k: v for k, v in extra.items() if k != TIMED_AS}
            extra.update({TIMED_AS: timing[p.id]} if p.id in timing else {})
        if p.id in factors:
            rates = tuple(r * factors[p.id] for r in rates)
        same = extra is p.extra and rates is p.rates
        profiles.append(p if same else ModelProfile(p.id, rates, p.epochs, p.param_bytes, extra))
    return RateTable(tuple(profiles), table.gpus_per_node, table.samples_per_epoch, table.extra)


def _rate_row(measured: Sequence[float], max_gpus: int, gpus_per_node: int) -> list[float]:
    """``extrapolate_rate(measured, m, gpus_per_node)`` for ``m = 1..max_gpus``, the same
    floats, without a call per entry (a 1,000-GPU table has a million of them)."""
    known = [float(r) for r in measured[:max_gpus]]
    if max_gpus <= len(measured):
        return known
    anchor = min(2 * gpus_per_node, len(measured))
    if anchor < 2:
        return known + [float(measured[0])] * (max_gpus - len(measured))
    r_b, r_b1 = float(measured[anchor - 1]), float(measured[anchor - 2])
    decay = (r_b / r_b1) * (anchor - 1) / anchor
    return known + [m * r_b / anchor * decay ** (m - anchor) for m in range(len(measured) + 1, max_gpus + 1)]


def _replace_epochs(profile: ModelProfile, epochs: float | None) -> ModelProfile:
    return ModelProfile(profile.id, profile.rates, epochs, profile.param_bytes, profile.extra)


def _model_to_dict(profile: ModelProfile) -> dict[str, Any]:
    out: dict[str, Any] = {**dict(profile.extra), "id": profile.id}
    out["rates"] = {str(m): r for m, r in enumerate(profile.rates, start=1)}
    if profile.epochs is not None:
        out["epochs"] = profile.epochs
    if profile.param_bytes is not None:
        out["param_bytes"] = profile.param_bytes
    return out


def _model_from_dict(entry: Any, where: str) -> ModelProfile:
    if not isinstance(entry, Mapping):
        raise ProfileFormatError(where, "expected an object with 'id' and 'rates'")
    model_id = entry.get("id")
    if not isinstance(model_id, str) or not model_id:
        raise ProfileFormatError(f"{where}.id", "expected a non-empty string")
    rates = _rates_from_dict(entry.get("rates"), f"{where}.rates")
    epochs = _optional_positive(entry, "epochs", f"{where}.epochs", number=float)
    param_bytes = _optional_positive(entry, "param_bytes", f"{where}.param_bytes", number=int)
    extra = {k: v for k, v in entry.items() if k not in _KNOWN_MODEL_KEYS}
    return ModelProfile(model_id, rates, epochs, param_bytes, extra)


def _rates_from_dict(rates: Any, where: str) -> tuple[float, ...]:
    if not isinstance(rates, Mapping) or not rates:
        raise ProfileFormatError(where, 'expected an object like {"1": r1, "2": r2, ...}')
    by_count: dict[int, float] = {}
    for key, value in rates.items():
        count = int(key) if isinstance(key, str) and key.isdigit() else None
        if count is None or count < 1:
            raise ProfileFormatError(f"{where}.{key}", "GPU count keys must be positive integers")
        if not is_positive_number(value):
            raise ProfileFormatError(f"{where}.{key}", f"expected samples/s > 0, got {value!r}")
        by_count[count] = float(value)
    missing = [m for m in range(1, max(by_count) + 1) if m not in by_count]
    if missing:
        raise ProfileFormatError(where, f"GPU counts must run 1..{max(by_count)} without gaps; missing {missing[0]}")
    return tuple(by_count[m] for m in range(1, max(by_count) + 1))


def _positive_int(data: Mapping, key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProfileFormatError(where, f"expected a positive integer, got {value!r}")
    return value


def _optional_positive(data: Mapping, key: str, where: str, number: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if not is_positive_number(value) or (number is int and not isinstance(value, int)):
        kind = "a positive integer" if number is int else "a positive number"
        raise ProfileFormatError(where, f"expected {kind}, got {value!r}")
    return number(value)


def is_number(value: Any) -> bool:
    """A finite int or float (a bool is not a number here), as JSON documents must hold them."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_positive_number(value: Any) -> bool:
    return is_number(value) and value > 0
