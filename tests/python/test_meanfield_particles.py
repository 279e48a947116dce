"""Particles converge to the mean-field density (docs/meanfield.md, section 7): runs of n tokens
whose contents are i.i.d. samples of a smooth non-uniform density stay at W1 distance of order
n^(-1/2) from the density's solution. The slope of log(mean W1) against log n at t = 5 is -1/2
within 0.15 (experiments/meanfield/particles_vs_density.py continues the table to n = 16384).

W1 is computed here from its formula, independently of `--compare` (which one run checks):
W1 = min_c int_0^{2 pi} |F_mu - F_nu - c| dtheta on a fine grid of theta."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import h5py
import numpy as np
from mfattn.io import load
from mfattn.sample_density import sample

MODEL = ["--d", "2", "--beta", "1", "--kernel", "usa", "--horizon", "5", "--save-every", "5"]
FINE = 1 << 16


def circle_w1(density_cdf: np.ndarray, angles: np.ndarray) -> float:
    """W1 on the circle between a CDF sampled at FINE points of [0, 2 pi) and angles' empirical law."""
    grid = 2 * np.pi * np.arange(FINE) / FINE
    empirical = np.searchsorted(np.sort(np.mod(angles, 2 * np.pi)), grid, side="right") / angles.size
    gap = density_cdf - empirical
    shift = np.median(gap)  # the minimiser of int |gap - c| with equal weights
    return float(np.mean(np.abs(gap - shift)) * 2 * np.pi)


def density_cdf_at_horizon(path: Path) -> np.ndarray:
    with h5py.File(path) as f:
        values = f["fields/density/value"][-1]
        theta = f["fields/density/theta"][:]
    h = 2 * np.pi / values.size
    # Cells [theta_a - h/2, theta_a + h/2) with constant density; the CDF from 0 is piecewise linear.
    edges = np.concatenate([[0.0], np.cumsum(values * h)])
    grid = 2 * np.pi * np.arange(FINE) / FINE
    # The cell that holds theta (cell 0 is split around 0: its upper half comes first).
    shifted = np.mod(grid + h / 2, 2 * np.pi)
    cell = np.minimum((shifted / h).astype(int), values.size - 1)
    within = shifted - cell * h
    cdf_shifted = edges[cell] + values[cell] * within  # CDF from -h/2 (from 2 pi - h/2 past the wrap)
    wrapped = grid + h / 2 >= 2 * np.pi
    assert theta[0] == 0.0
    return cdf_shifted + np.where(wrapped, edges[-1], 0.0) - values[0] * h / 2


def test_w1_between_particles_and_density_falls_like_one_over_root_n(mfattn_binary, tmp_path):
    density = tmp_path / "density.h5"
    subprocess.run([str(mfattn_binary), "meanfield", *MODEL, "--init-density", "vmf", "--init-kappa", "1",
                    "--grid", "2048", "--quiet", "--threads", "1", "--out", str(density)], check=True, timeout=300)
    cdf = density_cdf_at_horizon(density)
    loaded = load(density)
    sizes, seeds = [256, 512, 1024, 2048], range(1, 11)
    mean_w1 = []
    for n in sizes:
        distances = []
        for seed in seeds:
            # analysis/sample_density.py's draw (`sample_density.py D.h5 --n N --seed S`), in process.
            start = tmp_path / "x.txt"
            np.savetxt(start, sample(loaded, n, np.random.default_rng(seed)), fmt="%.17g")
            run = tmp_path / f"run{n}_{seed}.h5"
            subprocess.run([str(mfattn_binary), "run", *MODEL, "--n", str(n), "--init", "file", "--init-file",
                            str(start), "--integrator", "rk4", "--dt", "0.25", "--quiet", "--threads", "1",
                            "--out", str(run)], check=True, timeout=600)
            with h5py.File(run) as f:
                x = f["particles/tokens/position/value"][-1]
            distances.append(circle_w1(cdf, np.arctan2(x[:, 1], x[:, 0])))
            if n == sizes[0] and seed == 1:
                # The command's exact W1 agrees with this one to the fine grid's resolution.
                done = subprocess.run([str(mfattn_binary), "meanfield", *MODEL, "--init-density", "vmf",
                                       "--init-kappa", "1", "--grid", "2048", "--quiet", "--threads", "1",
                                       "--out", str(tmp_path / "again.h5"), "--compare", str(run)],
                                      capture_output=True, text=True, timeout=300, check=True)
                last = re.search(r"W1 = ([0-9.eE+-]+)", done.stdout.strip().splitlines()[-1])
                assert abs(float(last.group(1)) - distances[-1]) < 1e-3, (done.stdout, distances[-1])
        mean_w1.append(np.mean(distances))
    slope = np.polyfit(np.log(sizes), np.log(mean_w1), 1)[0]
    print(f"[particles] slope {slope:.3f}, mean W1 at t = 5 {np.round(mean_w1, 4)}")
    assert abs(slope + 0.5) < 0.15, (slope, mean_w1)
