"""The Release build (-O3 -march=native) and a portable build (no -march, -O1: the sanitizer
build of tests/run.sh) give the same trajectories to rounding. Contracted multiply-adds and
the vector width may change last bits, never more; both pair loops (symmetric and one-sided)
and both kernel widths (d <= 4 lanes over sources, d > 4 micro-kernels) are compared.

tests/run.sh sets MFATTN_PORTABLE_BINARY to the sanitizer build's mfattn; without it (no
sanitizer build) the comparison cannot run and says so as a skip.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

PORTABLE = os.environ.get("MFATTN_PORTABLE_BINARY")

CASES = {
    "symmetric-d3-usa": ["--d", "3", "--kernel", "usa"],
    "symmetric-d20-sa-rope": ["--d", "20", "--kernel", "sa", "--geometry", "rope"],
    "one-sided-d3-causal": ["--d", "3", "--kernel", "sa", "--mask", "causal"],
    "one-sided-d20-gaussian-q": ["--d", "20", "--kernel", "usa", "--q", "gaussian", "--beta", "0.5"],
}


def _positions(binary: Path | str, extra: list[str], out: Path) -> np.ndarray:
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    subprocess.run([str(binary), "run", "--n", "150", "--horizon", "1", "--save-every", "0.5",
                    "--integrator", "rk4", "--dt", "0.05", "--seed", "3", "--threads", "2",
                    "--quiet", "--out", str(out), *extra], check=True, env=env)
    with h5py.File(out, "r") as f:
        return f["particles/tokens/position/value"][...]


@pytest.mark.skipif(not PORTABLE, reason="MFATTN_PORTABLE_BINARY is not set (no portable build)")
@pytest.mark.parametrize("name", sorted(CASES))
def test_native_and_portable_builds_agree_to_rounding(mfattn_binary, tmp_path, name):
    native = _positions(mfattn_binary, CASES[name], tmp_path / "native.h5")
    portable = _positions(PORTABLE, CASES[name], tmp_path / "portable.h5")
    assert native.shape == portable.shape
    assert np.max(np.abs(native[0] - portable[0])) == 0.0, "initial states must be bit-identical"
    moved = np.max(np.abs(native[-1] - native[0]))
    assert moved > 1e-3, f"{name}: the tokens did not move ({moved})"
    assert np.max(np.abs(native - portable)) < 1e-12, name
