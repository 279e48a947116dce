"""The Python package mfattn (docs/python.md, "The package"): its layout, its imports and the
analysis scripts' one error convention.

- no module of the package, no analysis script and no experiment edits sys.path to reach
  analysis/ or a build (they import the package mfattn);
- the build's package folder (MODULE_DIR, build/python) holds the compiled mfattn._core beside
  copies of every file of analysis/mfattn, and every module imports from it in a fresh
  interpreter, composing one API (mfattn.load is mfattn.io.load, ...);
- the modules import each other without a circle (mfattn.io alone loads no mfattn.animate);
- analysis/mfattn alone (no build) gives the loader and the scripts, and the compiled names an
  ImportError saying how to build them;
- every analysis script runs its --help from any folder, and refuses bad input with one line
  "<script>: <message>" and exit status 2 (mfattn.cli), no traceback.
"""
from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ANALYSIS_DIR, MODULE_DIR, REPO_ROOT

PYTHON = "/usr/bin/python3"
SOURCE = ANALYSIS_DIR / "mfattn"
PACKAGE_FILES = sorted(p.name for p in SOURCE.iterdir() if p.suffix in (".py", ".html"))
MODULES = sorted(p.stem for p in SOURCE.glob("*.py") if p.stem != "__init__")
SCRIPTS = sorted(p.name for p in ANALYSIS_DIR.glob("*.py"))
SYS_PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)\b|sys\.path\s*(\+=|=)")


