"""No source under src/ includes a header of a folder above its own (docs/architecture.md,
"Layers"), and no public header includes one of a layer above its own. The link check
(tests/layers) sees calls between the libraries; this sees the header-only includes it cannot:
a folder may include private headers of its own folder and of the layers below it, and public
headers (include/mfattn/LAYER/...) of its own layer and the layers below it. A public header
of a layer includes public headers of its layer and the layers below only."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The layers, lowest first; folders of one rank are independent of each other.
RANK = {"core": 0, "kernels": 1, "backends": 2, "integrators": 3, "observers": 4, "io": 4,
        "oattn": 4, "meanfield": 4, "app": 5, "sweep": 6, "analyze": 6, "cli": 7}
INCLUDE = re.compile(r'#include "([a-z_]+)/')
PUBLIC = re.compile(r'#include "mfattn/([a-z0-9_]+)/')
PUBLIC_ROOT = ROOT / "include" / "mfattn"


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


def test_every_public_header_lives_in_a_layer_folder():
    loose = sorted(p.name for p in PUBLIC_ROOT.iterdir() if p.is_file())
    assert loose == [], f"include/mfattn/ holds one folder per layer, not files: {loose}"
    folders = {p.name for p in PUBLIC_ROOT.iterdir() if p.is_dir()}
    assert folders <= set(RANK) - {"kernels", "cli"}, folders - set(RANK)


def test_no_header_name_is_used_twice():
    names = {}
    for root in (ROOT / "src", PUBLIC_ROOT):
        for path in root.rglob("*.hpp"):
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not twice, twice


def test_no_public_header_is_included_from_a_layer_above():
    wrong = []
    sources = [(p, p.relative_to(ROOT / "src").parts[0]) for p in sorted((ROOT / "src").rglob("*"))
               if p.suffix in {".cpp", ".hpp", ".cu"}]
    sources += [(p, p.relative_to(PUBLIC_ROOT).parts[0]) for p in sorted(PUBLIC_ROOT.rglob("*.hpp*"))]
    for path, layer in sources:
        for included in PUBLIC.findall(path.read_text()):
            if included not in RANK or RANK[included] > RANK[layer] or (
                    RANK[included] == RANK[layer] and included != layer):
                wrong.append(f"{path.relative_to(ROOT)} ({layer}) includes mfattn/{included}/")
    assert not wrong, "\n".join(wrong)


# What a header of src/kernels/ may include: the standard library, its own folder, and the
# dependency-free headers below it, so that every header there compiles for a CUDA device
# (tests/CMakeLists.txt compiles all of them with nvcc where it is found). A Model, Eigen or a
# backend's header is the host side's (src/backends/model_sources.hpp, token_operands.hpp).
KERNELS_MAY_INCLUDE = {"core/counter_random.hpp", "mfattn/core/rng.hpp", "mfattn/core/pair_kinds.hpp",
                       "mfattn/core/layer_kinds.hpp"}
QUOTED = re.compile(r'#include "([^"]+)"')


def test_kernels_headers_include_nothing_a_device_cannot_compile():
    wrong = []
    for path in sorted((ROOT / "src" / "kernels").glob("*")):
        for included in QUOTED.findall(path.read_text()):
            if not included.startswith("kernels/") and included not in KERNELS_MAY_INCLUDE:
                wrong.append(f"{path.relative_to(ROOT)} includes {included}")
        if "<Eigen" in path.read_text():
            wrong.append(f"{path.relative_to(ROOT)} includes Eigen")
    assert not wrong, "\n".join(wrong)



# A backend's own folder (src/backends/cpu/, cuda/, reference/) is its private code: only the
# backends layer reads it. What another layer shares with a backend (the observers' cluster
# forests) lives in src/core/ or src/kernels/.
BACKEND_PRIVATE = re.compile(r'#include "backends/(cpu|cuda|reference)/')


def test_no_layer_above_reads_a_backends_private_headers():
    wrong = []
    for path in sorted((ROOT / "src").rglob("*")):
        if path.suffix not in {".cpp", ".hpp", ".cu"}:
            continue
        if path.relative_to(ROOT / "src").parts[0] == "backends":
            continue
        for folder in BACKEND_PRIVATE.findall(path.read_text()):
            wrong.append(f"{path.relative_to(ROOT)} includes backends/{folder}/")
    assert not wrong, "\n".join(wrong)


def test_the_observers_include_nothing_of_the_cpu_backend():
    # The rule above, named for the case it was written for: the observers' pair pass reached
    # into the CPU backend's lane headers.
    observers = sorted((ROOT / "src" / "observers").glob("*.[ch]pp"))
    assert observers
    wrong = [str(p.relative_to(ROOT)) for p in observers if '#include "backends/cpu/' in p.read_text()]
    assert not wrong, wrong


def test_namespace_kernels_is_only_in_src_kernels():
    # mfattn::kernels is the formulas' namespace (one definition of the physics); the code that
    # reads a Model on the host is mfattn::host, a backend's own code its backend's namespace.
    opening = re.compile(r"^\s*namespace\s+(mfattn::)?kernels\b", re.M)
    wrong = []
    for root in (ROOT / "src", ROOT / "include", ROOT / "python"):
        for path in sorted(root.rglob("*")):
            if path.suffix not in {".cpp", ".hpp", ".cu", ".cuh"}:
                continue
            if path.is_relative_to(ROOT / "src" / "kernels"):
                continue
            if opening.search(path.read_text()):
                wrong.append(str(path.relative_to(ROOT)))
    assert not wrong, wrong
