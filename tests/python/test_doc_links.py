"""The documentation's relative links resolve, and the README's set-up commands stay the two.

Every Markdown file of the repository (README.md, docs/, bench/, fuzz/, tests/) is read; each
relative link or image outside code must name a file or folder inside the repository, and a
`#fragment` must be the GitHub anchor of one of the target's headings. Web links are not
followed. Needs no mfattn binary.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import REPO_ROOT


def markdown_files() -> list[Path]:
    """The repository's Markdown files, not descending into hidden folders, build folders
    (build, build-sanitize, ...) or data/ (experiment output)."""
    found = []
    for folder, subfolders, files in os.walk(REPO_ROOT):
        top = Path(folder) == REPO_ROOT
        subfolders[:] = [s for s in subfolders
                         if not s.startswith((".", "build")) and not (top and s == "data")]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


MARKDOWN = markdown_files()
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def without_fences(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", without_fences(text))


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    result = set()
    for line in without_fences(path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO_ROOT)}: ({target})"
        if not resolved.is_relative_to(REPO_ROOT):
            problems.append(f"{where} points outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{where}: no heading with anchor #{fragment}")
    return problems


def test_markdown_files_are_found():
    names = {p.relative_to(REPO_ROOT).as_posix() for p in MARKDOWN}
    assert {"README.md", "docs/model.md", "docs/testing.md"} <= names


def test_every_relative_link_resolves():
    problems = [problem for path in MARKDOWN for problem in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_readme_setup_commands_are_the_two_scripts():
    """`.ci/run` runs "exactly the README's test command": the set-up block holds the two."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Set up on a fresh Debian machine", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, flags=re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["experiments/run_collapse.sh", "tests/run.sh"]
    assert "bash tests/run.sh" in (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
