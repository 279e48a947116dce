#!/usr/bin/python3
"""Measure-to-measure interpolation by attention layers: which weights carry n tokens from
one empirical measure to another? (The question of arXiv:2411.04551, which proves that such
weights exist for piecewise-constant layers; a reproduction tunes the layers by hand.)

n = 30 tokens start at the points of one empirical measure on S^{d-1} (--source: uniform
points, seed 1) and should end at the points of another (--target: two antipodal caps of
angular radius 0.3 around +-e_1, seed 2), matched by the assignment that minimises the sum of
squared distances (scipy's linear_sum_assignment: the tokens loss then asks token i for
target point sigma(i)). SA with beta 1, one head (Q, K, V, output) and a feed-forward term of
width --mlp, over --layers piecewise-constant layers of time 1 each (horizon = layers), rk4
dt 0.05; `mfattn fit --fit attention,mlp --optimizer lbfgs` from the gaussian presets (seed 3).

Reports, for d = 4 (and d = 3, whose fitted flow is animated), the largest geodesic distance
max_i arccos <x_i(T), y_sigma(i)> (the reproduction's pass mark: 0.05), the loss of every
iteration and each layer's weight norms; writes data/gradients/measure_to_measure.csv (one row
per d: iterations, loss at the start and the end, the largest distance, the seconds),
data/gradients/measure_to_measure_loss.csv (the loss per iteration), the fitted weights and
their replay files under data/gradients/, data/figures/measure_to_measure.png (the loss per
iteration; the d = 3 tokens at t = 0 and T with the target) and data/figures/measure_to_measure.gif
(the fitted d = 3 flow, analysis/animate.py). Prints the table of docs/experiments.md. About
five minutes on 2 cores, 8000 L-BFGS iterations per d (--quick: 2 layers, 20 iterations, d = 3
only, no animation).

    /usr/bin/python3 experiments/gradients/measure_to_measure.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
from scipy.optimize import linear_sum_assignment

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MFATTN_BINARY", ROOT / "build" / "mfattn"))


def source_points(n: int, d: int, seed: int) -> np.ndarray:
    """n uniform points on S^{d-1}."""
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def target_points(n: int, d: int, seed: int, radius: float = 0.3) -> np.ndarray:
    """n points in two caps of angular radius `radius` around e_1 and -e_1, half in each."""
    rng = np.random.default_rng(seed)
    points = []
    for i in range(n):
        pole = np.zeros(d)
        pole[0] = 1.0 if i % 2 == 0 else -1.0
        tangent = rng.standard_normal(d)
        tangent -= (tangent @ pole) * pole
        tangent /= np.linalg.norm(tangent)
        angle = radius * np.sqrt(rng.uniform())  # uniform in the cap's tangent disc
        points.append(np.cos(angle) * pole + np.sin(angle) * tangent)
    return np.array(points)


def matched(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The target's points reordered so that row i is the point assigned to token i."""
    cost = ((source[:, None, :] - target[None, :, :]) ** 2).sum(axis=-1)
    rows, columns = linear_sum_assignment(cost)
    return target[columns[np.argsort(rows)]]


