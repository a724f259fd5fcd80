"""pyproject.toml and environment.yml list the same runtime dependencies (environment.yml with
TensorFlow, which pyproject.toml offers as the extras `tensorflow` and `tensorflow-cpu`)."""

import re
import tomllib

import yaml

from conftest import REPO

CONDA_TO_PIP = {"pytorch": "torch"}
CONDA_ONLY = {"python", "pip", "mpich"}  # the interpreter, the installer, and the MPI library itself


def requirement(text: str) -> tuple[str, str]:
    name, spec = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", text.strip()).groups()
    return name.lower(), spec.replace(" ", "")


def pyproject_deps(extra: str | None = None) -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return dict(requirement(d) for d in listed)


def conda_deps() -> dict[str, str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    deps = {}
    for item in env["dependencies"]:
        if isinstance(item, str):
            name, spec = requirement(item)
            if name not in CONDA_ONLY:
                deps[CONDA_TO_PIP.get(name, name)] = spec
    return deps


def test_environment_yml_matches_pyproject():
    assert conda_deps() == {**pyproject_deps(), **pyproject_deps("tensorflow")}


def test_the_two_tensorflow_extras_ask_for_the_same_versions():
    assert pyproject_deps("tensorflow") == {"tensorflow": pyproject_deps("tensorflow-cpu")["tensorflow-cpu"]}


def test_environment_installs_the_project_itself():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_items = [d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"]
    assert "-e ." in pip_items


def test_console_script_and_packages():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["fleet"] == "fleet.cli:main"
    assert set(project["tool"]["setuptools"]["packages"]["find"]["include"]) == {"fleet*", "preprocess*", "profiler*"}
