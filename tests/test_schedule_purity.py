"""fleet/schedule imports nothing but the standard library and numpy, and does no file I/O."""

import ast
import sys
from pathlib import Path

import pytest

SCHEDULE = Path(__file__).resolve().parents[1] / "fleet" / "schedule"
FILES = sorted(SCHEDULE.rglob("*.py"))

# standard-library modules that exist to do I/O or talk to other processes
IO_MODULES = {"os", "io", "pathlib", "shutil", "json", "pickle", "shelve", "csv", "tempfile",
              "socket", "subprocess", "sqlite3", "glob", "fileinput", "multiprocessing", "threading"}
IO_CALLS = {"open", "load", "loads", "dump", "dumps", "read_text", "write_text", "read_bytes",
            "write_bytes", "save", "savez", "savetxt", "loadtxt", "fromfile", "tofile", "genfromtxt",
            "print", "input"}


def imported_roots(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module, node.lineno


def test_there_are_files_to_check():
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SCHEDULE)))
def test_imports_only_stdlib_numpy_and_itself(path):
    tree = ast.parse(path.read_text(), str(path))
    for module, line in imported_roots(tree):
        root = module.split(".")[0]
        if module.startswith("fleet.schedule") or root == "numpy" or root == "__future__":
            continue
        assert root in sys.stdlib_module_names, f"{path.name}:{line} imports {module}"
        assert root not in IO_MODULES, f"{path.name}:{line} imports {module}, an I/O module"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SCHEDULE)))
def test_no_file_io_calls(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            assert name not in IO_CALLS, f"{path.name}:{node.lineno} calls {name}()"
