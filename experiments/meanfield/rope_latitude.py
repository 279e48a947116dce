#!/usr/bin/python3
"""RoPE about e_3 on S^2 with labels: conditional peaks on one latitude circle (seed 003).

mfattn meanfield --d 3 --label-points 16 --grid 24 --beta 1 --noise-kappa 8 --positions uniform
--geometry rope --rope-freqs 1 (USA), horizon 30. Every label node xi_c = 2 pi c / M_xi turns
its contents by alpha_c = xi_c about e_3. The start (--init-density FILE) is, for node c, a von
Mises-Fisher bump of concentration 1 around G(xi_c)^T u, u at colatitude 60 degrees: the same
bump in every node's gauge coordinate G(xi_c) x. Two cases:

  transported   --values transported (G_c^T G_c' V y: a gradient flow)
  plain         --values plain (V y)

The S^2 solver is spectral and does not resolve collapse (docs/meanfield.md, section 5), so the
noise (kappa = 8, about 3 kappa_c: kappa_c = beta / c_1(beta) = e at beta = 1) keeps the peaks
about 0.2 rad wide; they concentrate as far as the noise allows.

Observables per frame: conditional_circular_variance (the mean over nodes of
1 - |int x dmu_xi|), marginal_circular_variance (1 - |int x dmu|, mu the node average), and from
the values the marginal's spread in colatitude (the standard deviation of theta under mu) and
the azimuthal order |int e^{i phi} dmu| of the marginal.

Expected with transported values: every conditional density concentrates (small conditional
variance) while the marginal spreads over the latitude circle at the bump's colatitude: narrow
in theta, uniform in phi (azimuthal order ~ 0), marginal variance 1 - |cos 60 deg| = 0.5 once
sharp. With plain values the nodes' peaks are not held apart by the rotations in the same way:
the table shows what the density does.

Prints the table at t = 0, 5, 10, 20, 30, writes data/meanfield/rope_latitude.csv and
data/figures/meanfield_rope_latitude.png (variances against t; the final marginal's map).

    PYTHONPATH=analysis /usr/bin/python3 experiments/meanfield/rope_latitude.py [--quick]
"""
from __future__ import annotations

import numpy as np

import mfcommon as mf  # this folder's, beside the script (sys.path[0])

COLATITUDE = np.pi / 3


def start_density(theta: np.ndarray, phi: np.ndarray, labels: np.ndarray, kappa: float) -> np.ndarray:
    """[M_xi, n_theta, n_phi]: node c's vmf bump around G(xi_c)^T u (u at COLATITUDE, azimuth 0),
    unnormalised (the command normalises each node's row)."""
    x = np.stack(np.broadcast_arrays(np.sin(theta)[:, None] * np.cos(phi)[None, :],
                                     np.sin(theta)[:, None] * np.sin(phi)[None, :],
                                     np.cos(theta)[:, None] + 0.0 * phi[None, :]), axis=-1)
    rows = []
    for xi in labels:
        # G(xi)^T u turns u by -xi about e_3.
        centre = np.array([np.sin(COLATITUDE) * np.cos(-xi), np.sin(COLATITUDE) * np.sin(-xi), np.cos(COLATITUDE)])
        rows.append(np.exp(kappa * (x @ centre - 1.0)))
    return np.array(rows)


