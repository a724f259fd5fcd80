"""TensorFlow/Keras behind fleet's engine interface: `TensorFlowEngine`, its Keras zoo
(`KerasZoo`: the five zoo families and user models), and `FRAMEWORK` (the `Framework` object
`fleet.engines.registry` registers as ``tensorflow``). On the CPU, or one GPU per trainer.

Importing this package imports TensorFlow, with its C++ start-up messages silenced: unless
the environment already says otherwise, ``TF_CPP_MIN_LOG_LEVEL=2`` and
``TF_ENABLE_ONEDNN_OPTS=0`` (TF 2.21 prints its oneDNN notice before its log level applies;
without oneDNN's rewrites, CPU results also do not depend on how oneDNN splits the work).
It is the one package of fleet that imports TensorFlow.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # read when TensorFlow's C++ side starts
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # its notice is printed whatever the log level

from fleet.engines.tensorflow.engine import TensorFlowEngine  # noqa: E402 - after the log level is set
from fleet.engines.tensorflow.framework import FRAMEWORK, TensorFlowFramework  # noqa: E402
from fleet.engines.tensorflow.zoo import KerasZoo  # noqa: E402

__all__ = ["FRAMEWORK", "KerasZoo", "TensorFlowEngine", "TensorFlowFramework"]
