"""No source under src/ includes a private header of a folder above its own (docs/architecture.md,
"Layers"). The link check (tests/layers) sees calls between the libraries; this sees the
header-only includes it cannot: a folder may include private headers of its own folder and
of the layers below it, and public headers (mfattn/...) everywhere."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The layers, lowest first; folders of one rank are independent of each other.
RANK = {"core": 0, "kernels": 1, "backends": 2, "integrators": 3, "observers": 4, "io": 4,
        "oattn": 4, "app": 5, "sweep": 6, "analyze": 6, "cli": 7}
INCLUDE = re.compile(r'#include "([a-z_]+)/')


def test_every_folder_of_src_has_a_rank():
    folders = {p.name for p in (ROOT / "src").iterdir() if p.is_dir()}
    assert folders == set(RANK), folders ^ set(RANK)


def test_no_private_header_is_included_from_a_folder_above_or_beside():
    wrong = []
    for path in sorted((ROOT / "src").rglob("*")):
        if path.suffix not in {".cpp", ".hpp", ".cu"}:
            continue
        folder = path.relative_to(ROOT / "src").parts[0]
        for included in INCLUDE.findall(path.read_text()):
            if included == "mfattn":
                continue
            if included not in RANK or RANK[included] > RANK[folder] or (
                    RANK[included] == RANK[folder] and included != folder):
                wrong.append(f"{path.relative_to(ROOT)} includes {included}/")
    assert not wrong, "\n".join(wrong)
