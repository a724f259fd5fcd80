"""The `models` section: entries, search spaces, and their expansion into concrete models.

An entry is one model (``family`` + ``params``) or a family with a ``search`` space:
grid dimensions (``choice``) are crossed, random dimensions (``uniform``, ``loguniform``,
``int``) are drawn ``samples`` times per grid point, seeded by the spec's seed and the
entry's index. A search key ``train.<field>`` searches a training setting of the model.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import zlib
from typing import Any

from pydantic import Field, PositiveInt, field_validator, model_validator

from fleet.engines.registry import DEFAULT_FRAMEWORK, FRAMEWORKS
from fleet.spec._base import Section
from fleet.spec.sections import TrainSpec

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_MODELS = 10_000
TRAIN_PREFIX = "train."


class Dimension(Section):
    """One searched parameter: exactly one of choice / uniform / loguniform / int."""

    choice: list[Any] | None = Field(None, min_length=1)
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    int_range: tuple[int, int] | None = Field(None, alias="int")
    size: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "Dimension":
        kinds = [k for k in ("choice", "uniform", "loguniform", "int_range") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("expected exactly one of choice, uniform, loguniform, int")
        bounds = self.uniform or self.loguniform or self.int_range
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"expected [low, high] with low < high, got {list(bounds)}")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError(f"loguniform needs low > 0, got {list(self.loguniform)}")
        if self.size is not None and self.int_range is None:
            raise ValueError("size applies to int dimensions only")
        return self

    @property
    def is_grid(self) -> bool:
        return self.choice is not None

    def draw(self, rng: random.Random) -> Any:
        """One random value (random dimensions only)."""
        if self.uniform is not None:
            return rng.uniform(*self.uniform)
        if self.loguniform is not None:
            lo, hi = self.loguniform
            return math.exp(rng.uniform(math.log(lo), math.log(hi)))
        lo, hi = self.int_range  # type: ignore[misc]
        if self.size is None:
            return rng.randint(lo, hi)
        return [rng.randint(lo, hi) for _ in range(self.size)]


def check_framework(value: str | None) -> str | None:
    """A registered framework name (`fleet.engines.registry`), or None (raises ValueError)."""
    if value is not None and value not in FRAMEWORKS:
        raise ValueError(FRAMEWORKS.unknown(value))
    return value


class ModelEntry(Section):
    """One item of the `models` list, before expansion."""

    family: str
    framework: str | None = None  # None: the ensemble's
    name: str | None = None
    params: dict[str, Any] = {}
    search: dict[str, Dimension] = {}
    samples: PositiveInt = 1
    train: dict[str, Any] = {}
    group: str | None = None  # a resolved spec's model of one group (`data.group_by`)

    _framework = field_validator("framework")(lambda cls, v: check_framework(v))

    @model_validator(mode="after")
    def _search_keys(self) -> "ModelEntry":
        if self.name is not None and not ID_PATTERN.match(self.name):
            raise ValueError(f"name {self.name!r}: use letters, digits, '_', '.', '-'")
        clash = set(self.search) & set(self.params)
        if clash:
            raise ValueError(f"{sorted(clash)[0]!r} is both in params and in search")
        return self

    def size(self) -> int:
        grid = math.prod(len(d.choice) for d in self.search.values() if d.is_grid)
        return grid * self.samples

    def draws(self, seed: int, index: int) -> list[dict[str, Any]]:
        """The concrete assignments of the search space, in a stable order."""
        grid_keys = [k for k, d in self.search.items() if d.is_grid]
        random_keys = [k for k, d in self.search.items() if not d.is_grid]
        rng = random.Random(f"{seed}:{index}")
        out = []
        for values in itertools.product(*(self.search[k].choice for k in grid_keys)):
            for _ in range(self.samples):
                drawn = dict(zip(grid_keys, values))
                drawn.update({k: self.search[k].draw(rng) for k in random_keys})
                out.append(drawn)
        return out


class ModelSpec(Section):
    """A concrete model of the ensemble, with its parameters and training settings resolved.

    `framework` is the model's own, else the ensemble's (``torch`` unless the spec says).
    """

    id: str
    family: str
    params: dict[str, Any]
    train: TrainSpec
    seed: int
    framework: str = DEFAULT_FRAMEWORK
    group: str | None = None
    """With `data.group_by`: the raw key of the group it trains and validates on (None: all data)."""

    _framework = field_validator("framework")(lambda cls, v: check_framework(v))


def model_seed(seed: int, model_id: str) -> int:
    """A per-model seed, stable across runs and independent of the ensemble's order."""
    return zlib.crc32(f"{seed}:{model_id}".encode()) & 0x7FFFFFFF


def split_train_keys(drawn: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate `train.<field>` search keys from model parameters."""
    params = {k: v for k, v in drawn.items() if not k.startswith(TRAIN_PREFIX)}
    train = {k[len(TRAIN_PREFIX):]: v for k, v in drawn.items() if k.startswith(TRAIN_PREFIX)}
    return params, train


def model_ids(entries: list[ModelEntry], sizes: list[int]) -> list[list[str]]:
    """Readable ids: an entry's `name` when it makes one model, else `<name or family>-NNN`."""
    counters: dict[str, int] = {}
    out = []
    for entry, size in zip(entries, sizes):
        if entry.name is not None and size == 1:
            out.append([entry.name])
            continue
        base = entry.name or entry.family.rsplit(":", 1)[-1]
        start = counters.get(base, 0)
        counters[base] = start + size
        out.append([f"{base}-{k:03d}" for k in range(start, start + size)])
    return out
