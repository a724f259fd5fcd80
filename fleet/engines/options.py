"""`EngineOptions`: what one model replica is built from.

The one signature of every engine's constructor, of `Framework.create_engine` and of
`fleet.engines.factory.create_engine`: callers build it once and hand it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the spec imports this package (for its framework names)
    from fleet.spec.search import ModelSpec


@dataclass(frozen=True)
class EngineOptions:
    """One replica to build: which model, the shape of its data, where and how it runs.

    Attributes:
        model: the concrete model (`ModelSpec`): id, family, params, training and seed.
        input_shape: ``(channels, height, width)`` of one sample, kept as three ints.
        num_classes: number of classes.
        device: ``cpu``, ``cuda``, ``cuda:<index>`` or ``emulated``; each engine says which of
            them it runs on (a `UserError` from the engine otherwise).
        threads: host threads for this trainer (a process-wide framework setting); None
            leaves the framework's.
        deterministic: deterministic kernels where the framework has a choice (slower on CUDA).

    Raises:
        ValueError: an input shape that is not three positive sizes, fewer than one class,
            fewer than one thread, or a device that is not a string.
    """

    model: "ModelSpec"
    input_shape: tuple[int, int, int]
    num_classes: int
    device: str = "cpu"
    threads: int | None = None
    deterministic: bool = False

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.input_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"input_shape: expected (channels, height, width) >= 1, got {tuple(self.input_shape)}")
        object.__setattr__(self, "input_shape", shape)
        if self.num_classes < 1:
            raise ValueError(f"num_classes: expected >= 1, got {self.num_classes}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads: expected None or >= 1, got {self.threads}")
        if not isinstance(self.device, str):  # the spec's Device enum is a str
            raise ValueError(f"device: expected a string such as 'cpu' or 'cuda:0', got {self.device!r}")
