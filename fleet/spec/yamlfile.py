"""Reading a spec file within limits, before anything walks the document.

A spec is a few kilobytes of YAML. A file that is not (a 10 MB file, a "billion laughs"
alias bomb, a value that contains itself, nesting hundreds deep) is refused with one line
while it is read: its size is capped before parsing, its nodes are counted while they are
parsed, and the size the aliases expand it to is counted on the parsed node graph (each
shared node once) before any Python object is built. A key written twice in one mapping,
which YAML would resolve by silently dropping the first, is an error naming the key.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from fleet.spec._base import SpecError, yaml_path

MAX_SPEC_BYTES = 4 << 20
"""A spec file holds at most this much (4 MiB: a thousand times an ensemble of 100 models)."""
MAX_NODES = 250_000
"""Values (keys, scalars, lists and mappings) a spec may hold, as written or as its aliases expand."""
MAX_DEPTH = 64
"""How deep values may nest."""
SHOWN_DEPTH = 8  # an error names at most this many levels of a value's path
MERGE_TAG = "tag:yaml.org,2002:merge"

_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when PyYAML has it


class _TooManyNodes(Exception):
    """Raised by the loader while it parses, at the first node over `MAX_NODES`."""


class _CountingLoader(_Base):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader, which stops parsing at the first node over `MAX_NODES`
    (`resolve` is called once per node, also by libyaml's parser)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.resolved = 0

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        self.resolved += 1
        if self.resolved > MAX_NODES:
            raise _TooManyNodes
        return super().resolve(kind, value, implicit)


def read_text_capped(path: str | os.PathLike) -> str:
    """The file's text; a missing, unreadable, binary or oversized file is a `SpecError`."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, OSError) as exc:
        raise SpecError(f"{path}: cannot read: {exc.__class__.__name__}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: more than {MAX_SPEC_BYTES >> 20} MiB; a spec is a few kilobytes of YAML "
                        "(search spaces describe large ensembles)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: cannot read: not UTF-8 text (byte {exc.start})") from None


def _key_text(node: Node) -> str:
    return str(node.value) if isinstance(node, ScalarNode) else "?"


class _Walk:
    """One pass over the parsed node graph, each shared (anchored) node once: the size the
    aliases expand each value to, recursion, depth and duplicate keys, with their paths."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self.sizes: dict[int, int] = {}
        self.open: set[int] = set()

    def error(self, node: Node, loc: tuple[Any, ...], problem: str) -> SpecError:
        mark = node.start_mark
        where = yaml_path(loc[:SHOWN_DEPTH]) + ("..." if len(loc) > SHOWN_DEPTH else "")
        return SpecError(f"{self.path}:{mark.line + 1}:{mark.column + 1}: {where or 'spec'}: {problem}")

    def size(self, node: Node, loc: tuple[Any, ...] = ()) -> int:
        """How many values `node` stands for once its aliases are expanded."""
        key = id(node)
        if key in self.sizes:
            return self.sizes[key]
        if key in self.open:
            raise self.error(node, loc, "an alias refers to a value that contains it (a recursive alias)")
        if len(loc) > MAX_DEPTH:
            raise self.error(node, loc, f"values nest more than {MAX_DEPTH} levels deep")
        self.open.add(key)
        total = 1 + sum(self.size(child, child_loc) for child, child_loc in self.children(node, loc))
        self.open.discard(key)
        if total > MAX_NODES:
            raise self.error(node, loc, f"its aliases expand it to more than {MAX_NODES:,} values "
                                        "(a YAML alias bomb?); a spec is far smaller")
        self.sizes[key] = total
        return total

    def children(self, node: Node, loc: tuple[Any, ...]) -> list[tuple[Node, tuple[Any, ...]]]:
        if isinstance(node, SequenceNode):
            return [(child, loc + (i,)) for i, child in enumerate(node.value)]
        if not isinstance(node, MappingNode):
            return []
        self.check_keys(node, loc)
        out = []
        for key, value in node.value:
            out += [(key, loc + (_key_text(key),)), (value, loc + (_key_text(key),))]
        return out

    def check_keys(self, node: MappingNode, loc: tuple[Any, ...]) -> None:
        """A scalar key written twice in one mapping (merged ``<<`` keys may be overridden)."""
        seen: dict[tuple[str, str], Node] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == MERGE_TAG:
                continue
            first = seen.setdefault((key.tag, key.value), key)
            if first is not key:
                raise self.error(key, loc + (key.value,), f"duplicate key (first at line {first.start_mark.line + 1}); "
                                                          "YAML would silently keep only the last")


def _yaml_error(path: str | os.PathLike, exc: yaml.YAMLError) -> SpecError:
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return SpecError(f"{path}{where}: invalid YAML: {context + ', ' if context else ''}{problem}")


def read_yaml(path: str | os.PathLike) -> Any:
    """Parse a YAML file within the limits above; every problem is a one-line `SpecError`."""
    loader = _CountingLoader(read_text_capped(path))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _Walk(path).size(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    except _TooManyNodes:
        raise SpecError(f"{path}: more than {MAX_NODES:,} values; a spec is far smaller") from None
    except RecursionError:  # the pure-Python parser, on nesting deeper than Python's stack
        raise SpecError(f"{path}: values nest too deep (at most {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()
