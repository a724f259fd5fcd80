"""The layers of fleet, enforced: no import runs upward, no cycle between packages, imports at
the top of modules, and small pieces.

`LAYERS` lists the packages from the bottom up (docs/architecture.md draws the same map, and a
test keeps the two alike). A
module belongs to the longest listed name that prefixes it. An import may go to the same
layer or below, never above; the packages (listed names) must not import each other in a
circle, and neither may modules at import time. Imports inside ``if TYPE_CHECKING:`` are for
annotations only and are not counted. A project import inside a function is allowed only
with a comment on its line or the line above saying why (a heavy or side-effecting
dependency: torch, MPI's initialisation, matplotlib), and every function stays within 60
lines and every class within 250.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("fleet", "preprocess", "profiler")

LAYERS: list[tuple[str, ...]] = [
    ("fleet", "fleet.errors", "fleet.atomic", "fleet.rows", "fleet.registry", "fleet.runlock"),  # base utilities
    ("fleet.schedule", "fleet.profiling", "fleet.engines._base", "fleet.engines.options", "fleet.engines.registry",
     "fleet.engines.tree_codec", "fleet.runtime.train.collectives.__init__"),  # pure planning; interfaces, registries
    ("fleet.spec",),                                                   # YAML -> frozen spec
    ("fleet.schedule_io", "fleet.report", "preprocess"),               # profile files, results, data
    ("fleet.prediction",),                                             # runs predicted from a profile; the dry run
    ("fleet.engines", "fleet.inspect"),                                # engines and their zoos behind the interface
    ("fleet.runtime.protocol", "fleet.runtime.waiting", "fleet.runtime.context",
     "fleet.runtime.events"),                                          # the runtime's ground floor
    ("fleet.runtime.launch",),                                         # job environment, topology, signals
    ("fleet.runtime.data",),                                           # preprocessors, streams, queues
    ("fleet.runtime.train",),                                          # trainers, checkpoints, collectives
    ("fleet.runtime.control",),                                        # the coordinator (rank 0)
    ("fleet.runtime.rank", "fleet.runtime.finish"),                    # a rank's start-up, set-up and role; a job's end
    ("profiler",),                                                     # measuring rates and decoding under MPI
    ("fleet.rank_entry", "fleet.batch"),                               # per-rank entry: profile, then train; batch scripts
    ("fleet.commands",),                                               # the CLI's commands
    ("fleet.cli", "fleet.__main__"),
]
UNITS = {unit: level for level, units in enumerate(LAYERS) for unit in units}

MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


def unit_of(module: str, is_package: bool = False) -> str:
    """The listed name a module belongs to (a package's ``__init__`` may be listed on its own)."""
    if is_package and f"{module}.__init__" in UNITS:
        return f"{module}.__init__"
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in UNITS:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class Imports(ast.NodeVisitor):
    """A module's project imports: (target module, line, inside a function)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.found: list[tuple[str, int, bool]] = []
        self._depth = 0

    def visit_If(self, node: ast.If) -> None:
        if not _type_checking(node):
            self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:  # relative: resolve against this module's package
            base = self.module.split(".")
            base = base if self.is_package else base[:-1]
            target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        self._add(target, node.lineno)
        for alias in node.names:  # `from fleet.runtime.data import preprocessor` imports a module
            if f"{target}.{alias.name}" in ALL:
                self._add(f"{target}.{alias.name}", node.lineno)

    def _add(self, target: str, line: int) -> None:
        if target.split(".")[0] in ROOTS:
            self.found.append((target, line, self._depth > 0))


ALL = modules()


def project_imports() -> dict[str, list[tuple[str, int, bool]]]:
    out = {}
    for module, path in ALL.items():
        visitor = Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        out[module] = visitor.found
    return out


IMPORTS = project_imports()


def _unit(module: str) -> str:
    return unit_of(module, ALL.get(module, Path()).name == "__init__.py")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_layer():
    for module in ALL:
        _unit(module)


def _documented_layers() -> dict[int, set[str]]:
    """The module map of docs/architecture.md: its layer number -> the names in its package column
    (``fleet.runtime.{protocol,waiting}`` spelled out)."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    layers: dict[int, set[str]] = defaultdict(set)
    for level, cell in re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M):
        for name in re.findall(r"`([\w.{},]+)`", cell):
            if name.split(".")[0] not in ROOTS:
                continue  # a word in the cell, e.g. (package `__init__`)
            stem, _, rest = name.partition("{")
            layers[int(level)] |= {stem + part for part in rest.rstrip("}").split(",")} if rest else {name}
    return layers


def test_the_documented_module_map_is_the_layer_list():
    documented = _documented_layers()
    assert sorted(documented) == list(range(len(LAYERS)))
    misplaced = [f"{name} (layer {level})" for level, names in documented.items() for name in names
                 if UNITS[unit_of(name, f"{name}.__init__" in UNITS)] != level]
    missing = [unit for unit in UNITS if unit != "fleet" and unit.removesuffix(".__init__") not in documented[UNITS[unit]]]
    assert not misplaced and not missing, f"misplaced in the docs: {misplaced}; not in the docs: {missing}"


def test_no_import_runs_up_a_layer():
    upward = []
    for module, found in IMPORTS.items():
        level = UNITS[_unit(module)]
        for target, line, _ in found:
            if target in ALL or any(m.startswith(target + ".") for m in ALL):
                if UNITS[_unit(target)] > level:
                    upward.append(f"{ALL[module].relative_to(REPO)}:{line} imports {target} ({_unit(module)} < {_unit(target)})")
    assert not upward, "\n".join(upward)


def test_no_cycle_between_the_listed_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, found in IMPORTS.items():
        for target, _, _ in found:
            if target in ALL and _unit(target) != _unit(module):
                graph[_unit(module)].add(_unit(target))
    assert _cycles(graph) == []


def test_no_cycle_between_modules_at_import_time():
    graph = {module: {t for t, _, inside in found if not inside and t in ALL and t != module}
             for module, found in IMPORTS.items()}
    # importing a module runs its packages' __init__ first: a parent package is not a cycle
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not module.startswith(t + ".")}
    assert _cycles(graph) == []


def test_project_imports_inside_functions_say_why():
    silent = []
    for module, found in IMPORTS.items():
        lines = ALL[module].read_text(encoding="utf-8").splitlines()
        for target, line, inside in found:
            text, above = lines[line - 1], lines[line - 2].strip() if line > 1 else ""
            if inside and "#" not in text and not above.startswith("#"):
                silent.append(f"{ALL[module].relative_to(REPO)}:{line}: {text.strip()}")
    assert not silent, f"{len(silent)} function-level imports without a reason:\n" + "\n".join(silent)


@pytest.mark.parametrize("root", ROOTS)
def test_functions_and_classes_are_small(root):
    big = []
    for path in sorted((REPO / root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            size = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION_LINES:
                big.append(f"{path.relative_to(REPO)}:{node.lineno} function {node.name}: {size} lines")
            elif isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES:
                big.append(f"{path.relative_to(REPO)}:{node.lineno} class {node.name}: {size} lines")
    assert not big, "\n".join(big)
