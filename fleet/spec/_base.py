"""The base every spec section derives from (frozen; unknown keys name the valid ones; numbers
are finite and never booleans), and the one-line `SpecError` with its helpers."""

from __future__ import annotations

import reprlib
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from fleet.errors import UserError

MAX_MESSAGE = 400
"""Characters of a spec error's line at most (a value it shows is cut well before)."""

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 3, 40, 40, 40
_SHORT.maxtuple = _SHORT.maxlist = _SHORT.maxdict = _SHORT.maxset = 4


class SpecError(UserError):
    """A spec problem, as ``<yaml path>: <problem>``, in one line of at most `MAX_MESSAGE` characters."""

    def __init__(self, message: str):
        super().__init__(message)
        text = str(self)
        if len(text) > MAX_MESSAGE:
            self.args = (text[: MAX_MESSAGE - 3] + "...",)


def shown(value: Any) -> str:
    """A value as an error message shows it: short, and cheap however large the value is."""
    text = _SHORT.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def yaml_path(loc: tuple[Any, ...]) -> str:
    """('models', 3, 'params', 'blocks') -> 'models[3].params.blocks'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def valid_keys(model: type[BaseModel]) -> list[str]:
    """The keys a section accepts, as a user writes them (aliases first)."""
    return sorted(field.alias or name for name, field in model.model_fields.items())


KEYED_ERRORS = ("unknown_key", "bool_for_number", "field_error")
"""Kinds of errors a section raises about one of its keys (their context names it: ``key``)."""


def field_error(key: str, problem: str) -> PydanticCustomError:
    """An error about field `key` raised by a check of the whole section (a cross-field rule)."""
    return PydanticCustomError("field_error", "{problem}", {"key": key, "problem": problem})


def format_validation_error(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    """The first error of `exc` as one line; the count of the others at the end."""
    errors = exc.errors()
    first = errors[0]
    loc = prefix + tuple(p for p in first["loc"] if not (isinstance(p, str) and "[" in p))
    kind, ctx = first["type"], first.get("ctx") or {}
    if kind in KEYED_ERRORS:  # raised for the whole section: its key says where
        loc += (ctx["key"],)
        message = first["msg"]
    elif kind == "missing":
        message = "required field is missing"
    else:
        message = first["msg"].removeprefix("Value error, ")
        if kind not in ("value_error", "assertion_error") and "input" in first:
            message += f", got {shown(first['input'])}"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{yaml_path(loc) or 'spec'}: {message}{more}"


def at_most(limit: int, why: str) -> AfterValidator:
    """A field's upper limit, with the reason the message gives: ``Annotated[int, at_most(...)]``."""

    def check(value: Any) -> Any:
        if value is not None and not isinstance(value, str) and value > limit:
            raise ValueError(f"at most {limit:,} ({why}), got {value:,}")
        return value

    return AfterValidator(check)


def _numeric(annotation: Any) -> bool:
    """Whether a field of this type wants a number, and never a boolean (pydantic would take
    ``true`` for 1)."""
    if annotation in (int, float):
        return True
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _numeric(args[0])
    if origin is Literal:
        return all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
    if origin in (Union, types.UnionType):
        return any(_numeric(a) for a in args) and not any(a is bool or a is Any for a in args)
    return False


def _element(annotation: Any) -> Any:
    """The element type of a list or tuple field (of the first such member of a union), else None."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _element(args[0])
    if origin in (Union, types.UnionType):
        return next((e for e in map(_element, args) if e is not None), None)
    return args[0] if origin in (list, tuple) and args else None


def bool_for_number(annotation: Any, value: Any) -> bool:
    """Whether `value` holds a boolean where `annotation` wants a number (also in a list)."""
    if isinstance(value, bool):
        return _numeric(annotation)
    element = _element(annotation) if isinstance(value, (list, tuple)) else None
    return element is not None and any(bool_for_number(element, v) for v in value)


class Section(BaseModel):
    """A frozen spec section. An unknown key fails with the list of valid ones; a number must
    be finite (no ``.inf`` or ``.nan``), and a boolean is never taken for one."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(valid_keys(cls)) | set(cls.model_fields)
            for key in data:
                if key not in known:
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key (valid keys: {valid})",
                        {"key": str(key), "valid": ", ".join(valid_keys(cls))},
                    )
        return data

    @model_validator(mode="before")
    @classmethod
    def _reject_bools_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fields = {f.alias or name: f for name, f in cls.model_fields.items()} | cls.model_fields
            for key, value in data.items():
                if key in fields and bool_for_number(fields[key].annotation, value):
                    raise PydanticCustomError("bool_for_number", "expected a number, got a boolean ({value})",
                                              {"key": str(key), "value": str(value).lower()})
        return data
