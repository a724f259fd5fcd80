"""Policy options: the typed, checked knobs a policy takes, declared next to the policy.

Each policy declares its options as a frozen dataclass deriving from :class:`PolicyOptions`,
one field per option, each made with :func:`option` (its default and its limits), and sets it
as the policy class's ``Options``::

    @dataclass(frozen=True)
    class FleetLocalOptions(PolicyOptions):
        delta: float | None = option(None, gt=0, optional=True)

Building the dataclass checks every value against its limits (and any cross-field rule the
subclass adds in ``__post_init__``) and raises :class:`OptionError` naming the option. The
spec (``scheduler:`` keys beside ``policy``), ``create_policy`` and the policies' own
constructors all go through it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class OptionError(ValueError):
    """A policy option that the policy does not take, or a value its rules reject.

    Attributes:
        option: the option's name.
        problem: what is wrong, without the option's name (for messages that name it their way).
    """

    def __init__(self, option: str, problem: str):
        super().__init__(f"option {option!r}: {problem}")
        self.option, self.problem = option, problem


@dataclass(frozen=True)
class Limits:
    """What values one option takes: a number (or an integer) within limits, maybe ``None``.

    Attributes:
        integer: whole numbers only.
        gt, ge, le: exclusive lower, inclusive lower and inclusive upper limits (None: no limit).
        optional: ``None`` is also a valid value (meaning what the option's doc says).
    """

    integer: bool = False
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    optional: bool = False

    def describe(self) -> str:
        """``'a number > 0 and <= 1'``, ``'an integer >= 1'``, ``'a number > 0, or null'``."""
        limits = [f"{op} {limit:g}" for op, limit in ((">", self.gt), (">=", self.ge), ("<=", self.le))
                  if limit is not None]
        text = ("an integer" if self.integer else "a number") + (" " + " and ".join(limits) if limits else "")
        return text + (", or null" if self.optional else "")

    def check(self, name: str, value: Any) -> Any:
        """``value`` as the option holds it (a float for a number option); raises `OptionError`."""
        if value is None and self.optional:
            return None
        if not self._within(value):
            raise OptionError(name, f"must be {self.describe()}, got {value!r}")
        return int(value) if self.integer else float(value)

    def _within(self, value: Any) -> bool:
        kinds = (int,) if self.integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
            return False
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.le is None or value <= self.le))


def option(default: Any, *, integer: bool = False, gt: float | None = None, ge: float | None = None,
           le: float | None = None, optional: bool = False) -> Any:
    """A field of a :class:`PolicyOptions` dataclass: its default and its :class:`Limits`."""
    limits = Limits(integer, gt, ge, le, optional)
    limits.check("default", default)  # a declaration whose default breaks its own limits is a bug
    return dataclasses.field(default=default, metadata={"limits": limits})


@dataclass(frozen=True)
class PolicyOptions:
    """Base of every policy's options: checks each field against its :func:`option` limits."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = field.metadata["limits"].check(field.name, getattr(self, field.name))
            object.__setattr__(self, field.name, value)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options this class declares, in declaration order."""
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def parse(cls, given: Mapping[str, Any], policy: str) -> "PolicyOptions":
        """The options from a mapping of the ones written; the others take their defaults.

        Args:
            given: option name -> value.
            policy: the policy's registry name, for the message about an option it does not take.

        Raises:
            OptionError: an option ``policy`` does not take (the message lists those it
                does), or a value its limits reject.
        """
        for name in given:
            if name not in cls.names():
                raise OptionError(str(name), f"policy {policy!r} takes no such option ({cls.listing()})")
        return cls(**given)

    @classmethod
    def listing(cls) -> str:
        """``'its options: alpha, delta'``, or ``'it takes none'``."""
        return f"its options: {', '.join(cls.names())}" if cls.names() else "it takes none"

    def as_dict(self) -> dict[str, Any]:
        """Every option by name (a plain mapping, as the spec holds and writes it)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NoOptions(PolicyOptions):
    """The options of a policy that takes none."""