def run(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(BINARY), *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mfattn {args[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def fit_one(d: int, args, folder: Path) -> dict:
    n, layers = args.n, args.layers
    source = source_points(n, d, 1)
    target = matched(source, target_points(n, d, 2))
    np.savetxt(folder / f"source_d{d}.txt", source)
    np.savetxt(folder / f"target_d{d}.txt", target)
    model = ["--n", str(n), "--d", str(d), "--kernel", "sa", "--beta", "1", "--q", "gaussian", "--k", "gaussian",
             "--v", "gaussian", "--values", "plain", "--mlp", str(args.mlp), "--seed", "3", "--horizon",
             str(float(layers)), "--dt", "0.05", "--save-every", "0.05", "--init", "file", "--init-file",
             str(folder / f"source_d{d}.txt"), "--threads", str(args.threads)]
    out = folder / f"measure_to_measure_d{d}.h5"
    started = time.monotonic()
    run("fit", *model, "--layers", str(layers), "--fit", "attention,mlp", "--target", str(folder / f"target_d{d}.txt"),
        "--optimizer", "lbfgs", "--iterations", str(args.iterations), "--quiet", "--overwrite", "--out", str(out))
    seconds = time.monotonic() - started
    with h5py.File(out, "r") as f:
        losses = f["fit/loss"][:]
        norms = [[float(np.linalg.norm(f[key][layer])) for key in ("attention/query", "attention/key",
                                                                     "attention/value", "attention/output",
                                                                     "mlp/w1", "mlp/w2")]
                 for layer in range(layers)] if layers > 1 else [[float(np.linalg.norm(f[key][:])) for key in (
                     "attention/query", "attention/key", "attention/value", "attention/output", "mlp/w1", "mlp/w2")]]
    replay = folder / f"measure_to_measure_d{d}_run.h5"
    run("run", "--config", str(out.with_suffix(".cfg")), "--out", str(replay), "--overwrite", "--quiet")
    with h5py.File(replay, "r") as f:
        final = f["particles/tokens/position/value"][-1]
    distance = np.arccos(np.clip(np.sum(final * target, axis=1), -1.0, 1.0))
    return dict(d=d, n=n, layers=layers, iterations=len(losses) - 1, loss_start=losses[0], loss_end=losses.min(),
                largest_distance=distance.max(), seconds=seconds, losses=losses, norms=norms, replay=replay,
                source=source, target=target, final=final)


def draw(results: list[dict], figure_path: Path) -> None:
    import matplotlib.pyplot as plt
    shown = [r for r in results if r["d"] == 3]
    fig = plt.figure(figsize=(10, 4))
    axis = fig.add_subplot(1, 2, 1)
    for r in results:
        axis.semilogy(r["losses"], label=f"d = {r['d']}")
    axis.set_xlabel("L-BFGS iteration")
    axis.set_ylabel("tokens loss")
    axis.set_title(f"n = {results[0]['n']}, {results[0]['layers']} layers")
    axis.legend()
    if shown:
        r = shown[0]
        axis = fig.add_subplot(1, 2, 2, projection="3d")
        axis.scatter(*r["source"].T, s=12, c="tab:blue", label="x(0)")
        axis.scatter(*r["target"].T, s=40, facecolors="none", edgecolors="tab:red", label="target")
        axis.scatter(*r["final"].T, s=12, c="k", label="x(T), fitted")
        axis.set_box_aspect((1, 1, 1))
        axis.set_title(f"d = 3: largest distance {r['largest_distance']:.2g}")
        axis.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(figure_path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--mlp", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dims", default="4,3", help="the dimensions d, in order (3 is drawn and animated)")
    parser.add_argument("--data", default=str(ROOT / "data"))
    args = parser.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    if args.quick:
        args.layers, args.iterations, dims = 2, 20, [3]
    folder = Path(args.data) / "gradients"
    figures = Path(args.data) / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    results = [fit_one(d, args, folder) for d in dims]
    with open(folder / "measure_to_measure.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["d", "n", "layers", "iterations", "loss_start", "loss_end", "largest_distance", "seconds"])
        for r in results:
            writer.writerow([r["d"], r["n"], r["layers"], r["iterations"], f"{r['loss_start']:.6g}",
                             f"{r['loss_end']:.6g}", f"{r['largest_distance']:.6g}", f"{r['seconds']:.1f}"])
    with open(folder / "measure_to_measure_loss.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["d", "iteration", "loss"])
        for r in results:
            for k, value in enumerate(r["losses"]):
                writer.writerow([r["d"], k, f"{value:.17g}"])
    print("| d | n | layers | L-BFGS iterations | loss at the start | loss at the end | largest distance | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['d']} | {r['n']} | {r['layers']} | {r['iterations']} | {r['loss_start']:.3g} | "
              f"{r['loss_end']:.2g} | {r['largest_distance']:.2g} | {r['seconds']:.0f} |")
    print()
    print("| d | layer | |Q| | |K| | |V| | |O| | |W1| | |W2| |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        for layer, norms in enumerate(r["norms"]):
            print(f"| {r['d']} | {layer} | " + " | ".join(f"{v:.3g}" for v in norms) + " |")
    draw(results, figures / "measure_to_measure.png")
    if not args.quick and any(r["d"] == 3 for r in results):
        replay = next(r["replay"] for r in results if r["d"] == 3)
        subprocess.run([sys.executable, str(ROOT / "analysis" / "animate.py"), str(replay), "--out",
                        str(figures / "measure_to_measure.gif"), "--frames", "120", "--trail", "8"], check=True)


if __name__ == "__main__":
    main()
