"""The frameworks fleet trains with, by name: the spec's ``framework`` and the engines' registry.

Importing this module (or the spec, which takes its valid names from here) imports no
framework; `get_framework` imports one the first time a model needs it.

Adding a framework: write a package beside ``fleet/engines/torch/`` whose module-level
``FRAMEWORK`` is a `fleet.engines.Framework` (its engine, zoo and state codec), then add one
line to `FRAMEWORKS`, e.g. ``"tensorflow": "fleet.engines.tensorflow:FRAMEWORK"``.
"""

from __future__ import annotations

from typing import Any

from fleet.engines._base import Framework
from fleet.errors import UserError
from fleet.registry import Registry

FRAMEWORKS: Registry[Framework] = Registry("framework", {
    "torch": "fleet.engines.torch:FRAMEWORK",
    "tensorflow": "fleet.engines.tensorflow:FRAMEWORK",
})
DEFAULT_FRAMEWORK = "torch"


def framework_names() -> tuple[str, ...]:
    """The valid values of the spec's ``framework``."""
    return FRAMEWORKS.names


def get_framework(name: str) -> Framework:
    """The framework registered as `name`, imported on first use.

    Raises:
        UserError: `name` is not registered, or the framework is not installed here.
    """
    try:
        return FRAMEWORKS.load(name)
    except ImportError as exc:
        raise UserError(f"framework {name!r}: cannot import it here ({exc})") from None


def read_legacy_checkpoint(data: bytes) -> dict[str, Any] | None:
    """A checkpoint file written by an older fleet, read by the framework that wrote it (see
    `Framework.read_legacy_checkpoint`); None when no framework knows the format. Frameworks
    that are not installed are skipped.

    Raises:
        ValueError: a framework knows the format but will not load the file safely.
    """
    for name in FRAMEWORKS.names:
        try:
            framework = FRAMEWORKS.load(name)
        except ImportError:
            continue
        found = framework.read_legacy_checkpoint(data)
        if found is not None:
            return found
    return None
