"""Rewrite the golden batch scripts (and the slurm/, lsf/ examples) from the renderer.

    .venv/bin/python tests/golden/regenerate.py

Run it only after a deliberate template change, then read `git diff tests/golden`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from golden.cases import CASES, GOLDEN, REPO, render_case, with_commentary  # noqa: E402


def main() -> None:
    for case in CASES:
        text = render_case(case)
        (GOLDEN / case.name).write_text(text)
        print(f"wrote {GOLDEN / case.name}")
        if case.example:
            example = REPO / case.example
            old = example.read_text() if example.exists() else ""
            example.write_text(with_commentary(text, old))
            print(f"wrote {example}")


if __name__ == "__main__":
    main()
