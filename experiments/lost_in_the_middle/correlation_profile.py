#!/usr/bin/python3
"""The causal ALiBi model of "lost in the middle" (Duerinckx, Geshkovski and Rossi,
arXiv:2605.09213) on the circle: token j moves by

    dtheta_j/dt = sum_{k<j} a_jk (-beta sin(theta_j - theta_k) exp(beta cos(theta_j - theta_k))),
    a_jk = exp(-(lambda/n)(j - k)) / sum_{k'<j} exp(-(lambda/n)(j - k')),   token 0 fixed,

mfattn's USA with V = beta I, --mask causal-strict, --aux-factor distance with lambda/n and
--usa-denominator factor-rows. How much does the last token remember of each source?

Runs R replicas from iid uniform tokens (n = 64, beta = 1, lambda = 1, rk4 dt = 0.01, frames at
t = 0.5, 1, 2, 3) and measures, for every source s, the correlation profile
    C_t(s) = E[<x_{n-1}(t), x_s(0)>] = E[cos(theta_{n-1}(t) - theta_s(0))]
and the soft accuracy S_t(s) = n E[sum_{m=1}^{20} w_m cos(m (theta_{n-1}(t) - theta_s(0)))],
w_m = exp(-pi^2 m^2 / (2 M^2)), M = 8: the repository's retrieval profile
(generate_u_shape_numerology_data.py), a wrapped Gaussian window of width pi/M around the
source's angle. Both are averages over replicas with standard errors, each with the control
variate of its own value at t = 0 (mean 0 for s < n - 1: the tokens start independent).

Predictions, written here from the paper's formulas. To first order in 1/n about the uniform
state, u_j = E[exp(i m (theta_j(t) - theta_s(0)))] obeys du/dt = a_m A u, u(0) = e_s, with the
repository's growth rates a_m = m^2 I_m(beta) (a_1 = I_1(beta) for the correlation):
  - linear, finite n: n [exp(t a A)]_{n-1, s}, A the weights a_jk above;
  - the closed form (continuum, sigma = (s + 1/2) / n):
      g_a(t; sigma) = lambda e^{lambda sigma} / (e^lambda - 1) psi_{a t}(Y(sigma)),
      Y(sigma) = log((e^lambda - 1) / (e^{lambda sigma} - 1)), psi_c(y) = sqrt(c / y) I_1(2 sqrt(c y)),
    and S_t(sigma) = sum_m w_m g_{a_m}(t; sigma), whose slope at sigma = 1 changes sign at
      t_crit = 2 (1 - e^{-lambda}) sum_m w_m a_m / sum_m w_m a_m^2   (2.4575 at beta = 1).
Writes data/lost_in_the_middle/profile.csv (t, s, both profiles with standard errors and their
predictions), data/figures/lost_in_the_middle.png, and prints the table of docs/experiments.md.
Three minutes on 2 cores with 16384 replicas (--quick: 256 replicas, t <= 1, seconds).

    /usr/bin/python3 experiments/lost_in_the_middle/correlation_profile.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import tempfile
from pathlib import Path

import h5py
import numpy as np
from scipy.linalg import expm
from scipy.special import iv

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MFATTN_BINARY", ROOT / "build" / "mfattn"))
WINDOW_M, MODES = 8.0, 20  # the repository's M and n_max


def causal_weights(n: int, lam: float) -> np.ndarray:
    """a_jk = exp(-(lambda/n)(j-k)) / sum_{k'<j} exp(-(lambda/n)(j-k')) for k < j; row 0 empty."""
    a = np.zeros((n, n))
    for j in range(1, n):
        row = np.exp(-(lam / n) * (j - np.arange(j)))
        a[j, :j] = row / row.sum()
    return a


def mode_weights() -> np.ndarray:
    m = np.arange(1, MODES + 1)
    return np.exp(-np.pi ** 2 * m ** 2 / (2 * WINDOW_M ** 2))


def growth_rates(beta: float) -> np.ndarray:
    """a_m = m^2 I_m(beta): the linear growth rate of Fourier mode m of W = exp(beta cos)."""
    m = np.arange(1, MODES + 1)
    return m ** 2 * iv(m, beta)


def closed_form(a: float, t: float, sigma: np.ndarray, lam: float) -> np.ndarray:
    """g_a(t; sigma) = lambda e^{lambda sigma} / (e^lambda - 1) psi_{a t}(Y(sigma))."""
    y = np.log((np.exp(lam) - 1) / (np.exp(lam * sigma) - 1))
    c = a * t
    psi = np.sqrt(c / y) * iv(1, 2 * np.sqrt(c * y))
    return lam * np.exp(lam * sigma) / (np.exp(lam) - 1) * psi


def critical_time(beta: float, lam: float) -> float:
    w, a = mode_weights(), growth_rates(beta)
    return 2 * (1 - np.exp(-lam)) * (w * a).sum() / (w * a * a).sum()


def simulate(n: int, beta: float, lam: float, replicas: int, times: list[float], seed: int, folder: Path) -> np.ndarray:
    """The angles [frames, R, n] of an mfattn run (frame 0 is t = 0)."""
    value = folder / "value.txt"
    np.savetxt(value, beta * np.eye(2), fmt="%.17g")
    out = folder / "run.h5"
    subprocess.run([str(BINARY), "run", "--n", str(n), "--d", "2", "--kernel", "usa", "--beta", str(beta), "--v", str(value),
                    "--mask", "causal-strict", "--aux-factor", "distance", "--aux-lambda", repr(lam / n),
                    "--usa-denominator", "factor-rows", "--init", "uniform", "--replicas", str(replicas),
                    "--seed", str(seed), "--integrator", "rk4", "--dt", "0.01", "--horizon", str(max(times)),
                    "--save-times", ",".join(str(t) for t in times), "--out", str(out), "--overwrite", "--quiet"],
                   check=True)
    with h5py.File(out, "r") as f:
        frames = []
        for r in range(replicas):
            x = f["particles/" + ("tokens" if r == 0 else f"tokens_r{r}") + "/position/value"][()]
            frames.append(np.arctan2(x[..., 1], x[..., 0]))
        recorded = f["particles/tokens/position/time"][()]
    assert np.allclose(recorded, [0.0] + list(times)), recorded
    return np.stack(frames, axis=1)


def profiles(theta: np.ndarray, frame: int):
    """C_t(s) and S_t(s) with standard errors, each minus its t = 0 value (control variate)."""
    n = theta.shape[-1]
    start = theta[0]
    difference = theta[frame][:, -1:] - start  # [R, n]: theta_{n-1}(t) - theta_s(0)
    initial = start[:, -1:] - start
    m = np.arange(1, MODES + 1)[:, None, None]
    w = mode_weights()[:, None, None]
    samples = {
        "correlation": np.cos(difference) - np.where(np.arange(n) < n - 1, np.cos(initial), 0.0),
        "soft_accuracy": n * ((w * (np.cos(m * difference) - np.cos(m * initial))).sum(0)),
    }
    out = {}
    for name, value in samples.items():
        out[name] = value.mean(0)
        out[name + "_se"] = value.std(0, ddof=1) / np.sqrt(value.shape[0])
    out["soft_accuracy"][-1] = np.nan  # the self term: its control variate is not mean 0
    return out


def draw(rows: list[dict], times: list[float], n: int, t_crit: float, path: Path) -> None:
    """One panel per time: n C_t(s) with error bars, the closed form and the finite-n linear
    prediction, and the soft accuracy S_t(s) on a second axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, len(times), figsize=(3.2 * len(times), 3.4))
    s = np.arange(n - 1)
    for axis, t in zip(np.atleast_1d(axes), times):
        block = [r for r in rows if r["t"] == t][: n - 1]
        axis.errorbar(s, [n * r["correlation"] for r in block], yerr=[n * r["correlation_se"] for r in block], fmt=".",
                      markersize=3, color="C0", label="mfattn, n C_t(s)")
        axis.plot(s, [n * r["correlation_closed_form"] for r in block], "-", color="C1", label="closed form")
        axis.plot(s, [n * r["correlation_linear"] for r in block], ":", color="C2", label="linear, n = 64")
        axis.set_title(f"t = {t:g}" + (" > t_crit" if t > t_crit else ""), fontsize=9)
        axis.set_xlabel("source s")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    figure.suptitle(f"last token against each source, n = {n}, beta = 1, lambda = 1 (t_crit = {t_crit:.3f})", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--replicas", type=int, default=0)
    args = parser.parse_args()
    n, beta, lam, seed = 64, 1.0, 1.0, 2605
    replicas = args.replicas or (256 if args.quick else 16384)
    times = [0.5, 1.0] if args.quick else [0.5, 1.0, 2.0, 3.0]
    data = Path(args.data)
    folder = data / "lost_in_the_middle"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        theta = simulate(n, beta, lam, replicas, times, seed, Path(scratch))
    weights = causal_weights(n, lam)
    sigma = (np.arange(n) + 0.5) / n
    w, a = mode_weights(), growth_rates(beta)
    rows, summary = [], []
    for frame, t in enumerate(times, start=1):
        measured = profiles(theta, frame)
        linear_correlation = expm(t * iv(1, beta) * weights)[-1]
        linear_soft = n * sum(wm * expm(t * am * weights)[-1] for wm, am in zip(w, a))
        closed_correlation = closed_form(iv(1, beta), t, sigma, lam) / n
        closed_soft = sum(wm * closed_form(am, t, sigma, lam) for wm, am in zip(w, a))
        for s in range(n):
            rows.append(dict(t=t, s=s, correlation=measured["correlation"][s], correlation_se=measured["correlation_se"][s],
                             correlation_linear=linear_correlation[s], correlation_closed_form=closed_correlation[s],
                             soft_accuracy=measured["soft_accuracy"][s], soft_accuracy_se=measured["soft_accuracy_se"][s],
                             soft_accuracy_linear=linear_soft[s], soft_accuracy_closed_form=closed_soft[s]))
        sources = slice(0, n - 1)
        soft, soft_se = measured["soft_accuracy"][sources], measured["soft_accuracy_se"][sources]
        bulk = slice(n // 8, n - 1)  # away from the first token's logarithmic singularity
        ratio = measured["correlation"][bulk].sum() / linear_correlation[bulk].sum()
        summary.append(dict(t=t, first=soft[0], first_se=soft_se[0], minimum=soft.min(), argmin=int(soft.argmin()),
                            last=soft[-1], last_se=soft_se[-1], recency=soft[-1] - soft[-9], recency_se=np.hypot(soft_se[-1], soft_se[-9]),
                            predicted_argmin=int(closed_soft[sources].argmin()),
                            predicted_recency=closed_soft[n - 2] - closed_soft[n - 10],
                            bulk_ratio=ratio))
    name = "profile_quick.csv" if args.quick else "profile.csv"
    with open(folder / name, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"n = {n}, beta = {beta}, lambda = {lam}, {replicas} replicas; t_crit = {critical_time(beta, lam):.4f}")
    print("| t | S at s = 0 | min S (at s) | S at s = n-2 | S(n-2) - S(n-10) | predicted: argmin, S(n-2) - S(n-10) | measured / linear C, s >= n/8 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in summary:
        print(f"| {r['t']:g} | {r['first']:.3f} +- {r['first_se']:.3f} | {r['minimum']:.3f} ({r['argmin']}) | "
              f"{r['last']:.3f} +- {r['last_se']:.3f} | {r['recency']:+.3f} +- {r['recency_se']:.3f} | "
              f"{r['predicted_argmin']}, {r['predicted_recency']:+.3f} | {r['bulk_ratio']:.3f} |")
    if not args.quick:
        draw(rows, times, n, critical_time(beta, lam), data / "figures" / "lost_in_the_middle.png")

if __name__ == "__main__":
    main()
