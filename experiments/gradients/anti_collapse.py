#!/usr/bin/python3
"""A feed-forward term trained inside the flow to keep tokens from collapsing (the question of
arXiv:2605.07772: can the feed-forward term, trained inside the mean-field flow, hold the
measure off the single cluster that attention alone carries it to?).

n = 32 tokens start uniform on S^2 (seed 1) under SA with beta = 4 and Q = K = V = I (which
collapse to one cluster), with a feed-forward term of width 16 (--mlp 16, relu, the preset's
random weights, seed 3) that is then fitted alone (`mfattn fit --fit mlp --optimizer lbfgs`):
the loss is the mmd (kernel exp(<x, y>)) between the tokens and 512 uniform points of S^2
(seed 2), summed over t = 1, 2, ..., T (T = 5; rk4 dt 0.05). The fitted weights are then run
to 2 T, twice the time they were fitted over.

Reports, for attention alone, with the untrained feed-forward term and with the fitted one:
the mmd to the uniform points at T and 2 T, the mean <x_i, x_j> over pairs (1 at collapse)
and the clusters (components of <x_i, x_j> > 1 - 1e-4, the run's n_clusters) at 2 T. Writes
data/gradients/anti_collapse.csv and data/figures/anti_collapse.png (the mean <x_i, x_j> over
time, the three runs). About 30 s on 2 cores (--quick: 8 iterations).

    /usr/bin/python3 experiments/gradients/anti_collapse.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MFATTN_BINARY", ROOT / "build" / "mfattn"))


def mfattn(*args: str) -> None:
    done = subprocess.run([str(BINARY), *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mfattn {args[0]} failed ({done.returncode}): {done.stderr.strip()}")


def mmd(x: np.ndarray, y: np.ndarray) -> float:
    """The mmd loss of docs/model.md section 5b, gamma 1."""
    k = lambda a, b: np.exp(a @ b.T)  # noqa: E731
    return float(k(x, x).mean() - 2 * k(x, y).mean() + k(y, y).mean())


def summary(path: Path, uniform: np.ndarray, horizon: float) -> dict:
    with h5py.File(path, "r") as f:
        x = f["particles/tokens/position/value"][:]
        times = f["particles/tokens/position/time"][:]
        clusters = f["observables/n_clusters/value"][:]
    cosines = np.array([(frame @ frame.T)[np.triu_indices(len(frame), 1)].mean() for frame in x])
    at_t = int(np.argmin(np.abs(times - horizon)))
    return dict(times=times, cosines=cosines, mmd_t=mmd(x[at_t], uniform), mmd_2t=mmd(x[-1], uniform),
                cosine_2t=cosines[-1], clusters_2t=int(clusters[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--data", default=str(ROOT / "data"))
    args = parser.parse_args()
    if args.quick:
        args.iterations = 8
    folder, figures = Path(args.data) / "gradients", Path(args.data) / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    n, d, horizon = 32, 3, 5.0
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((n, d))
    np.savetxt(folder / "anti_collapse_x0.txt", x0 / np.linalg.norm(x0, axis=1, keepdims=True))
    uniform = np.random.default_rng(2).standard_normal((512, d))
    uniform /= np.linalg.norm(uniform, axis=1, keepdims=True)
    np.savetxt(folder / "anti_collapse_uniform.txt", uniform)
    base = ["--n", str(n), "--d", str(d), "--kernel", "sa", "--beta", "4", "--dt", "0.05", "--seed", "3",
            "--init", "file", "--init-file", str(folder / "anti_collapse_x0.txt"), "--threads", "1"]
    layer = ["--mlp", "16", "--values", "plain"]
    fitted = folder / "anti_collapse_mlp.h5"
    mfattn("fit", *base, *layer, "--horizon", str(horizon), "--save-every", "1", "--fit", "mlp", "--loss", "mmd",
           "--target", str(folder / "anti_collapse_uniform.txt"), "--loss-times", "1,2,3,4,5", "--optimizer", "lbfgs",
           "--iterations", str(args.iterations), "--quiet", "--overwrite", "--out", str(fitted))
    run_to = ["--horizon", str(2 * horizon), "--save-every", "0.1", "--quiet", "--overwrite"]
    runs = {"attention alone": [*base, "--values", "plain"], "untrained feed-forward": [*base, *layer],
            "fitted feed-forward": [*base, "--values", "plain", "--mlp", "16", "--weights", str(fitted)]}
    results = {}
    for name, words in runs.items():
        out = folder / f"anti_collapse_{name.replace(' ', '_')}.h5"
        mfattn("run", *words, *run_to, "--out", str(out))
        results[name] = summary(out, uniform, horizon)
    with h5py.File(fitted, "r") as f:
        losses = f["fit/loss"][:]
    with open(folder / "anti_collapse.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "mmd_T", "mmd_2T", "mean_cosine_2T", "clusters_2T"])
        for name, r in results.items():
            writer.writerow([name, f"{r['mmd_t']:.6g}", f"{r['mmd_2t']:.6g}", f"{r['cosine_2t']:.6g}", r["clusters_2t"]])
    print(f"fit: loss {losses[0]:.4g} -> {losses.min():.4g} in {len(losses) - 1} L-BFGS iterations\n")
    print("| run | mmd to uniform at T = 5 | at 2 T = 10 | mean <x_i, x_j> at 2 T | clusters at 2 T |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['mmd_t']:.3g} | {r['mmd_2t']:.3g} | {r['cosine_2t']:.3f} | {r['clusters_2t']} |")
    import matplotlib.pyplot as plt
    fig, axis = plt.subplots(figsize=(6, 3.5))
    for name, r in results.items():
        axis.plot(r["times"], r["cosines"], label=name)
    axis.axvline(horizon, color="grey", linestyle=":", label="end of the fitted span")
    axis.set_xlabel("t")
    axis.set_ylabel("mean <x_i, x_j>")
    axis.set_title(f"SA, beta 4, n = {n}, d = {d}")
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(figures / "anti_collapse.png", dpi=110)


if __name__ == "__main__":
    main()
