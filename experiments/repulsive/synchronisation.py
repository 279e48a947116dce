#!/usr/bin/python3
"""Repulsive attention, beta < 0, on the circle (Polyanskiy, Rigollet and Yao, arXiv:2507.22857):
the self-attention dynamics d theta_i / dt = -(1/n) sum_j sin(theta_i - theta_j)
exp(beta cos(theta_i - theta_j)) (mfattn's USA with Q = K = V = I on S^1) synchronise from almost
every start for beta >= -0.16 whatever n, and not for every n when beta < -2/3 (three
equally spaced tokens are then a stable equilibrium).

Runs the sweep experiments/sweeps/repulsive_beta.ini (n = 3 and 32 tokens, 256 replicas from
independent uniform starts, rk4 dt 0.05 to t = 400, 16 values of beta in [-1, 0.5]) and counts
the replicas whose last frame is synchronised: min_i,j <x_i, x_j> > 1 - 1e-6 (the tokens within
1.4e-3 rad of one another). Writes data/repulsive/synchronisation.csv (n, beta, replicas,
synchronised, the fraction and its binomial standard error, the median min_inner) and
data/figures/repulsive_synchronisation.png (the fraction against beta, one curve per n, with the
two bounds); prints the table of docs/experiments.md. About six minutes on 2 cores (--quick:
4 betas, 16 replicas, t = 50).

    /usr/bin/python3 experiments/repulsive/synchronisation.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MFATTN_BINARY", ROOT / "build" / "mfattn"))
SWEEP = ROOT / "experiments" / "sweeps" / "repulsive_beta.ini"
SYNCHRONISED = 1 - 1e-6  # min_inner above this: one point


def sweep_file(quick: bool, folder: Path) -> Path:
    """The sweep file, or for --quick a smaller copy of it."""
    if not quick:
        return SWEEP
    text = SWEEP.read_text()
    text = text.replace("replicas = 256", "replicas = 16").replace("horizon = 400", "horizon = 50")
    text = text.replace("save-every = 400", "save-every = 50")
    lines = [line if not line.startswith("beta = ") else "beta = -1 -0.5 0 0.5" for line in text.splitlines()]
    path = folder / "repulsive_beta_quick.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=str(ROOT / "data"))
    args = parser.parse_args()
    data = Path(args.data)
    folder = data / "repulsive"
    folder.mkdir(parents=True, exist_ok=True)
    out_dir = folder / ("sweep_quick" if args.quick else "sweep")
    subprocess.run([str(BINARY), "sweep", "--config", str(sweep_file(args.quick, folder)), "--out-dir", str(out_dir),
                    ], check=True, stdout=subprocess.DEVNULL)
    rows = []
    for case in csv.DictReader(open(out_dir / "manifest.csv")):
        with h5py.File(out_dir / case["file"], "r") as f:
            last = f["observables/min_inner/value"][-1]  # [R]: each replica's
            horizon = float(f["particles/tokens/position/time"][-1])
        replicas = len(last)
        synchronised = int((last > SYNCHRONISED).sum())
        fraction = synchronised / replicas
        rows.append(dict(n=int(case["n"]), beta=float(case["beta"]), replicas=replicas, synchronised=synchronised, fraction=fraction,
                         standard_error=float(np.sqrt(fraction * (1 - fraction) / replicas)),
                         median_min_inner=float(np.median(last)), horizon=horizon))
    rows.sort(key=lambda r: (r["n"], r["beta"]))
    with open(folder / ("synchronisation_quick.csv" if args.quick else "synchronisation.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if not args.quick:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        figure, axis = plt.subplots(figsize=(7, 4))
        for n in sorted({r["n"] for r in rows}):
            own = [r for r in rows if r["n"] == n]
            axis.errorbar([r["beta"] for r in own], [r["fraction"] for r in own], [r["standard_error"] for r in own],
                          marker="o", capsize=3, label=f"n = {n}")
        axis.axvline(-0.16, color="green", linestyle="--", label=r"$\beta \geq -0.16$: synchronises, every n (proved)")
        axis.axvline(-2 / 3, color="red", linestyle="--", label=r"$\beta < -2/3$: not for every n (proved)")
        axis.set_xlabel(r"$\beta$")
        axis.set_ylabel(f"fraction synchronised at t = {rows[0]['horizon']:g}")
        axis.set_title(f"USA on the circle, {rows[0]['replicas']} uniform starts per n and beta")
        axis.legend(fontsize=8, loc="center right")
        figure.tight_layout()
        (data / "figures").mkdir(parents=True, exist_ok=True)
        figure.savefig(data / "figures" / "repulsive_synchronisation.png", dpi=110)
    print("| n | beta | synchronised / replicas | fraction | median min_inner at the end |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['n']} | {r['beta']:g} | {r['synchronised']} / {r['replicas']} | {r['fraction']:.3f} +- {r['standard_error']:.3f} "
              f"| {r['median_min_inner']:.6g} |")


if __name__ == "__main__":
    main()
