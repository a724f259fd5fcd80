"""User models: a family written ``package.module:function``.

The function is called as ``function(input_shape=(C, H, W), num_classes=K, **params)`` and
must return a `torch.nn.Module`. Every way this can go wrong on the user's side becomes a
one-line `UserError` naming the family.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from torch import nn

from fleet.errors import UserError
from fleet.models._layers import InputShape


def _error(family: str, problem: str) -> UserError:
    return UserError(f"family {family!r}: {problem}")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def import_builder(family: str) -> Callable[..., Any]:
    """The callable named by ``package.module:function``."""
    module_name, _, function_name = family.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module failing to import is the user's error
        raise _error(family, f"cannot import {module_name!r}: {_describe(exc)}") from exc
    builder = getattr(module, function_name, None)
    if builder is None:
        raise _error(family, f"module {module_name!r} has no attribute {function_name!r}")
    if not callable(builder):
        raise _error(family, f"{function_name!r} is a {type(builder).__name__}, not a function")
    return builder


def build(family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int) -> nn.Module:
    """Import and call the user's function; check that it returns a `torch.nn.Module`."""
    builder = import_builder(family)
    try:
        model = builder(input_shape=tuple(input_shape), num_classes=num_classes, **params)
    except (TypeError, ValueError) as exc:
        raise _error(family, f"bad params {dict(params)!r}: {_describe(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise _error(family, f"returned a {type(model).__name__}, expected a torch.nn.Module")
    return model
