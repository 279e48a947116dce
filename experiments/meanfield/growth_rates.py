#!/usr/bin/python3
"""Linear growth rates of the uniform state: mfattn meanfield against the formula.

Each run starts at uniform + eps (mode l) (--perturbation l,eps, eps = 1e-6), saves frames
every horizon/N and fits log A_l(t) linearly; the rate is compared with

    gamma_l = l (l + d - 2) (c_l(beta)/beta - 1/kappa)           USA
    gamma_l = l (l + d - 2) (c_l(beta)/(beta c_0(beta)) - 1/kappa)  SA
    c_l(beta) = Gamma(d/2) (2/beta)^(d/2-1) I_{l+d/2-1}(beta)      (circle: I_l(beta))

Cases (full size):
  circle  d = 2, USA and SA, beta = 1, 4, k = 1..8, M = 256, 512, 1024, 2048, 4096; A_k is the
          solver's observable mode_amplitudes (column k).
  zonal   --zonal, d = 3, 8 (beta = 2), d = 128 (beta = 2, 30), l = 1..4, N = 128..1024 (4096 for d = 128)
          (d = 128 up to 2048); A_l is the projection of rho - 1 on the Gegenbauer polynomial of
          degree l (the solver's degree norms are not used: they are O(h^2), not 0, for the
          uniform state, see the notes printed at the end).
  sphere  d = 3 (S^2, pseudo-spectral), l = 1..4, L = 16, 32; A_l = mode_amplitudes column l.

The horizon is min(0.5, 4/max|gamma|) over the degrees of the same geometry, kernel, d and beta
(4 e-foldings at most, so the perturbation and any O(h^2) admixture of faster degrees stay small),
with --frames frames (default 20); the tolerances (--rtol 1e-11 --atol 1e-17) are far below
the default ones because the solver's error control sees the whole state (~1/(2 pi)) and not
the eps-sized perturbation: with the default rtol 1e-8 the time error alone is ~1e-4 of the
rate.

Prints one table per geometry (relative error per grid and the ratio of successive errors,
~4 for second order), writes data/meanfield/growth_rates.csv and
data/figures/meanfield_growth_rates.png (|relative error| against the grid).

    PYTHONPATH=analysis /usr/bin/python3 experiments/meanfield/growth_rates.py [--quick] [--noise-kappa 20]

Full run: a few minutes on 2 cores; --quick: a few seconds.
"""
from __future__ import annotations

import numpy as np
from scipy.special import eval_gegenbauer

import mfcommon as mf  # this folder's, beside the script (sys.path[0])

EPS = 1e-6


