#!/usr/bin/python3
"""RoPE on the circle with labels: conditional Diracs, spread marginal (or not).

mfattn meanfield --d 2 --label-points 32 --grid 128 --beta 1 --positions uniform
--geometry rope --rope-freqs 1 (USA), horizon 40, --rtol 1e-5, three cases:

  rope               transported values (gradient flow), no factor, start
                     uniform + 0.02 cos(psi), psi = theta + alpha(xi) the gauge coordinate
                     (--perturbation 1,0.02 --perturbation-coordinate gauge)
  rope+distance      the same with --aux-factor distance --aux-lambda 1
                     (weights times exp(-|xi_i - xi_j|))
  rope, plain values --values plain, start uniform + 0.02 cos(theta) (--perturbation 1,0.02)

Observables (per frame): conditional_circular_variance (mean over labels of
1 - |int e^{i theta} d mu_xi|) and marginal_circular_variance (1 - |int e^{i theta} d mu|,
mu the label average). Expected: with transported values the gauge-rotated contents
y = G(xi) x collapse, so every conditional mu_xi becomes a Dirac at psi = const while the
marginal stays uniform (variance 1); with plain values (not a gradient flow) the marginal
collapses too.

Prints the variances at t = 0, 2.5, 5, 10, 20, 40 (the horizon), the time at which the
conditional variance drops below 1e-2 and 1e-4, writes data/meanfield/rope_diracization.csv
(all frames) and data/figures/meanfield_rope_diracization.png (variances against t; final
conditional densities rho(theta | xi) as images).

    PYTHONPATH=analysis /usr/bin/python3 experiments/meanfield/rope_diracization.py [--quick] [--horizon 40]
"""
from __future__ import annotations

import numpy as np

import mfcommon as mf  # this folder's, beside the script (sys.path[0])

CASES = [
    ("rope", ["--perturbation", "1,0.02", "--perturbation-coordinate", "gauge"]),
    ("rope+distance", ["--perturbation", "1,0.02", "--perturbation-coordinate", "gauge",
                       "--aux-factor", "distance", "--aux-lambda", "1"]),
    ("rope, plain values", ["--perturbation", "1,0.02", "--values", "plain"]),
]


def first_below(t: np.ndarray, v: np.ndarray, level: float) -> float:
    below = np.flatnonzero(v < level)
    return float(t[below[0]]) if below.size else np.nan


def main() -> None:
    parser = mf.standard_parser("rope_diracization", __doc__)
    parser.add_argument("--horizon", type=float, default=40.0)
    parser.add_argument("--label-points", type=int, default=32)
    parser.add_argument("--grid", type=int, default=128)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--rtol", type=float, default=1e-5)
    args = parser.parse_args()
    if args.quick:
        args.horizon, args.label_points, args.grid = 10.0, 16, 64
    paths = mf.Paths(args)
    clock = mf.Clock()

    results = {}
    csv_rows = []
    for name, options in CASES:
        out = paths.runs / (name.replace(", ", "_").replace(" ", "_").replace("+", "_") + ".h5")
        mf.mfattn(["meanfield", "--d", 2, "--beta", args.beta, "--label-points", args.label_points,
                   "--grid", args.grid, "--positions", "uniform", "--geometry", "rope", "--rope-freqs", 1,
                   *options, "--horizon", args.horizon, "--save-every", args.horizon / 80, "--rtol", args.rtol],
                  out, reuse=args.reuse)
        den = mf.Density(out)
        results[name] = den
        for i, t in enumerate(den.time):
            csv_rows.append(dict(case=name, time=t,
                                 conditional_circular_variance=den.obs["conditional_circular_variance"][i],
                                 marginal_circular_variance=den.obs["marginal_circular_variance"][i],
                                 energy=den.obs["energy"][i], mass=den.obs["mass"][i]))
    mf.write_csv(paths.csv, csv_rows)

    times = [t for t in (0.0, 2.5, 5.0, 10.0, 20.0, 40.0) if t <= args.horizon]
    if times[-1] != args.horizon:
        times.append(args.horizon)
    table = []
    for name, den in results.items():
        cond = den.obs["conditional_circular_variance"]
        marg = den.obs["marginal_circular_variance"]
        row = {"case": name}
        for t in times:
            i = int(np.argmin(np.abs(den.time - t)))
            row[f"cond t={t:g}"] = cond[i]
        for t in times:
            i = int(np.argmin(np.abs(den.time - t)))
            row[f"marg t={t:g}"] = marg[i]
        row["cond<1e-2 at"] = first_below(den.time, cond, 1e-2)
        row["cond<1e-4 at"] = first_below(den.time, cond, 1e-4)
        row["min marg"] = float(marg.min())
        row["mass drift"] = float(np.max(np.abs(den.obs["mass"] - den.obs["mass"][0])))
        row["energy monotone"] = "yes" if np.all(np.diff(den.obs["energy"]) >= -1e-12 * np.abs(den.obs["energy"]).max()) else "no"
        row["wall_s"] = den.wall_time
        table.append(row)
    print(f"circle, labels M_xi = {args.label_points}, M = {args.grid}, beta = {args.beta:g}, rope (freq 1), "
          f"USA, horizon {args.horizon:g}, rtol {args.rtol:g}")
    print(mf.markdown_table(table, spec=".3g"))
    print("\n(energy monotone: the recorded energy never decreases, up to 1e-12 relative; it is the Lyapunov "
          "function of the gradient flow with transported values, not of plain values)")

    plt = mf.pyplot()
    fig = plt.figure(figsize=(13, 7.5))
    grid = fig.add_gridspec(2, 3)
    ax_c = fig.add_subplot(grid[0, 0:2])
    ax_m = fig.add_subplot(grid[0, 2])
    for name, den in results.items():
        ax_c.semilogy(den.time, np.maximum(den.obs["conditional_circular_variance"], 1e-16), label=name)
        ax_m.plot(den.time, den.obs["marginal_circular_variance"], label=name)
    ax_c.set_xlabel("t")
    ax_c.set_ylabel("conditional circular variance (mean over labels)")
    ax_c.set_ylim(1e-12, 2)
    ax_c.legend(fontsize=8)
    ax_m.set_xlabel("t")
    ax_m.set_ylabel("marginal circular variance")
    ax_m.set_ylim(-0.02, 1.05)
    for j, (name, den) in enumerate(results.items()):
        ax = fig.add_subplot(grid[1, j])
        final = den.value[-1]  # [labels, M]
        ax.imshow(np.log10(np.maximum(final, 1e-6)), aspect="auto", origin="lower",
                  extent=[0, 2 * np.pi, 0, 2 * np.pi], cmap="viridis", vmin=-6)
        ax.set_xlabel("theta")
        ax.set_ylabel("label xi")
        ax.set_title(f"{name}: log10 rho(theta | xi), t = {den.time[-1]:g}", fontsize=9)
    mf.finish(fig, paths, clock, len(results), dpi=120)


if __name__ == "__main__":
    main()
