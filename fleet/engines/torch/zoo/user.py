"""User models: a family written ``package.module:function``.

The function is called as ``function(input_shape=(C, H, W), num_classes=K, **params)`` and
must return a `torch.nn.Module`. Every way this can go wrong on the user's side becomes a
one-line `UserCodeError` naming the family and what its code did: an import that fails, a
builder that raises anything or calls ``sys.exit``, a forward that does (`check_forward`), an
output of the wrong shape. A forward that calls ``sys.exit`` or raises `KeyboardInterrupt`
while a job trains is reported the same way (the module's ``forward`` is guarded), so that
the rank ends the job with an error instead of leaving quietly.
"""

from __future__ import annotations

import importlib
import types
from typing import Any, Callable, Mapping

import torch
from torch import nn

from fleet import interrupts
from fleet.engines._base import InputShape
from fleet.errors import UserCodeError

MAX_DETAIL = 200  # characters of the user's own exception message that a line quotes
CHECK_BATCH = 2  # samples of the forward `check_forward` runs (2 shows a batch dimension mixed up)


def _subject(family: str) -> str:
    return f"family {family!r}"


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _user_error(family: str, what: str, exc: BaseException) -> BaseException:
    """What `exc`, raised by the user's code, is reported as: a `UserCodeError` naming what the
    code did, or `exc` itself when it is a Ctrl-C (or already reported)."""
    if isinstance(exc, UserCodeError) or (isinstance(exc, KeyboardInterrupt) and interrupts.pressed()):
        return exc
    if isinstance(exc, SystemExit):
        problem = f"{what} called sys.exit({'' if exc.code is None else repr(exc.code)})"
    elif isinstance(exc, KeyboardInterrupt):
        problem = f"{what} raised KeyboardInterrupt (its own code, not a Ctrl-C)"
    else:
        problem = f"{what} raised {_describe(exc)}"
    return UserCodeError(_subject(family), problem)


def call_user_code(family: str, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, whatever it raises reported as a `UserCodeError`:
    ``family 'm:f': <what> raised ZeroDivisionError: ...`` (a Ctrl-C still interrupts)."""
    try:
        return function(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - anything the user's code raises is the user's error
        error = _user_error(family, what, exc)
        if error is exc:
            raise
        raise error from exc


def import_builder(family: str) -> Callable[..., Any]:
    """The callable named by ``package.module:function``."""
    module_name, _, function_name = family.partition(":")
    try:
        module = call_user_code(family, f"importing {module_name!r}", importlib.import_module, module_name)
    except UserCodeError as exc:
        missing = exc.__cause__.name if isinstance(exc.__cause__, ModuleNotFoundError) else None
        if missing and (module_name + ".").startswith(missing + "."):  # the module itself, not one it imports
            raise UserCodeError(_subject(family), f"cannot import {module_name!r}: no module named {missing!r} "
                                                  "(looked in the spec's folder, the working directory and PYTHONPATH)") from None
        raise
    builder = getattr(module, function_name, None)
    if builder is None:
        raise UserCodeError(_subject(family), f"module {module_name!r} has no attribute {function_name!r}")
    if not callable(builder):
        raise UserCodeError(_subject(family), f"{function_name!r} is a {type(builder).__name__}, not a function")
    return builder


def _guarded_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The user's forward; its own ``sys.exit`` or `KeyboardInterrupt` become a `UserCodeError`
    (other exceptions pass as they are: the engine tells out-of-memory apart, for one)."""
    try:
        return type(self).forward(self, *args, **kwargs)
    except (SystemExit, KeyboardInterrupt) as exc:
        error = _user_error(self._fleet_family, "forward", exc)
        if error is exc:
            raise
        raise error from None


def build(family: str, params: Mapping[str, Any], input_shape: InputShape, num_classes: int) -> nn.Module:
    """Import and call the user's function; check that it returns a `torch.nn.Module`."""
    builder = import_builder(family)
    try:
        model = call_user_code(family, "the builder", builder, input_shape=tuple(input_shape),
                               num_classes=num_classes, **params)
    except UserCodeError as exc:
        if isinstance(exc.__cause__, (TypeError, ValueError)):
            raise UserCodeError(_subject(family), f"bad params {dict(params)!r}: {_describe(exc.__cause__)}") from None
        raise
    if not isinstance(model, nn.Module):
        raise UserCodeError(_subject(family), f"returned a {type(model).__name__}, expected a torch.nn.Module")
    try:
        model._fleet_family = family
        model.forward = types.MethodType(_guarded_forward, model)
    except (AttributeError, TypeError, RuntimeError):  # a module that takes no attributes (scripted): unguarded
        pass
    return model


def check_forward(family: str, model: nn.Module, input_shape: InputShape, num_classes: int) -> None:
    """Run the model once on zeros: it has weights to train, runs, and returns ``(N, K)`` logits."""
    if not any(p.requires_grad for p in model.parameters()):
        raise UserCodeError(_subject(family), "the model has no trainable parameters")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = call_user_code(family, "forward", model, torch.zeros((CHECK_BATCH, *input_shape)))
    finally:
        model.train(was_training)
    expected = (CHECK_BATCH, num_classes)
    if not isinstance(out, torch.Tensor):
        raise UserCodeError(_subject(family), f"forward returned a {type(out).__name__}, expected a tensor of "
                                              f"logits of shape {expected} (batch, num_classes)")
    if tuple(out.shape) != expected:
        raise UserCodeError(_subject(family), f"forward returned shape {tuple(out.shape)} for a batch of "
                                              f"{CHECK_BATCH}, expected {expected} (batch, num_classes)")
