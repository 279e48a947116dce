"""Shared fixtures of the Python tests.

Run from the repository root:

    MFATTN_BINARY=/path/to/mfattn MPLBACKEND=Agg /usr/bin/python3 -m pytest -q tests/python

MFATTN_BINARY defaults to build/mfattn in the repository root. A missing binary fails every
test that needs it, with a message saying where it was looked for (nothing is skipped).

The Python package mfattn is the one in the package folder of the same build (python/ beside
the binary: BUILD_DIR/python/mfattn, with the compiled mfattn._core), which this file puts
first on sys.path; MFATTN_PYTHON_MODULE_DIR names another folder holding mfattn/. Without one
there, the tests import the checkout's analysis/mfattn (the pure-Python modules), and those
that need the compiled module (the `mfattn` fixture) fail saying where it was looked for.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# the analysis scripts (analysis/*.py) and the source of the package's pure-Python modules
ANALYSIS_DIR = REPO_ROOT / "analysis"
# the build folder of the binary under test (MFATTN_BINARY's folder)
BUILD_DIR = (Path(os.environ["MFATTN_BINARY"]).expanduser().resolve().parent if os.environ.get("MFATTN_BINARY")
             else REPO_ROOT / "build")
# the folder that holds the package mfattn/ (mfattn/_core*.so and the .py files): the build's
MODULE_DIR = Path(os.environ.get("MFATTN_PYTHON_MODULE_DIR", BUILD_DIR / "python")).resolve()
_PACKAGE_HOME = MODULE_DIR if (MODULE_DIR / "mfattn" / "__init__.py").is_file() else ANALYSIS_DIR
if str(_PACKAGE_HOME) not in sys.path:
    sys.path.insert(0, str(_PACKAGE_HOME))


@pytest.fixture(scope="session")
def mfattn_binary() -> Path:
    """Absolute path of the mfattn executable (MFATTN_BINARY, default <repo>/build/mfattn)."""
    given = os.environ.get("MFATTN_BINARY")
    path = Path(given).expanduser().resolve() if given else REPO_ROOT / "build" / "mfattn"
    source = "MFATTN_BINARY" if given else "the default <repo>/build/mfattn (MFATTN_BINARY unset)"
    if not path.is_file():
        pytest.fail(f"mfattn binary not found at {path} (from {source}); build it with "
                    "`cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build "
                    "--target mfattn` or set MFATTN_BINARY", pytrace=False)
    if not os.access(path, os.X_OK):
        pytest.fail(f"mfattn binary at {path} (from {source}) is not executable", pytrace=False)
    return path


@pytest.fixture
def run_mfattn(mfattn_binary: Path, tmp_path: Path):
    """Returns ``run(*args, out="run.h5") -> Path``: runs ``mfattn run ARGS --quiet --out
    tmp_path/out`` and returns the output file. Arguments may be numbers. Unless ARGS name
    --threads, the run uses one thread (the test files are tiny, and OpenMP start-up on a
    loaded machine costs more than the run). A nonzero exit fails the test with the command
    line and the program's output."""

    def run(*args, out: str = "run.h5", timeout: float = 300.0) -> Path:
        target = tmp_path / out
        args = [str(a) for a in args]
        if "--threads" not in args:
            args += ["--threads", "1"]
        command = [str(mfattn_binary), "run", *args, "--quiet", "--out", str(target)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            pytest.fail(f"mfattn exited with {done.returncode}: {' '.join(command)}\n"
                        f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}", pytrace=False)
        if not target.is_file():
            pytest.fail(f"mfattn exited with 0 but wrote no file: {' '.join(command)}",
                        pytrace=False)
        return target

    return run


@pytest.fixture(scope="module")
def mfattn():
    """The Python package mfattn with its compiled module (MODULE_DIR/mfattn/_core*.so); its
    absence fails the test, saying where it was looked for."""
    if not list(MODULE_DIR.glob("mfattn/_core*.so")):
        pytest.fail(f"no mfattn/_core*.so in {MODULE_DIR} (build it with cmake --build build; "
                    "pybind11-dev and python3-dev must be installed)", pytrace=False)
    import mfattn as module
    assert module._core is not None, module.__file__
    return module


def bits(array: np.ndarray) -> np.ndarray:
    """The float64 values' bit patterns (uint64), for bit-for-bit comparisons."""
    return np.ascontiguousarray(array, dtype=np.float64).view(np.uint64)


def as_kwargs(args: list[str]) -> dict:
    """Command-line words as Python keywords ('--aux-factor distance' -> aux_factor='distance';
    a flag without a value -> True)."""
    out, k = {}, 0
    while k < len(args):
        name = args[k][2:].replace("-", "_")
        if k + 1 < len(args) and not args[k + 1].startswith("--"):
            out[name] = args[k + 1]
            k += 2
        else:
            out[name] = True
            k += 1
    return out
