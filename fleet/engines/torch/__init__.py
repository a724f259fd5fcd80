"""PyTorch behind fleet's engine interface: `TorchEngine`, its state codec, and `FRAMEWORK`
(the `Framework` object `fleet.engines.registry` registers as ``torch``). The model zoo is
`fleet.engines.torch.zoo`. Importing this package imports torch."""

from fleet.engines.torch.engine import TorchEngine
from fleet.engines.torch.framework import FRAMEWORK, TorchFramework

__all__ = ["FRAMEWORK", "TorchEngine", "TorchFramework"]
