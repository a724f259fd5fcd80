"""`TensorFlowFramework`: TensorFlow/Keras behind the `Framework` interface (engine, zoo, codec, devices)."""

from __future__ import annotations

import gc

import tensorflow as tf

from fleet.engines._base import Framework, InputShape
from fleet.engines.tensorflow.engine import CODEC, ZOO, TensorFlowEngine
from fleet.spec.search import ModelSpec


class TensorFlowFramework(Framework):
    """TensorFlow on the CPU (GPUs come in a later version: `visible_gpus` is 0)."""

    name = "tensorflow"
    zoo = ZOO
    codec = CODEC

    def version(self) -> str:
        return str(tf.__version__)

    def create_engine(
        self, model: ModelSpec, input_shape: InputShape, num_classes: int, device: str = "cpu",
        threads: int | None = None, deterministic: bool = False,
    ) -> TensorFlowEngine:
        return TensorFlowEngine(model, input_shape, num_classes, device=device, threads=threads,
                                deterministic=deterministic)

    def visible_gpus(self) -> int:
        return 0

    def free_device_memory(self, device: str) -> int | None:
        return None

    def synchronize(self, device: str) -> None:
        pass  # CPU only: every operation has finished when it returns

    def release_memory(self, device: str) -> None:
        gc.collect()  # the dropped engine's variables go now


FRAMEWORK = TensorFlowFramework()
