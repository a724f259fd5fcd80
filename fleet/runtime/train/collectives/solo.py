"""`SoloCollective`: the backend of a group of one member, which has nobody to talk to."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleet.runtime.train.collectives._base import Collective, check_host_array


class SoloCollective(Collective):
    """Sums and broadcasts over one member: checks its arguments and leaves them as they are."""

    name = "solo"

    def __init__(self, timeout_s: float = 60.0, label: str = "a group of 1 rank"):
        super().__init__(1, 0, timeout_s, label)

    @classmethod
    def for_group(cls, group_comm: Any, device: str, timeout_s: float, label: str | None) -> "SoloCollective":
        return cls(timeout_s, label or "a group of 1 rank")

    def allreduce_sum(self, buf: np.ndarray) -> None:
        self._check_open("allreduce_sum")
        check_host_array(buf, self._what("allreduce_sum"))

    def allreduce_gradients(self, engine) -> None:
        self._check_open("allreduce_gradients")  # the sum over one replica is its own gradient

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        self._check_open("broadcast")
        check_host_array(buf, self._what("broadcast"))
        self._check_root(root, "broadcast")

    def _release(self) -> None:
        pass