def fit_rate(t: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    """slope of log|a| against t, and the largest residual of the fit (curvature: a sign of
    nonlinearity or of a second mode)."""
    y = np.log(np.abs(a))
    p = np.polyfit(t, y, 1)
    return float(p[0]), float(np.max(np.abs(np.polyval(p, t) - y)))


def zonal_projection(density: mf.Density, l: int, d: int) -> np.ndarray:
    """a_l(t) = sum_a w_a (rho_a(t) - 1) G_l(cos theta_a), G_l the Gegenbauer polynomial
    C_l^{(d-2)/2} (Legendre for d = 3); rho = 1 is the uniform state on the grid."""
    g = eval_gegenbauer(l, (d - 2) / 2.0, np.cos(density.theta))
    return (density.weights[None, :] * (density.value - 1.0)) @ g


def case_run(args, paths, geometry: str, kernel: str, beta: float, d: int, l: int, grid: int,
             fastest: float) -> dict:
    """fastest: the largest |gamma| of the degrees of this (geometry, kernel, d, beta): the
    horizon keeps it below 4 e-foldings, since on the zonal grid P_l is a discrete eigenvector
    only up to O(h^2) and the other degrees' parts of the start would outgrow a slow one."""
    gamma = float(mf.growth_rate(l, beta, d, kernel, args.noise_kappa))
    horizon = min(args.max_horizon, 4.0 / max(fastest, 1e-12))
    options = ["meanfield", "--d", d, "--beta", beta, "--kernel", kernel, "--grid", grid,
               "--perturbation", f"{l},{EPS}", "--horizon", f"{horizon:.6g}",
               "--save-every", f"{horizon / args.frames:.6g}", "--rtol", args.rtol, "--atol", args.atol]
    if geometry == "zonal":
        options.append("--zonal")
    if args.noise_kappa > 0:
        options += ["--noise-kappa", args.noise_kappa]
    out = paths.runs / f"{geometry}_{kernel}_d{d}_b{beta:g}_l{l}_g{grid}.h5"
    mf.mfattn(options, out, reuse=args.reuse, threads=args.threads)
    density = mf.Density(out)
    if geometry == "zonal":
        a = zonal_projection(density, l, d)
    else:
        a = density.obs["mode_amplitudes"][:, l - 1]
    rate, residual = fit_rate(density.time, a)
    return dict(geometry=geometry, kernel=kernel, d=d, beta=beta, l=l, grid=grid, horizon=horizon,
                theory=gamma, measured=rate, abs_error=rate - gamma,
                rel_error=(rate - gamma) / gamma if gamma != 0 else np.nan, fit_residual=residual,
                steps=int(density.run.get("steps", -1)), wall_s=density.wall_time)


def main() -> None:
    parser = mf.standard_parser("growth_rates", __doc__)
    parser.add_argument("--noise-kappa", type=float, default=0.0, help="noise kappa (0: none)")
    parser.add_argument("--rtol", type=float, default=1e-11)
    parser.add_argument("--atol", type=float, default=1e-17)
    parser.add_argument("--frames", type=int, default=20, help="frames per run (default 20)")
    parser.add_argument("--max-horizon", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=None, help="--threads of every run")
    parser.add_argument("--only", default="circle,zonal,sphere", help="geometries to run")
    args = parser.parse_args()
    paths = mf.Paths(args)
    clock = mf.Clock()
    only = args.only.split(",")

    cases = []
    if args.quick:
        if "circle" in only:
            cases += [("circle", kern, b, 2, k, M) for kern in ("usa", "sa") for b in (1.0, 4.0)
                      for k in (1, 2, 4) for M in (128, 256, 512)]
        if "zonal" in only:
            cases += [("zonal", "usa", b, d, l, N) for d, b in ((3, 2.0), (128, 30.0))
                      for l in (1, 2) for N in (64, 128)]
        if "sphere" in only:
            cases += [("sphere", "usa", 2.0, 3, l, 16) for l in (1, 2)]
    else:
        if "circle" in only:
            cases += [("circle", kern, b, 2, k, M) for kern in ("usa", "sa") for b in (1.0, 4.0)
                      for k in range(1, 9) for M in (256, 512, 1024, 2048, 4096)]
        if "zonal" in only:
            for d, b in ((3, 2.0), (8, 2.0), (128, 2.0), (128, 30.0)):
                grids = (128, 256, 512, 1024) + ((2048, 4096) if d == 128 else ())
                cases += [("zonal", kern, b, d, l, N) for kern in ("usa", "sa") for l in range(1, 5)
                          for N in grids]
        if "sphere" in only:
            cases += [("sphere", kern, 2.0, 3, l, L) for kern in ("usa", "sa") for l in range(1, 5)
                      for L in (16, 32)]

    fastest = {}
    for geometry, kernel, beta, d, l, grid in cases:
        key = (geometry, kernel, beta, d)
        fastest[key] = max(fastest.get(key, 0.0), abs(float(mf.growth_rate(l, beta, d, kernel, args.noise_kappa))))
    rows = [case_run(args, paths, *case, fastest=fastest[case[:4]]) for case in cases]
    # ratio of successive errors along the grid (same geometry, kernel, d, beta, l)
    for i, row in enumerate(rows):
        row["ratio"] = np.nan
        if i > 0:
            prev = rows[i - 1]
            same = all(prev[k] == row[k] for k in ("geometry", "kernel", "d", "beta", "l"))
            if same and row["abs_error"] != 0:
                row["ratio"] = abs(prev["abs_error"]) / abs(row["abs_error"])
    mf.write_csv(paths.csv, rows)

    for geometry in ("circle", "zonal", "sphere"):
        part = [r for r in rows if r["geometry"] == geometry]
        if not part:
            continue
        grids = sorted({r["grid"] for r in part})
        keys = sorted({(r["kernel"], r["d"], r["beta"], r["l"]) for r in part})
        table = []
        for kernel, d, beta, l in keys:
            line = {"kernel": kernel, "d": d, "beta": beta, "l": l}
            sub = {r["grid"]: r for r in part if (r["kernel"], r["d"], r["beta"], r["l"]) == (kernel, d, beta, l)}
            any_row = next(iter(sub.values()))
            line["gamma (theory)"] = any_row["theory"]
            for g in grids:
                line[f"rel.err {g}"] = sub[g]["rel_error"] if g in sub else None
            finest = sub[max(sub)]
            ordered = [sub[g] for g in sorted(sub)]
            line["ratio (first)"] = ordered[1]["ratio"] if len(ordered) > 1 else None
            line["ratio (last)"] = finest["ratio"]
            line["abs.err finest"] = finest["abs_error"]
            line["finest ok (<1e-4)"] = "yes" if abs(finest["rel_error"]) < 1e-4 else "NO"
            table.append(line)
        print(f"\n## {geometry}: relative error (measured - theory) / theory per grid "
              f"({'M cells' if geometry == 'circle' else 'polar cells N' if geometry == 'zonal' else 'degree L'})")
        print(mf.markdown_table(table, spec=".3g"))

    # the zonal degree-norm observable of the uniform state (a tool check)
    notes = []
    for d in sorted({r["d"] for r in rows if r["geometry"] == "zonal"}):
        zonal = [r for r in rows if r["geometry"] == "zonal" and r["d"] == d]
        grid = min(r["grid"] for r in zonal)
        probe = paths.runs / f"uniform_zonal_d{d}_g{grid}.h5"
        mf.mfattn(["meanfield", "--zonal", "--d", d, "--beta", 2, "--grid", grid, "--horizon", 0.1,
                   "--save-every", 0.1], probe, reuse=args.reuse, threads=args.threads)
        u = mf.Density(probe)
        notes.append(f"zonal d = {d}, N = {grid}: the uniform state's degree norms (mode_amplitudes "
                     f"l = 1..4) are {', '.join(mf.fmt(v, '.2e') for v in u.obs['mode_amplitudes'][0, :4])} "
                     f"(eps = {EPS:g}); its values are exactly 1: max |rho - 1| = "
                     f"{np.max(np.abs(u.value - 1)):.1e} at every frame")
    if notes:
        print("\nNotes:")
        for line in notes:
            print("- " + line)

    plt = mf.pyplot()
    geos = [g for g in ("circle", "zonal", "sphere") if any(r["geometry"] == g for r in rows)]
    fig, axes = plt.subplots(1, len(geos), figsize=(5.2 * len(geos), 4.2), squeeze=False)
    for ax, geometry in zip(axes[0], geos):
        part = [r for r in rows if r["geometry"] == geometry]
        keys = sorted({(r["kernel"], r["d"], r["beta"], r["l"]) for r in part})
        for key in keys:
            sub = sorted((r for r in part if (r["kernel"], r["d"], r["beta"], r["l"]) == key), key=lambda r: r["grid"])
            g = [r["grid"] for r in sub]
            e = [max(abs(r["rel_error"]), 1e-12) for r in sub]
            ax.loglog(g, e, "o-", ms=3, lw=0.8, alpha=0.7,
                      label=f"{key[0]} d={key[1]} b={key[2]:g} l={key[3]}" if len(keys) <= 12 else None)
        if geometry != "sphere":
            g = np.array(sorted({r["grid"] for r in part}), dtype=float)
            ax.loglog(g, 1e-2 * (g[0] / g) ** 2, "k--", lw=1.2, label="slope -2")
        ax.axhline(1e-4, color="grey", lw=0.8, ls=":")
        ax.set_xlabel({"circle": "cells M", "zonal": "polar cells N", "sphere": "degree L"}[geometry])
        ax.set_ylabel("|relative error of gamma_l|")
        ax.set_title(f"{geometry}{', kappa=' + format(args.noise_kappa, 'g') if args.noise_kappa else ''}")
        ax.legend(fontsize=6, ncol=2)
    mf.finish(fig, paths, clock, len(rows))


if __name__ == "__main__":
    main()
