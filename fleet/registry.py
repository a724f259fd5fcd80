"""Registries: pluggable parts found by name, imported only when one is used.

A `Registry` maps each name to ``"package.module:attribute"``. Listing the names (for a
spec's validation, a ``--help`` text or an error message) imports nothing, so a registry of
engines can name a framework that is not installed, and importing the spec never imports one.
`load` imports the implementation the first time it is asked for.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from fleet.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names of one kind of part (``framework``, ``collective``, ...) -> lazily imported objects.

    Args:
        kind: what the names are, as messages say it (``framework``).
        entries: name -> ``"package.module:attribute"``, in the order the names are listed.

    Thread-safe: `load` may be called from several threads; each target is imported once.
    """

    def __init__(self, kind: str, entries: Mapping[str, str]):
        self.kind = kind
        self._entries: dict[str, str] = {}
        self._loaded: dict[str, T] = {}
        self._lock = threading.RLock()  # an implementation may load another name while imported
        for name, target in entries.items():
            self.add(name, target)

    def add(self, name: str, target: str) -> None:
        """Register `name` as ``"package.module:attribute"`` (a plugin's or a test's entry)."""
        module, _, attribute = target.partition(":")
        if not module or not attribute:
            raise ValueError(f"{self.kind} {name!r}: expected 'package.module:attribute', got {target!r}")
        with self._lock:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = target

    def remove(self, name: str) -> None:
        """Forget `name` (and what was loaded for it)."""
        with self._lock:
            self._entries.pop(name, None)
            self._loaded.pop(name, None)

    @property
    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def unknown(self, name: Any) -> str:
        """The one-line message for a name that is not registered."""
        return f"unknown {self.kind} {name!r} (valid: {', '.join(self.names)})"

    def load(self, name: str) -> T:
        """The object registered as `name`, imported on first use.

        Raises:
            UserError: `name` is not registered.
            ImportError: its module (or a dependency, e.g. the framework) cannot be imported.
        """
        if name not in self._entries:
            raise UserError(self.unknown(name))
        with self._lock:
            if name not in self._loaded:
                module, _, attribute = self._entries[name].partition(":")
                self._loaded[name] = getattr(importlib.import_module(module), attribute)
            return self._loaded[name]