def fresh_python(code: str, pythonpath: Path | None, cwd: Path) -> subprocess.CompletedProcess:
    """`code` in a new /usr/bin/python3 whose only addition to sys.path is `pythonpath`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env["MPLBACKEND"] = "Agg"
    return subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_nothing_edits_sys_path_to_reach_the_package():
    for path in [*SOURCE.glob("*.py"), *ANALYSIS_DIR.glob("*.py")]:
        text = path.read_text(encoding="utf-8")
        assert not SYS_PATH_EDIT.search(text), f"{path.relative_to(REPO_ROOT)} edits sys.path"
    # The experiments, examples and benchmarks import the package (PYTHONPATH=analysis, or the
    # build's package folder): none puts analysis/ on sys.path, or a build folder's mfattn*.so.
    for path in [*REPO_ROOT.glob("experiments/**/*.py"), *REPO_ROOT.glob("examples/*.py"),
                 *REPO_ROOT.glob("bench/*.py")]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if SYS_PATH_EDIT.search(line):
                assert "analysis" not in line and not re.search(r'"build"\)*$', line), \
                    f"{path.relative_to(REPO_ROOT)}: {line.strip()}"


def test_the_analysis_scripts_are_entry_points_of_the_package():
    """analysis/<script>.py only runs the main() of a module of the package (its code, its
    --help and its tests are the module's)."""
    for name in SCRIPTS:
        tree = ast.parse((ANALYSIS_DIR / name).read_text(encoding="utf-8"))
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert len(imports) == 1 and isinstance(imports[0], ast.ImportFrom), name
        module = imports[0].module
        assert module.startswith("mfattn.") and module.split(".", 1)[1] in MODULES, (name, module)
        assert [alias.name for alias in imports[0].names] == ["main"], name


DOCUMENTED_COMMAND = re.compile(r"(?:python3?\s+(?:-\S+\s+)*|`)(?:\S*/)?analysis/([a-z_]+\.py)(?=\s)")


def test_every_documented_analysis_command_is_a_script():
    """Every command line that README.md, docs/, experiments/ or examples/ give for an analysis
    script (``python3 analysis/<name>.py ...`` or a code span ``analysis/<name>.py ARGS``) names
    a script here, which the tests below run (no command left naming a file that moved into
    the package)."""
    named = set()
    for path in [REPO_ROOT / "README.md", *REPO_ROOT.glob("docs/*.md"), *REPO_ROOT.glob("experiments/**/*"),
                 *REPO_ROOT.glob("examples/*.py"), *REPO_ROOT.glob("analysis/**/*.py")]:
        if path.is_file():
            named |= set(DOCUMENTED_COMMAND.findall(path.read_text(encoding="utf-8", errors="replace")))
    assert len(named) >= 10, sorted(named)
    assert named <= set(SCRIPTS), sorted(named - set(SCRIPTS))


def test_the_build_package_folder_holds_the_sources_and_the_compiled_module():
    """MODULE_DIR/mfattn (build/python/mfattn) is what the build copies from analysis/mfattn,
    byte for byte (a stale copy: run cmake --build), and the compiled _core."""
    built = MODULE_DIR / "mfattn"
    assert built.is_dir(), f"{built}: no package folder (cmake --build build makes it)"
    for name in PACKAGE_FILES:
        assert (built / name).is_file(), f"{built / name} missing: cmake --build the build of {MODULE_DIR.parent}"
        assert (built / name).read_bytes() == (SOURCE / name).read_bytes(), \
            f"{built / name} differs from analysis/mfattn/{name}: cmake --build the build of {MODULE_DIR.parent}"
    copies = sorted(p.name for p in built.iterdir() if p.suffix in (".py", ".html"))
    assert copies == PACKAGE_FILES, "files of the build's package that analysis/mfattn no longer has"
    assert list(built.glob("_core*.so")), f"no _core*.so in {built}"


IMPORT_EVERYTHING = r"""
import importlib, importlib.machinery, json, pkgutil, sys
import mfattn
modules = sorted(m.name for m in pkgutil.iter_modules(mfattn.__path__))
for name in modules:
    importlib.import_module("mfattn." + name)
import mfattn.io
t = mfattn.run(n=4, horizon=0.1)
print(json.dumps({
    "package": mfattn.__file__,
    "core": mfattn._core.__file__,
    "core_is_compiled": isinstance(mfattn._core.__loader__, importlib.machinery.ExtensionFileLoader),
    "modules": modules,
    "files": {name: sys.modules["mfattn." + name].__file__ for name in modules},
    "same": [mfattn.io.load is mfattn.load, mfattn.io.Trajectory is mfattn.Trajectory,
             mfattn.io.Density is mfattn.Density, mfattn.io.export_torch is mfattn.export_torch,
             mfattn.Model is mfattn._core.Model, mfattn.run is mfattn._core.run,
             mfattn.animate is sys.modules["mfattn.animate"], type(t) is mfattn.Trajectory],
    "model_module": mfattn.Model.__module__,
    "public": [hasattr(mfattn, n) for n in ("Model", "run", "meanfield", "options", "NumericalError", "load",
                                            "Trajectory", "Density", "export_torch", "io", "animate",
                                            "__version__")],
}))
"""


def test_every_module_imports_from_the_build_package_folder(tmp_path):
    done = fresh_python(IMPORT_EVERYTHING, MODULE_DIR, tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    package = MODULE_DIR / "mfattn"
    assert Path(seen["package"]) == package / "__init__.py"
    assert Path(seen["core"]).parent == package and seen["core_is_compiled"]
    assert seen["core"].endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert seen["modules"] == sorted(["_core", *MODULES])
    assert all(Path(f).parent == package for f in seen["files"].values()), seen["files"]
    assert all(seen["same"]), seen["same"]
    assert seen["model_module"] == "mfattn"
    assert all(seen["public"]), seen["public"]


def module_imports(path: Path) -> set[str]:
    """The modules of the package that `path` imports when it is imported (its top-level
    statements, inside a top-level try or if too; not inside a function or class)."""
    found = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    found.add(node.module.split(".")[0])
                elif node.level == 1:
                    found.update(alias.name for alias in node.names)
                elif node.module and node.module.startswith("mfattn."):
                    found.add(node.module.split(".")[1])
                elif node.module == "mfattn":
                    found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("mfattn."))
            elif isinstance(node, (ast.Try, ast.If)):
                for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    visit(block)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found & set(MODULES)


def test_the_modules_import_each_other_without_a_circle(tmp_path):
    graph = {name: module_imports(SOURCE / f"{name}.py") for name in MODULES}
    assert "animate" not in graph["io"] and "io" in graph["animate"]
    state: dict[str, str] = {}

    def walk(name: str, trail: list[str]) -> None:
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", "import circle: " + " -> ".join([*trail, name])
        state[name] = "open"
        for other in sorted(graph[name]):
            walk(other, [*trail, name])
        state[name] = "done"

    for name in MODULES:
        walk(name, [])
    # And as Python does it: the loader alone, in a fresh interpreter, loads neither the
    # animation code nor matplotlib (Trajectory.animate imports mfattn.animate when called).
    code = ("import sys, mfattn.io; print(sorted(m for m in sys.modules if m.startswith('mfattn'))); "
            "print('matplotlib' in sys.modules)")
    for folder in (MODULE_DIR, ANALYSIS_DIR):
        done = fresh_python(code, folder, tmp_path)
        assert done.returncode == 0, done.stderr
        loaded, matplotlib = done.stdout.splitlines()
        assert "mfattn.animate" not in loaded and matplotlib == "False", (folder, loaded)


def test_the_checkout_package_without_a_build_loads_files_and_names_the_build(run_mfattn, tmp_path):
    run = run_mfattn("--n", 6, "--d", 3, "--horizon", 0.2)
    code = (f"import mfattn\nt = mfattn.load({str(run)!r})\nprint(type(t).__name__, t.positions.shape)\n"
            "try:\n    mfattn.Model(n=4)\nexcept ImportError as error:\n    print(error)\n")
    done = fresh_python(code, ANALYSIS_DIR, tmp_path)
    assert done.returncode == 0, done.stderr
    loaded, message = done.stdout.splitlines()
    assert loaded.startswith("Trajectory (")
    assert message.startswith("mfattn.Model is in the compiled module mfattn._core, which ")
    for words in ("tests/run.sh", "PYTHONPATH=build/python", "pip install"):
        assert words in message, message


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_shows_its_help_from_any_folder(script, tmp_path):
    """From a folder outside the checkout, with no PYTHONPATH: the script finds the package
    beside it (nothing built or installed)."""
    done = subprocess.run([PYTHON, str(ANALYSIS_DIR / script), "--help"], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert script in done.stdout and not done.stderr, done.stdout + done.stderr


BAD_INPUT = {
    "animate.py": ["{missing}.h5", "--out", "{tmp}/a.gif"],
    "view.py": ["{missing}.h5", "--out", "{tmp}/a.html"],
    "plot_run.py": ["{missing}.h5", "--out", "{tmp}/figures"],
    "plot_sweep.py": ["{missing}"],
    "plot_meanfield.py": ["{missing}.h5"],
    "plot_reference.py": ["{missing}"],
    "plot_normalization.py": ["{missing}.csv", "--out", "{tmp}/a.png"],
    "plot_realization.py": ["{missing}.h5", "--out", "{tmp}/a.png"],
    "make_figures.py": ["--data", "{missing}"],
    "collapse_summary.py": ["{missing}"],
    "metastability_table.py": ["{missing}"],
    "sample_density.py": ["{missing}.h5", "--n", "4", "--seed", "1"],
    "export_torch.py": ["--heads", "2", "{missing}.pt", "{tmp}/out.h5"],
}


def test_every_script_is_in_the_bad_input_table():
    assert sorted(BAD_INPUT) == SCRIPTS


@pytest.mark.parametrize("script", sorted(BAD_INPUT))
def test_bad_input_is_one_line_and_exit_2(script, tmp_path):
    """A missing input is one line "<script>: <message>" naming it, exit 2 (mfattn.cli), as an
    argparse usage error is exit 2 too; no traceback either way."""
    args = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in BAD_INPUT[script]]
    done = subprocess.run([PYTHON, str(ANALYSIS_DIR / script), *args], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"}, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith(f"{script}: ") and "missing" in lines[0], lines
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("a.*"))
    usage = subprocess.run([PYTHON, str(ANALYSIS_DIR / script), "--no-such-option"], capture_output=True,
                           text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert usage.returncode == 2 and "Traceback" not in usage.stderr, usage.stderr
