"""The `models` section: entries, search spaces, and their expansion into concrete models.

An entry is one model (``family`` + ``params``) or a family with a ``search`` space:
grid dimensions (``choice``) are crossed, random dimensions (``uniform``, ``loguniform``,
``int``) are drawn ``samples`` times per grid point, seeded by the spec's seed and the
entry's index (``sampler: random``, the default). A search key ``train.<field>`` searches a
training setting of the model.

With an adaptive sampler (``tpe``, ``cmaes``, ``gp``, ``qmc``) the entry is a study of
``budget`` models that the run asks for while it trains (`fleet.runtime.control.search`): it
expands to ``budget`` placeholder models, ids reserved up front in ask order, each carrying its
`SearchSlot`; until asked, a placeholder holds the space's middle values (`middle_values`), which
the planners' first rates are estimated from.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
import re
import zlib
from collections.abc import Sequence
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from fleet.engines.registry import DEFAULT_FRAMEWORK, FRAMEWORKS
from fleet.spec._base import Section
from fleet.spec.sections import TrainSpec

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_MODELS = 10_000
TRAIN_PREFIX = "train."
SAMPLERS = ("random", "tpe", "cmaes", "gp", "qmc")
"""The samplers of a search: ``random`` draws when the spec is read; the others are adaptive."""
ADAPTIVE_SAMPLERS = SAMPLERS[1:]
SAMPLER_PACKAGES = {"tpe": ("optuna",), "cmaes": ("optuna", "cmaes"), "gp": ("optuna", "scipy", "torch"),
                    "qmc": ("optuna", "scipy")}
"""The packages each adaptive sampler needs (Optuna's samplers; cmaes and scipy are optional)."""


def missing_package(sampler: str) -> str | None:
    """The first package adaptive `sampler` needs that is not installed, or None."""
    return next((p for p in SAMPLER_PACKAGES[sampler] if importlib.util.find_spec(p) is None), None)


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

    def middle(self) -> Any:
        """The space's middle value: a placeholder's until its model is asked (a choice's middle
        item, a range's midpoint, geometric for loguniform)."""
        if self.choice is not None:
            return self.choice[len(self.choice) // 2]
        if self.uniform is not None:
            return (self.uniform[0] + self.uniform[1]) / 2
        if self.loguniform is not None:
            return math.sqrt(self.loguniform[0] * self.loguniform[1])
        lo, hi = self.int_range  # type: ignore[misc]
        return (lo + hi) // 2 if self.size is None else [(lo + hi) // 2] * self.size


    def ends(self) -> list[Any]:
        """The values at the ends of the dimension: a choice's items, a range's low and high
        (with ``size: k``, k lows and k highs): among them a searched architecture's smallest
        and largest (`fleet.inspect.search_costs`)."""
        if self.choice is not None:
            return list(self.choice)
        low, high = self.uniform or self.loguniform or self.int_range  # type: ignore[misc]
        return [low, high] if self.size is None else [[low] * self.size, [high] * self.size]


class SearchSlot(Section):
    """A placeholder model of an adaptive search: the `index`-th model study `study` asks with
    `sampler` over `space`, of `budget` in all (a resolved spec writes it as the model's
    ``slot``)."""

    study: str
    sampler: str
    budget: PositiveInt
    index: NonNegativeInt
    space: dict[str, Dimension]

    @model_validator(mode="after")
    def _in_budget(self) -> "SearchSlot":
        if self.sampler not in ADAPTIVE_SAMPLERS:
            raise ValueError(f"sampler {self.sampler!r}: a slot's sampler is one of {', '.join(ADAPTIVE_SAMPLERS)}")
        if self.index >= self.budget:
            raise ValueError(f"index {self.index} is not below budget {self.budget}")
        return self


def searches_of(models: Sequence[ModelSpec]) -> dict[str, dict[str, Any]]:
    """What a plan can say of each adaptive search among `models` before it runs,
    by study: its ``sampler``, ``budget``, first and last ``models`` and searched ``space`` keys."""
    out: dict[str, dict[str, Any]] = {}
    for model in models:
        slot = model.search
        if slot is None:
            continue
        facts = out.setdefault(slot.study, {"sampler": slot.sampler, "budget": slot.budget, "models": [model.id] * 2,
                                            "space": list(slot.space)})
        facts["models"][1] = model.id
    return out


def middle_values(space: dict[str, Dimension]) -> dict[str, Any]:
    """Every dimension's middle value (`Dimension.middle`)."""
    return {key: dim.middle() for key, dim in space.items()}


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
    sampler: str = "random"
    budget: PositiveInt | None = None
    train: dict[str, Any] = {}
    group: str | None = None  # a resolved spec's model of one group (`data.group_by`)
    slot: SearchSlot | None = None  # a resolved spec's placeholder of an adaptive search

    _framework = field_validator("framework")(lambda cls, v: check_framework(v))

    @field_validator("sampler")
    @classmethod
    def _known_sampler(cls, name: str) -> str:
        if name not in SAMPLERS:
            raise ValueError(f"unknown sampler {name!r} (valid: {', '.join(SAMPLERS)})")
        return name

    @model_validator(mode="after")
    def _search_keys(self) -> "ModelEntry":
        if self.name is not None and not ID_PATTERN.match(self.name):
            raise ValueError(f"name {self.name!r}: use letters, digits, '_', '.', '-'")
        clash = set(self.search) & set(self.params)
        if clash:
            raise ValueError(f"{sorted(clash)[0]!r} is both in params and in search")
        self._check_budget()
        return self

    def _check_budget(self) -> None:
        if not self.adaptive:
            if self.budget is not None:
                raise ValueError(f"budget is for an adaptive sampler ({', '.join(ADAPTIVE_SAMPLERS)}); "
                                 "sampler random takes samples")
            return
        if self.budget is None:
            raise ValueError(f"sampler {self.sampler} needs budget: the number of models its study asks for")
        if "samples" in self.model_fields_set:
            raise ValueError(f"samples is for sampler random; sampler {self.sampler} asks budget models")
        if not self.search:
            raise ValueError(f"sampler {self.sampler} needs a search space (search)")

    @property
    def adaptive(self) -> bool:
        """Whether an adaptive sampler asks this entry's models while the run trains."""
        return self.sampler in ADAPTIVE_SAMPLERS

    def size(self) -> int:
        if self.adaptive:
            return self.budget  # type: ignore[return-value]
        grid = math.prod(len(d.choice) for d in self.search.values() if d.is_grid)
        return grid * self.samples

    def slot_of(self, study: str, index: int) -> SearchSlot:
        """Placeholder `index` of this adaptive entry, in study `study`."""
        return SearchSlot(study=study, sampler=self.sampler, budget=self.budget, index=index, space=self.search)

    def draws(self, seed: int, index: int) -> list[dict[str, Any]]:
        """The concrete assignments of the search space, in a stable order (an adaptive entry's:
        its placeholders', the middle of the space)."""
        if self.adaptive:
            return [middle_values(self.search) for _ in range(self.size())]
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
    search: SearchSlot | None = None
    """A placeholder of an adaptive search: its study and place in it (its searched values are
    the space's middle until the run asks them; `fleet.spec.asked`)."""

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
