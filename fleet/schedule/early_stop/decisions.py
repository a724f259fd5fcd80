"""What early stopping decides about a model at a rung, and its JSON record."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Verdict(str, Enum):
    """What a model does after a rung.

    ``CONTINUE``: it trains on (``asha``). ``STOPPED``: it ends here, its GPUs free at once.
    ``PAUSED``: it waits at the rung, holding no GPU, until the rung has all its models
    (``sha``, ``hyperband``). ``PROMOTED``: a paused model trains on from its checkpoint.
    """

    CONTINUE = "continue"
    STOPPED = "stopped"
    PAUSED = "paused"
    PROMOTED = "promoted"


class RecordError(ValueError):
    """A malformed rung-decision record (or one that does not fit the run), naming the field.

    Attributes:
        field: the record's field.
        problem: what is wrong with it.
    """

    def __init__(self, field: str, problem: str):
        super().__init__(f"rung decision record: {field}: {problem}")
        self.field, self.problem = field, problem


def finite_or_none(value: float | None) -> float | None:
    """A metric as decisions keep it: a finite float, or None (missing, NaN or infinite)."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return None
    return float(value)


def rank_value(value: float | None) -> float:
    """A lower-is-better metric as ranks compare it: a missing one ranks last."""
    return math.inf if value is None else value


@dataclass(frozen=True)
class RungDecision:
    """One decision about one model at one rung.

    Attributes:
        model: the model's id.
        rung: the epochs the model had trained at the rung (``median``: the epoch).
        verdict: what the model does now.
        metric: the model's value compared (lower is better; None: missing or not finite).
        cutoff: the value it was compared against (None: no comparison, e.g. too few models).
        bracket: Hyperband's bracket of the model; 0 for the other methods.
        seq: the decision's place in the run's decisions, from 0.
    """

    model: str
    rung: int
    verdict: Verdict
    metric: float | None
    cutoff: float | None
    bracket: int = 0
    seq: int = 0

    def to_record(self) -> dict[str, Any]:
        """The decision as a JSON-safe dict (what `from_record` reads back)."""
        return {"model": self.model, "rung": self.rung, "verdict": self.verdict.value, "metric": self.metric,
                "cutoff": self.cutoff, "bracket": self.bracket, "seq": self.seq}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RungDecision:
        """The decision a record holds; keys beyond the decision's fields are ignored.

        Raises:
            RecordError: a field that is missing or malformed (the message names it).
        """
        if not isinstance(record, Mapping):
            raise RecordError("record", f"expected a mapping, got {type(record).__name__}")
        return cls(model=_model(record), rung=_count(record, "rung", 1), verdict=_verdict(record),
                   metric=_number(record, "metric"), cutoff=_number(record, "cutoff"),
                   bracket=_count(record, "bracket", 0), seq=_count(record, "seq", 0))


def _field(record: Mapping[str, Any], name: str) -> Any:
    if name not in record:
        raise RecordError(name, "missing")
    return record[name]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _model(record: Mapping[str, Any]) -> str:
    value = _field(record, "model")
    if not isinstance(value, str) or not value:
        raise RecordError("model", f"expected a model id, got {_shown(value)}")
    return value


def _count(record: Mapping[str, Any], name: str, least: int) -> int:
    value = _field(record, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise RecordError(name, f"expected an integer >= {least}, got {_shown(value)}")
    return value


def _verdict(record: Mapping[str, Any]) -> Verdict:
    value = _field(record, "verdict")
    try:
        return Verdict(value)
    except ValueError:
        valid = ", ".join(v.value for v in Verdict)
        raise RecordError("verdict", f"expected one of {valid}, got {_shown(value)}") from None


def _number(record: Mapping[str, Any], name: str) -> float | None:
    value = _field(record, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(name, f"expected a finite number or null, got {_shown(value)}")
    return float(value)
