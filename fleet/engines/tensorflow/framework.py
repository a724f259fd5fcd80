"""`TensorFlowFramework`: TensorFlow/Keras behind the `Framework` interface (engine, zoo, codec, devices)."""

from __future__ import annotations

import gc

import tensorflow as tf

from fleet.engines._base import Framework
from fleet.engines.options import EngineOptions
from fleet.engines.tensorflow.engine import CODEC, ZOO, TensorFlowEngine


class TensorFlowFramework(Framework):
    """TensorFlow on the CPU or one GPU per trainer (`bind_gpu`)."""

    name = "tensorflow"
    zoo = ZOO
    codec = CODEC

    def version(self) -> str:
        return str(tf.__version__)

    def create_engine(self, options: EngineOptions) -> TensorFlowEngine:
        return TensorFlowEngine(options)

    def visible_gpus(self) -> int:
        return len(tf.config.list_physical_devices("GPU"))

    def free_device_memory(self, device: str) -> int | None:
        return None  # TF reports what it uses, not what is free

    def synchronize(self, device: str) -> None:
        pass  # the engine's steps end in host copies (gradients, parameters), which wait for the GPU

    def release_memory(self, device: str) -> None:
        gc.collect()  # the dropped engine's variables go now


FRAMEWORK = TensorFlowFramework()
