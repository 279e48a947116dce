#!/usr/bin/python3
"""Where the normalization sits: the clustered-pair fraction over time for post, pre, peri, ngpt
and none (docs/model.md section 2c) from the same random starts and the same random Q, K, V, and
Sinkhorn attention (section 2d, --kernel sinkhorn with its default sweeps, post) against SA at
the same settings.

n = 128 tokens in d = 16, SA, Q, K, V from the `gaussian` preset (seed s draws both the start
and the matrices, the same for every placement), beta in --betas, --seeds seeds, rk4 dt 0.05
to t = --horizon with log-spaced frames. The quantity is the observable
clustered_pair_fraction (pairs with <N(x_i), N(x_j)> > 1 - 1e-3, on the directions for states
in R^d), the quantity of the reference phase diagram, and the time it first reaches 0.99 (the
collapse time; "-" where a run does not get there). pre, peri and none start at radius 1.

Writes data/normalization/collapse.csv (one row per run: placement, beta, seed, collapse time,
final fraction, final mean radius) and data/normalization/curves.csv (the fraction over time,
median over seeds), prints the table of docs/experiments.md, and draws
data/figures/normalization_collapse.png with analysis/plot_normalization.py. 75 s on 2 cores
(--quick: one beta, two seeds, t = 30, in 6 s).

    MFATTN_BINARY=build/mfattn /usr/bin/python3 experiments/normalization/collapse.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PLACEMENTS = ["post", "pre", "peri", "ngpt", "none"]
# (label, --normalization, --kernel): the five placements with SA, then Sinkhorn attention.
VARIANTS = [(p, p, "sa") for p in PLACEMENTS] + [("sinkhorn", "post", "sinkhorn")]
LABELS = [label for label, _, _ in VARIANTS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--betas", default="1,4,9")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--horizon", type=float, default=100.0)
    parser.add_argument("--binary", default=os.environ.get("MFATTN_BINARY", str(ROOT / "build" / "mfattn")))
    parser.add_argument("--data", default=str(ROOT / "data"))
    args = parser.parse_args()
    if args.quick:
        args.betas, args.seeds, args.horizon = "4", 2, 30.0
    work = Path(args.data) / "normalization"
    work.mkdir(parents=True, exist_ok=True)
    betas = [float(b) for b in args.betas.split(",")]
    rows, curves = [], []
    for beta in betas:
        for label, placement, kernel in VARIANTS:
            fractions, times_full = [], None
            for seed in range(args.seeds):
                out = work / f"{label}_b{beta:g}_s{seed}.h5"
                command = [args.binary, "run", "--n", "128", "--d", "16", "--kernel", kernel, "--beta", str(beta),
                           "--q", "gaussian", "--k", "gaussian", "--v", "gaussian", "--seed", str(seed),
                           "--normalization", placement, "--integrator", "rk4", "--dt", "0.05",
                           "--horizon", str(args.horizon), "--save-log", "60", "--save-positions", "ends",
                           "--threads", os.environ.get("MFATTN_THREADS", "2"), "--quiet", "--overwrite",
                           "--out", str(out)]
                done = subprocess.run(command, capture_output=True, text=True)
                diverged = ""
                if done.returncode == 3:
                    # A numerical stop (none's norms can grow without bound): the file keeps the
                    # frames before it; the time of the stop is in the message.
                    found = re.search(r"t = ([0-9.e+-]+)", done.stderr)
                    diverged = float(found.group(1)) if found else "?"
                elif done.returncode != 0:
                    sys.exit(f"collapse.py: {' '.join(command)} failed:\n{done.stderr}")
                with h5py.File(out) as f:
                    times = f["observables/clustered_pair_fraction/time"][:]
                    fraction = f["observables/clustered_pair_fraction/value"][:]
                    radius = f["observables/mean_radius/value"][-1] if "observables/mean_radius" in f else 1.0
                reached = np.nonzero(fraction >= 0.99)[0]
                rows.append({"placement": label, "beta": beta, "seed": seed, "diverged_at": diverged,
                             "collapse_time": float(times[reached[0]]) if len(reached) else "",
                             "final_fraction": float(fraction[-1]), "final_mean_radius": float(radius)})
                fractions.append(fraction)
                if times_full is None or len(times) > len(times_full):
                    times_full = times
            # A run that stopped early keeps its last value to the horizon.
            fractions = [np.concatenate([f, np.full(len(times_full) - len(f), f[-1])]) for f in fractions]
            times = times_full
            median = np.median(np.array(fractions), axis=0)
            curves += [{"placement": label, "beta": beta, "time": float(t), "fraction": float(v)}
                       for t, v in zip(times, median)]
    for name, table in (("collapse.csv", rows), ("curves.csv", curves)):
        with open(work / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    figure = Path(args.data) / "figures" / "normalization_collapse.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "analysis" / "plot_normalization.py"), str(work / "curves.csv"),
                    "--out", str(figure)], check=True)

    print("| beta | " + " | ".join(LABELS) + " |")
    print("| --- | " + " | ".join("---" for _ in LABELS) + " |")
    for beta in betas:
        cells = []
        for placement in LABELS:
            found = [r for r in rows if r["beta"] == beta and r["placement"] == placement]
            reached = [r["collapse_time"] for r in found if r["collapse_time"] != ""]
            diverged = [r["diverged_at"] for r in found if r["diverged_at"] != ""]
            median_fraction = np.median([r["final_fraction"] for r in found])
            cell = f"{np.median(reached):.3g} ({len(reached)}/{len(found)})" if reached else f"- (final {median_fraction:.2f})"
            if diverged:
                cell += f"; {len(diverged)} diverged (t = {', '.join(f'{t:.3g}' for t in diverged)})"
            cells.append(cell)
        print(f"| {beta:g} | " + " | ".join(cells) + " |")
    print("\ncollapse time: median over the seeds that reach a clustered-pair fraction of 0.99 (how many did)")
    radii = {p: np.median([r["final_mean_radius"] for r in rows if r["placement"] == p]) for p in ("pre", "peri", "none")}
    print("final mean radius (median): " + ", ".join(f"{p} {v:.3g}" for p, v in radii.items()))


if __name__ == "__main__":
    main()
