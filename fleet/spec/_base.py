"""The base every spec section derives from: frozen, and unknown keys name the valid ones."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError


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
