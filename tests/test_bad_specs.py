"""Every malformed spec in tests/specs/bad gives exit 2 and one line naming the field."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO, run_fleet

BAD = sorted((REPO / "tests" / "specs" / "bad").glob("*.yaml"))


def expected_message(path: Path) -> str:
    first = path.read_bytes().decode("utf-8", "replace").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' line"
    return first[len("# expect: "):]


def test_there_are_enough_bad_specs():
    assert len(BAD) >= 25


@pytest.fixture(scope="module")
def outcomes():
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = pool.map(lambda p: run_fleet("validate", str(p.relative_to(REPO))), BAD)
        return dict(zip(BAD, runs))


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_spec_is_one_line_exit_2(path, outcomes):
    result = outcomes[path]
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("fleet validate: error: ")
    assert expected_message(path) in lines[0]
    assert result.stdout == ""
