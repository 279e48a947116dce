#!/usr/bin/python3
"""The influence profile of causal attention: how much the last token's state at time T
depends on each source's initial position, I_s = |d x_n(T) / d x_s(0)| (the Frobenius norm of
the d x d block, taken along the sphere at x_s(0)), over the source position s, averaged over
random uniform starts (the question of "lost in the middle at birth": do the first and the last
sources weigh more than the middle ones, before any training?).

SA with the causal mask and identity Q, K, V (the options' defaults), n tokens in d
dimensions, --replicas random starts (seed 1), rk4 dt 0.05 to each T of --horizons, for each
beta of --betas, without a factor and with the distance factor (--lambda). One gradient through
the whole run per output component of x_n (mfattn.gradient with a cotangent on x_n's component
c in every replica: docs/model.md section 5b), so d adjoints give every I_s of every replica.

Writes data/gradients/influence.csv (factor, beta, T, s, the mean of I_s over the replicas,
its first and third quartiles), prints the table of docs/experiments.md, and draws
data/figures/influence_profile.png. About a minute on 2 cores (--quick: n = 16, 8 replicas,
one beta and T).

    /usr/bin/python3 experiments/gradients/influence.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.environ.get("MFATTN_PYTHON_MODULE_DIR", str(ROOT / "build" / "python")))
import mfattn  # noqa: E402


def influence(options: dict) -> np.ndarray:
    """I_s of every replica (R x n): |d x_n(T) / d x_s(0)| along the sphere at x_s(0)."""
    x0 = mfattn.Model(**options).initial_state()
    replicas, n, d = x0.shape
    squares = np.zeros((replicas, n))
    for component in range(d):
        cotangent = np.zeros(x0.shape)
        cotangent[:, n - 1, component] = 1.0
        _, gradient, _, _ = mfattn.gradient(cotangent, wrt=["x0"], **options)
        g = gradient["x0"]
        g = g - np.sum(g * x0, axis=-1, keepdims=True) * x0  # the part along the sphere
        squares += np.sum(g * g, axis=-1)
    return np.sqrt(squares)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--betas", default="1,4")
    parser.add_argument("--horizons", default="1,4")
    parser.add_argument("--lambda", dest="decay", type=float, default=0.2)
    parser.add_argument("--data", default=str(ROOT / "data"))
    args = parser.parse_args()
    if args.quick:
        args.n, args.replicas, args.betas, args.horizons = 16, 8, "4", "1"
    work = Path(args.data) / "gradients"
    work.mkdir(parents=True, exist_ok=True)
    factors = [("none", {}), (f"distance {args.decay:g}", dict(aux_factor="distance", aux_lambda=args.decay))]
    rows, profiles = [], {}
    for label, factor in factors:
        for beta in [float(b) for b in args.betas.split(",")]:
            for horizon in [float(t) for t in args.horizons.split(",")]:
                options = dict(n=args.n, d=args.d, kernel="sa", mask="causal", beta=beta, replicas=args.replicas,
                               seed=1, integrator="rk4", dt=0.05, horizon=horizon, save_every=horizon, **factor)
                each = influence(options)
                profiles[(label, beta, horizon)] = each.mean(axis=0)
                for s in range(args.n):
                    q1, q3 = np.percentile(each[:, s], [25, 75])
                    rows.append([label, beta, horizon, s, each[:, s].mean(), q1, q3])
    with open(work / "influence.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["factor", "beta", "T", "s", "mean", "q1", "q3"])
        writer.writerows(rows)
    # The table: the first source's, the middle third's (mean) and the last source's before x_n
    # itself, against the middle third.
    n = args.n
    middle = slice(n // 3, 2 * n // 3)
    print("| factor | beta | T | I_0 / middle | I_(n-2) / middle | I_(n-1) (itself) / middle | least at s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (label, beta, horizon), profile in profiles.items():
        mid = profile[middle].mean()
        print(f"| {label} | {beta:g} | {horizon:g} | {profile[0] / mid:.3g} | {profile[n - 2] / mid:.3g} | "
              f"{profile[n - 1] / mid:.3g} | {int(np.argmin(profile[:n - 1]))} |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(factors), figsize=(5 * len(factors), 3.6), sharey=True, squeeze=False)
    for axis, (label, _) in zip(axes[0], factors):
        for (name, beta, horizon), profile in profiles.items():
            if name == label:
                axis.semilogy(np.arange(n - 1), profile[:n - 1], label=f"beta {beta:g}, T {horizon:g}")
        axis.set_title(f"causal SA, factor {label}")
        axis.set_xlabel("source position s")
        axis.legend(fontsize=8)
    axes[0][0].set_ylabel("mean |d x_n(T) / d x_s(0)|")
    figures = Path(args.data) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(figures / "influence_profile.png", dpi=110)
    print(f"\nwrote {work / 'influence.csv'} and {figures / 'influence_profile.png'}")


if __name__ == "__main__":
    main()