def main() -> None:
    parser = mf.standard_parser("rope_latitude", __doc__)
    mf.add_options(parser, {"--horizon": 30.0, "--label-points": 16, "--grid": 24, "--beta": 1.0,
                            "--noise-kappa": 8.0, "--init-kappa": 1.0})
    args = parser.parse_args()
    if args.quick:
        args.horizon, args.label_points, args.grid = 6.0, 8, 12
    paths = mf.Paths(args)
    clock = mf.Clock()
    common = ["meanfield", "--d", 3, "--beta", args.beta, "--label-points", args.label_points, "--grid", args.grid,
              "--positions", "uniform", "--geometry", "rope", "--rope-freqs", 1, "--noise-kappa", args.noise_kappa]

    # The grid, from a solve of (almost) no length.
    probe = paths.runs / "grid.h5"
    mf.mfattn([*common, "--horizon", 1e-9, "--save-every", 1e-9], probe, reuse=args.reuse)
    grid = mf.Density(probe)
    import h5py
    with h5py.File(probe, "r") as f:
        phi = f["fields/density/phi"][()]
    start = start_density(grid.theta, phi, grid.labels, args.init_kappa)
    start_file = mf.write_density_file(paths.runs / "start.txt", start.reshape(-1))

    results = {}
    csv_rows = []
    for values in ("transported", "plain"):
        out = paths.runs / f"{values}.h5"
        mf.mfattn([*common, "--values", values, "--init-density", start_file, "--horizon", args.horizon,
                   "--save-every", args.horizon / 60], out, reuse=args.reuse)
        den = mf.Density(out)
        marginal = den.value.mean(axis=1)                     # [T, n_theta, n_phi]
        masses = marginal * den.weights[0]                     # sum = 1 per frame
        colatitude = (masses.sum(axis=2) * grid.theta).sum(axis=1)
        spread = np.sqrt((masses.sum(axis=2) * (grid.theta[None, :] - colatitude[:, None]) ** 2).sum(axis=1))
        azimuthal = np.abs((masses * np.exp(1j * phi)[None, None, :]).sum(axis=(1, 2)))
        results[values] = dict(den=den, colatitude=colatitude, spread=spread, azimuthal=azimuthal)
        for i, t in enumerate(den.time):
            csv_rows.append(dict(values=values, time=t,
                                 conditional_variance=den.obs["conditional_circular_variance"][i],
                                 marginal_variance=den.obs["marginal_circular_variance"][i],
                                 colatitude=colatitude[i], colatitude_spread=spread[i], azimuthal_order=azimuthal[i],
                                 min_density=den.obs["min_density"][i], mass=den.obs["mass"][i]))
    mf.write_csv(paths.csv, csv_rows)

    table = []
    for values, r in results.items():
        den = r["den"]
        for t in [t for t in (0.0, 5.0, 10.0, 20.0, 30.0) if t <= args.horizon] + [args.horizon]:
            i = int(np.argmin(np.abs(den.time - t)))
            if table and table[-1]["values"] == values and table[-1]["t"] == den.time[i]:
                continue
            table.append({"values": values, "t": den.time[i],
                          "conditional variance": den.obs["conditional_circular_variance"][i],
                          "marginal variance": den.obs["marginal_circular_variance"][i],
                          "colatitude (deg)": np.degrees(r["colatitude"][i]),
                          "colatitude spread (deg)": np.degrees(r["spread"][i]),
                          "azimuthal order": r["azimuthal"][i],
                          "min density": den.obs["min_density"][i]})
    print(f"S^2, labels M_xi = {args.label_points}, L = {args.grid}, beta = {args.beta:g}, kappa = {args.noise_kappa:g}, "
          f"rope about e_3 (freq 1), USA; start: vmf {args.init_kappa:g} at colatitude 60 deg in every gauge coordinate")
    print(mf.markdown_table(table, spec=".3g"))

    plt = mf.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for values, r in results.items():
        den = r["den"]
        axes[0].plot(den.time, den.obs["conditional_circular_variance"], label=f"{values}: conditional")
        axes[0].plot(den.time, den.obs["marginal_circular_variance"], "--", label=f"{values}: marginal")
        axes[1].plot(den.time, np.degrees(r["spread"]), label=f"{values}: colatitude spread")
    axes[0].set_xlabel("t")
    axes[0].set_ylabel("1 - |int x dmu|")
    axes[0].legend(fontsize=8)
    axes[1].set_xlabel("t")
    axes[1].set_ylabel("degrees")
    axes[1].legend(fontsize=8)
    den = results["transported"]["den"]
    axes[2].imshow(den.value[-1].mean(axis=0), aspect="auto", origin="upper",
                   extent=[0, 360, 180, 0], cmap="viridis")
    axes[2].set_xlabel("phi (deg)")
    axes[2].set_ylabel("theta (deg, from e_3)")
    axes[2].set_title(f"transported: marginal at t = {den.time[-1]:g}", fontsize=9)
    mf.finish(fig, paths, clock, len(results), dpi=120)


if __name__ == "__main__":
    main()
