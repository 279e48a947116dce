"""Every build and every CPU kernel set gives the same trajectories to rounding, and each one is
bitwise identical across thread counts.

The builds compared:
- the Release build (tests/run.sh's build/mfattn): by default a dispatching binary carrying
  kernels for AVX-512, AVX2 + FMA and SSE2; MFATTN_CPU_KERNELS forces each set this CPU runs;
- the portable sanitizer build (clang where installed, no -march, no dispatch: SSE2 kernels;
  -O0, its numerical libraries -O1), set as MFATTN_PORTABLE_BINARY by tests/run.sh;
- any further builds listed in MFATTN_EXTRA_BINARIES (colon-separated paths; e.g. the native,
  x86-64-v3 and x86-64-v2 builds of tests/isa_builds.sh).

All of them take every sum in the same order (8 logical lanes on every ISA, see
docs/cpu-kernels.md); only contracted multiply-adds (none on SSE2) change last bits. Both pair
loops (symmetric and one-sided), the small-system loop and both kernel widths (d <= 4 lanes over sources, d > 4
micro-kernels) are compared.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

PORTABLE = os.environ.get("MFATTN_PORTABLE_BINARY")
EXTRA = [p for p in os.environ.get("MFATTN_EXTRA_BINARIES", "").split(":") if p]

CASES = {
    "symmetric-d3-usa": ["--d", "3", "--kernel", "usa"],
    "symmetric-d20-sa-rope": ["--d", "20", "--kernel", "sa", "--geometry", "rope"],
    "symmetric-d3-window-distance": ["--d", "3", "--kernel", "sa", "--mask", "window",
                                     "--window", "30", "--aux-factor", "distance",
                                     "--aux-lambda", "0.05"],
    "one-sided-d3-causal": ["--d", "3", "--kernel", "sa", "--mask", "causal"],
    "one-sided-d20-gaussian-q": ["--d", "20", "--kernel", "usa", "--q", "gaussian", "--beta", "0.5"],
    "small-systems-d2-sa-per-replica": ["--n", "32", "--d", "2", "--kernel", "sa", "--k", "goe-unit",
                                        "--matrices", "per-replica", "--replicas", "4"],
}


def _kernel_sets(binary: Path | str) -> list[str]:
    out = subprocess.run([str(binary), "--version"], check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        if line.startswith("cpu kernels this CPU runs:"):
            return line.split(":", 1)[1].split()
    raise AssertionError(f"{binary} --version names no kernel sets:\n{out}")


def _positions(binary: Path | str, extra: list[str], out: Path, kernels: str | None = None,
               threads: int = 2, n: int = 150) -> np.ndarray:
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    env.pop("MFATTN_CPU_KERNELS", None)
    if kernels:
        env["MFATTN_CPU_KERNELS"] = kernels
    # A case that names its own token count (the small-system loop's) keeps it.
    size = [] if "--n" in extra else ["--n", str(n)]
    subprocess.run([str(binary), "run", *size, "--horizon", "1", "--save-every", "0.5",
                    "--integrator", "rk4", "--dt", "0.05", "--seed", "3", "--threads",
                    str(threads), "--quiet", "--overwrite", "--out", str(out), *extra],
                   check=True, env=env)
    with h5py.File(out, "r") as f:
        if kernels:
            used = f["parameters"].attrs["cpu_kernels_used"]
            used = used.decode() if isinstance(used, bytes) else str(used)
            assert used == kernels, f"/parameters says {used}, {kernels} was asked for"
        return f["particles/tokens/position/value"][...]


def _variants(mfattn_binary) -> list[tuple[str, str, str | None]]:
    """(label, binary, kernel set) for every build and kernel set to compare."""
    variants = [(f"release:{k}", str(mfattn_binary), k) for k in _kernel_sets(mfattn_binary)]
    if PORTABLE:
        variants.append(("portable", PORTABLE, None))
    variants += [(f"extra:{Path(p).parent.name}", p, None) for p in EXTRA]
    return variants


def test_release_build_carries_the_kernels_this_cpu_runs(mfattn_binary):
    sets = _kernel_sets(mfattn_binary)
    assert sets, "no kernel set runs here"
    out = subprocess.run([str(mfattn_binary), "--version"], check=True, capture_output=True,
                         text=True).stdout
    chosen = next(l for l in out.splitlines() if l.startswith("cpu kernels:")).split()[2]
    assert chosen == sets[0], f"the best set this CPU runs is {sets[0]}, {chosen} was chosen"


def test_an_unknown_kernel_set_is_refused_with_exit_2(mfattn_binary, tmp_path):
    env = dict(os.environ, MFATTN_CPU_KERNELS="no-such-isa")
    result = subprocess.run([str(mfattn_binary), "run", "--n", "8", "--horizon", "0.1",
                             "--quiet", "--out", str(tmp_path / "x.h5")], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "MFATTN_CPU_KERNELS=no-such-isa" in result.stderr and "accepted here" in result.stderr
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_build_and_kernel_set_agrees_to_rounding(mfattn_binary, tmp_path, name):
    variants = _variants(mfattn_binary)
    reference_label, reference_binary, reference_kernels = variants[0]
    reference = _positions(reference_binary, CASES[name], tmp_path / "ref.h5", reference_kernels)
    moved = np.max(np.abs(reference[-1] - reference[0]))
    assert moved > 1e-3, f"{name}: the tokens did not move ({moved})"
    for label, binary, kernels in variants[1:]:
        other = _positions(binary, CASES[name], tmp_path / "other.h5", kernels)
        assert other.shape == reference.shape
        assert np.max(np.abs(other[0] - reference[0])) == 0.0, \
            f"{label}: initial states must be bit-identical"
        diff = np.max(np.abs(other - reference))
        assert diff < 1e-12, f"{name}: {label} differs from {reference_label} by {diff}"


@pytest.mark.parametrize("name", ["symmetric-d3-usa", "one-sided-d20-gaussian-q"])
def test_each_kernel_set_is_bitwise_identical_across_thread_counts(mfattn_binary, tmp_path, name):
    # n = 700: above the size (2^18 pairs) from which the backend really uses more threads.
    for kernels in _kernel_sets(mfattn_binary):
        runs = [_positions(mfattn_binary, CASES[name], tmp_path / f"t{t}.h5", kernels, threads=t,
                           n=700) for t in (1, 2, 3)]
        for t, other in zip((2, 3), runs[1:]):
            assert np.array_equal(runs[0], other), f"{name}, {kernels}: 1 and {t} threads differ"
