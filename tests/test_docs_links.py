"""The README and docs/*.md: every relative link (and its #anchor) resolves, the README stays a
five-minute read, it lists every `fleet` command, and docs/spec.md names every spec field."""

import re
from pathlib import Path

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 220
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a link-like string in code is not a link)."""
    lines, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            lines.append(line)
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, code marks and punctuation dropped, spaces to '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(path).splitlines():
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            base = slug(match.group(1))
            name, n = base, 1
            while name in found:  # GitHub numbers repeated headings: name, name-1, name-2
                name, n = f"{base}-{n}", n + 1
            found.add(name)
    return found


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_docs_pages_exist_and_the_index_links_them_all():
    names = {p.name for p in (REPO / "docs").glob("*.md")}
    assert {"README.md", "spec.md", "cluster.md", "run-directory.md", "architecture.md"} <= names
    indexed = {Path(t.partition("#")[0]).name for t in links(REPO / "docs" / "README.md")}
    assert names - {"README.md"} <= indexed


def test_the_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; keep it under {README_MAX_LINES} (details go to docs/)"


def subcommands(parser) -> dict:
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def test_the_readme_lists_every_command():
    from fleet.cli import build_parser

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = subcommands(build_parser())
    names = [f"fleet {name}" for name in commands if name != "data"]
    names += [f"fleet data {name}" for name in subcommands(commands["data"])]
    missing = [name for name in names if f"`{name}" not in readme]
    assert not missing, f"README.md's command table lacks {missing}"


def spec_sections():
    from fleet.schedule.early_stop import METHODS
    from fleet.schedule.planners import POLICIES
    from fleet.spec.families import FAMILIES
    from fleet.spec.load import RawSpec
    from fleet.spec.search import Dimension, ModelEntry
    from fleet.spec.sections import (OPS, ClusterSpec, DataSpec, EarlyStopSpec, LRSchedule, RuntimeSpec, SchedulerSpec,
                                     StopRule, TrainSpec)

    sections = {"top level": RawSpec, "data": DataSpec, "train": TrainSpec, "train.schedule": LRSchedule,
                "train.stop": StopRule, "scheduler": SchedulerSpec, "scheduler.early_stop": EarlyStopSpec,
                "cluster": ClusterSpec, "runtime": RuntimeSpec, "models[]": ModelEntry, "search dimension": Dimension}
    sections |= {f"family {name}": params for name, params in FAMILIES.items()}
    sections |= {f"op {name}": op for name, op in OPS.items()}
    fields = {where: [f.alias or name for name, f in model.model_fields.items() if name not in ("op", "options")]
              for where, model in sections.items()}
    fields |= {f"policy {name}": list(policy.Options.names()) for name, policy in POLICIES.items()}
    fields["names"] = [*FAMILIES, *OPS, *POLICIES, *METHODS]
    return fields


def test_docs_spec_md_names_every_field_family_op_and_policy():
    text = (REPO / "docs" / "spec.md").read_text(encoding="utf-8")
    missing = [f"{where}: {name}" for where, names in spec_sections().items() for name in names
               if f"`{name}`" not in text]
    assert not missing, f"docs/spec.md does not mention {missing}"
