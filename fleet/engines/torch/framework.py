"""`TorchFramework`: PyTorch behind the `Framework` interface (engine, zoo, codec, devices)."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any

import torch

from fleet.engines._base import Framework, InputShape, ModelStats, ModelZoo
from fleet.engines.options import EngineOptions
from fleet.engines.torch import zoo as torch_zoo
from fleet.engines.torch.codec import CODEC, read_legacy_checkpoint
from fleet.engines.torch.engine import TorchEngine


def _is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


class TorchZoo(ModelZoo):
    """The zoo of `fleet.engines.torch.zoo` (torch modules)."""

    def build(
        self, family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int, *,
        seed: int | None = None,
    ) -> torch.nn.Module:
        return torch_zoo.build_model(family, params, input_shape, num_classes, seed=seed)

    def describe(self, family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int) -> ModelStats:
        return torch_zoo.describe(family, params, input_shape, num_classes)

    def parameter_bytes(
        self, family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int
    ) -> int | None:
        return torch_zoo.parameter_bytes(family, params, input_shape, num_classes)


class TorchFramework(Framework):
    """PyTorch on the CPU and on CUDA GPUs."""

    name = "torch"
    zoo = TorchZoo()
    codec = CODEC

    def version(self) -> str:
        return str(torch.__version__)

    def create_engine(self, options: EngineOptions) -> TorchEngine:
        return TorchEngine(options)

    def visible_gpus(self) -> int:
        return torch.cuda.device_count()

    def free_device_memory(self, device: str) -> int | None:
        if not _is_cuda(device):
            return None
        return int(torch.cuda.mem_get_info(torch.device(device))[0])

    def device_name(self, device: str) -> str:
        if _is_cuda(device):
            return torch.cuda.get_device_name(torch.device(device))
        return super().device_name(device)

    def synchronize(self, device: str) -> None:
        if _is_cuda(device):
            torch.cuda.synchronize(torch.device(device))

    def release_memory(self, device: str) -> None:
        gc.collect()  # the dropped engine's tensors go now, so that their cached blocks can be freed
        if _is_cuda(device):
            torch.cuda.empty_cache()

    def read_legacy_checkpoint(self, data: bytes) -> dict[str, Any] | None:
        return read_legacy_checkpoint(data)


FRAMEWORK = TorchFramework()
