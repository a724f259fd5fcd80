"""The base every spec section derives from (frozen; unknown keys name the valid ones; numbers
are finite and never booleans), and the one-line `SpecError` with its helpers."""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
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


class Section(BaseModel):
    """A frozen spec section. An unknown key fails with the list of valid ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

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
