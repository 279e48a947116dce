"""Figure of one density file (``mfattn meanfield``), optionally against a particle run.

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_meanfield.py DENSITY.h5 [--run RUN.h5]
                                                             [--out FIG.png]

writes FIG.png (default: DENSITY_meanfield.png beside the file) and prints its path:

    (a) the density as a function of the polar angle over (t, theta), on a logarithmic colour
        scale (4 decades at most): the circle's density
        (with labels its theta-marginal), the zonal density (angle from e_1), or the sphere's
        average over phi (angle from e_3); Density.marginal.
    (a') with --run: the particle run's histogram on the same cells, in the same units
        (Density.histogram: the fraction of active tokens in a cell over the cell's weight), at
        every frame whose time the density file also has, on the same colour scale; replica 0
        of the run.
    (b) the mode amplitudes A_k(t), k = 1..6 (/observables/mode_amplitudes), on a log scale:
        A_k = |int e^{i k theta} dmu| on the circle, the norm of the degree-k part on S^{d-1}
        and for zonal densities, normalised so that a Dirac has A_k = 1 (the uniform density
        0). The linear theory's lines A_k(0) exp(gamma_k t) are drawn black and dashed, over
        the data, while they stay below 0.1, for the modes the initial density seeds
        (1e-12 < A_k(0) < 0.1), where the formula applies (Q = K = V = I, no labels). With
        --run, the particles' A_k at the same frames (circles), in the same normalisation:
        |mean_j e^{i k theta_j}| on the circle, sqrt(mean_ij P_k(<x_i, x_j>)) on S^{d-1}
        (P_k the Gegenbauer polynomial of S^{d-1} with P_k(1) = 1; the first 2048 active
        tokens). When the mode --perturbation seeds is not the fastest-growing one, a warning
        (stderr and the panel) says so: n particles seed every mode at about n^{-1/2}, so the fastest mode
        overtakes the seeded one in the particles first, and particles and density part ways
        (physics, not an error).

Growth rates of the uniform density (``growth_rates``; docs/meanfield.md), on S^{d-1} with
Q = K = V = I, nu = d/2 - 1 and c_l(beta) = Gamma(d/2) (2/beta)^nu I_{l+nu}(beta) (the circle's
c_k = I_k(beta)):

    USA  gamma_l = l (l + d - 2) (s c_l(beta) / beta - 1/kappa)
    SA   gamma_l = l (l + d - 2) (s c_l(beta) / (beta (s c_0(beta) + eps)) - 1/kappa)

with s = 1 in natural time and exp(-beta) with --time-scale rescaled, eps = --eps-den (0 by
default), 1/kappa = 0 without noise (--noise-kappa 0). At beta = 0, c_l / beta is its limit
delta_{l1} / d.

From Python: ``growth_rates(d, beta, kernel, kappa, kmax)``, ``critical_kappa(beta, kernel, d)``
(the kappa at which gamma_1 = 0) and ``plot_meanfield(path, run=None, out=None) -> Path``. Exit
status 2 with one line on stderr for a missing or foreign file (mfattn.cli).
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import numpy as np
from scipy.special import ive

from .cli import script
from .io import Density, Trajectory, load
from .plotting import pyplot, save_figure

MODES = 6            # A_1 .. A_6 are drawn
LINEAR_CEILING = 0.1  # the linear theory's lines stop where they reach this amplitude
SEEDED = 1e-12       # modes whose A_k(0) is below this have no line (rounding, not a seed)


def _scaled_c(l: np.ndarray, d: int, beta: float) -> np.ndarray:
    """exp(-beta) c_l(beta) = Gamma(d/2) (2/beta)^(d/2 - 1) ive(l + d/2 - 1, beta), beta > 0."""
    nu = d / 2.0 - 1.0
    return math.gamma(d / 2.0) * (2.0 / beta) ** nu * ive(l + nu, beta)


def growth_rates(d: int, beta: float, kernel: str = "usa", kappa: float = 0.0, kmax: int = MODES,
                 *, time_scale: str = "natural", eps_den: float = 0.0) -> np.ndarray:
    """gamma_l for l = 1..kmax ([kmax]): the linear growth rates of the uniform density on
    S^{d-1} (Q = K = V = I) for kernel "usa" or "sa"; kappa the noise's (0: none). See the
    module docstring for the formula."""
    if d < 2:
        raise ValueError(f"d = {d}: the sphere S^(d-1) needs d >= 2")
    if kernel not in ("usa", "sa"):
        raise ValueError(f"kernel {kernel!r}: growth rates are known for 'usa' and 'sa'")
    if time_scale not in ("natural", "rescaled"):
        raise ValueError(f"time_scale {time_scale!r}: accepted natural, rescaled")
    l = np.arange(1, kmax + 1, dtype=float)
    laplace = l * (l + d - 2)
    diffusion = 1.0 / kappa if kappa > 0 else 0.0
    if beta == 0:
        # c_l(beta) / beta -> delta_{l1} / d and c_0 -> 1 as beta -> 0.
        drift = np.where(l == 1, 1.0 / d, 0.0)
        if kernel == "sa":
            drift = drift / (1.0 + eps_den)
        return laplace * (drift - diffusion)
    # c_l = exp(beta) * scaled; the factor s = exp(-beta) (rescaled) cancels that exp(beta).
    scaled = _scaled_c(l, d, beta)
    if kernel == "usa":
        drift = scaled / beta * (1.0 if time_scale == "rescaled" else math.exp(beta))
    else:
        c0 = float(_scaled_c(np.array(0.0), d, beta))
        # natural: c_l / (c_0 + eps) = scaled / (c0 + eps exp(-beta)); rescaled:
        # s c_l / (s c_0 + eps) = scaled / (c0 + eps).
        eps = eps_den if time_scale == "rescaled" else eps_den * math.exp(-beta)
        drift = scaled / (beta * (c0 + eps))
    return laplace * (drift - diffusion)


def critical_kappa(beta: float, kernel: str = "usa", d: int = 2, *, time_scale: str = "natural",
                   eps_den: float = 0.0) -> float:
    """kappa_c: the noise's kappa at which gamma_1 = 0 (growth_rates without noise is
    (d - 1) c_1 / beta, or the SA's ratio, and the noise takes (d - 1) / kappa); below it (more
    noise) the uniform density is stable: beta / c_1 (USA), beta c_0 / c_1 (SA)."""
    return float((d - 1) / growth_rates(d, beta, kernel, 0.0, 1, time_scale=time_scale, eps_den=eps_den)[0])


def _rates_for(density: Density) -> np.ndarray | None:
    """The density's growth rates, or None when the formula does not apply."""
    p = density.parameters
    if density.labels is not None or any(str(p.get(m, "identity")) != "identity" for m in "qkv"):
        return None
    if str(p.get("kernel", "usa")) not in ("usa", "sa"):
        return None
    eps = p.get("eps_den_used", p.get("eps-den", 0.0))
    return growth_rates(density.d, float(p.get("beta", 1.0)), str(p.get("kernel", "usa")),
                        float(p.get("noise-kappa", 0.0)), MODES,
                        time_scale=str(p.get("time-scale", "natural")),
                        eps_den=max(float(eps), 0.0))


def _viridis():
    """viridis with empty cells (0, outside a logarithmic scale) in its darkest colour."""
    import matplotlib
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad(cmap(0.0))
    cmap.set_under(cmap(0.0))
    return cmap


def _colour_scale(values: np.ndarray):
    """A logarithmic colour scale over the positive values, at most 4 decades below the
    largest (clusters make the density peak by orders of magnitude; empty cells are below)."""
    from matplotlib.colors import LogNorm
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size == 0:
        return LogNorm(vmin=1e-3, vmax=1.0)
    vmax = float(positive.max())
    vmin = max(float(positive.min()), vmax * 1e-4)
    return LogNorm(vmin=min(vmin, vmax / 1.01), vmax=vmax)


def _time_edges(times: np.ndarray) -> np.ndarray:
    """Cell edges around the frame times (midpoints; the ends half a step out)."""
    t = np.asarray(times, dtype=float)
    if len(t) == 1:
        return np.array([t[0] - 0.5, t[0] + 0.5])
    mid = 0.5 * (t[1:] + t[:-1])
    return np.concatenate([[2 * t[0] - mid[0]], mid, [2 * t[-1] - mid[-1]]])


def run_histograms(density: Density, run: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """(times [F], histograms [F, n_theta]) of the run's active tokens at the frames whose
    times the density file also has, within 1e-9 max(1, |t|) as for mfattn meanfield
    --compare (Density.histogram; replica 0 of a stacked run)."""
    if run.d != density.d:
        raise ValueError(f"{run.path}: a run in d = {run.d}, the density is in d = {density.d}")
    positions = run.positions[:, 0] if run.stacked else run.positions
    times = run.position_times if run.position_times is not None else run.times
    presence = run.labels.get("presence")
    active = np.ones(positions.shape[1], dtype=bool) if presence is None else np.asarray(presence) > 0
    common, histograms = [], []
    for row, t in enumerate(times[:len(positions)]):
        if (np.abs(density.times - t) <= 1e-9 * max(1.0, abs(t))).any():
            common.append(t)
            histograms.append(density.histogram(positions[row][active]))
    return np.asarray(common), np.asarray(histograms).reshape(len(common), len(density.theta))


def plot_meanfield(path: str | os.PathLike, run: str | os.PathLike | None = None,
                   out: str | os.PathLike | None = None) -> Path:
    """Draws the figure (module docstring) and returns the path written."""
    density = load(path)
    if not isinstance(density, Density):
        raise ValueError(f"{path}: a particle run, not a density file (mfattn meanfield)")
    particles = None
    if run is not None:
        particles = load(run)
        if not isinstance(particles, Trajectory):
            raise ValueError(f"{run}: a density file, not a particle run (mfattn run)")
    out = Path(out) if out is not None else Path(path).with_name(Path(path).stem + "_meanfield.png")
    plt = pyplot()
    cmap = _viridis()
    panels = 3 if particles is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), constrained_layout=True)
    angle = {"circle": "theta", "zonal": "theta from e_1", "sphere": "theta from e_3"}[density.kind]
    what = {"circle": "density in theta" + (" (marginal over labels)" if density.labels is not None else ""),
            "zonal": "zonal density", "sphere": "average over phi"}[density.kind]
    marginal = density.marginal()
    norm = _colour_scale(marginal)
    edges = density.polar_edges
    heat = axes[0].pcolormesh(_time_edges(density.times), edges, marginal.T, shading="flat",
                              cmap=cmap, norm=norm)
    axes[0].set(xlabel="t", ylabel=angle, title=f"(a) mean field: {what}")
    fig.colorbar(heat, ax=axes[0], extend="both")
    if particles is not None:
        times, histograms = run_histograms(density, particles)
        ax = axes[1]
        if len(times):
            heat = ax.pcolormesh(_time_edges(times), edges, histograms.T, shading="flat",
                                 cmap=cmap, norm=norm)
            fig.colorbar(heat, ax=ax, extend="both")
        else:
            ax.text(0.5, 0.5, "no frame of the run at the density's times",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set(xlabel="t", ylabel=angle, ylim=(edges[0], edges[-1]),
               title=f"(a') particles: histogram, n = {int(np.sum(_active(particles)))}")
        ax.set_xlim(axes[0].get_xlim())
    ax = axes[-1]
    amplitudes = density.observables.get("mode_amplitudes")
    rates = _rates_for(density)
    if amplitudes is not None:
        t = density.times
        colors = plt.get_cmap("tab10")
        theory_labelled = False
        for k in range(1, min(MODES, amplitudes.shape[1]) + 1):
            a = np.where(amplitudes[:, k - 1] > 0, amplitudes[:, k - 1], np.nan)
            ax.plot(t, a, color=colors(k - 1), label=f"A_{k}")
            a0 = amplitudes[0, k - 1]
            if rates is not None and SEEDED < a0 < LINEAR_CEILING and len(t) > 1:
                # Up to where the line reaches the ceiling (the early times only), black and
                # dashed over the data, so that it shows where it agrees with it.
                end = t[-1]
                if rates[k - 1] > 0:
                    end = min(end, t[0] + math.log(LINEAR_CEILING / a0) / rates[k - 1])
                fine = np.linspace(t[0], end, 200)
                ax.plot(fine, a0 * np.exp(rates[k - 1] * (fine - t[0])), color="black", linestyle=(0, (4, 3)),
                        lw=1.4, zorder=5, label="linear theory" if not theory_labelled else None)
                theory_labelled = True
        if particles is not None:
            times, values = particle_amplitudes(density, particles)
            for k in range(1, min(MODES, amplitudes.shape[1]) + 1):
                if len(times):
                    ax.plot(times, np.where(values[:, k - 1] > 0, values[:, k - 1], np.nan), "o", markersize=3,
                            markerfacecolor="none", color=colors(k - 1), label=f"A_{k} particles" if k == 1 else None)
        ax.set_yscale("log")
        ax.legend(fontsize=7, ncol=2)
    warning = seeded_mode_warning(density, rates)
    if warning:
        import sys
        print(f"plot_meanfield.py: {Path(path).name}: {warning}", file=sys.stderr)
    title = "(b) A_k (Dirac: 1); dashed: linear theory" if rates is not None else \
        "(b) A_k (a Dirac: 1; no linear theory)"
    if warning:
        title += "\nthe perturbed mode grows slower than another"
    ax.set(xlabel="t", ylabel="A_k", title=title)
    p = density.parameters
    fig.suptitle(f"{Path(path).name}: {density.kind}, d = {density.d}, beta = {p.get('beta')}, "
                 f"{p.get('kernel')}, noise-kappa = {p.get('noise-kappa', 0)}", fontsize=9)
    return save_figure(fig, out)


PARTICLE_MODE_TOKENS = 2048  # the particles' A_k on S^{d-1} take at most this many tokens (O(n^2))


def particle_amplitudes(density: Density, run: Trajectory, kmax: int = MODES) -> tuple[np.ndarray, np.ndarray]:
    """The particles' A_1..A_kmax at the frames whose time the density file also has (replica
    0, active tokens): |mean e^{i k theta}| on the circle, sqrt(mean_ij P_k(<x_i, x_j>)) on
    S^{d-1}, the density's normalisation (a Dirac has A_k = 1)."""
    from scipy.special import eval_gegenbauer, eval_legendre
    positions = np.asarray(run.positions)
    if positions.ndim == 4:
        positions = positions[:, 0]
    times = np.asarray(run.position_times if run.position_times is not None else run.times)
    active = _active(run)
    rows, values = [], []
    for row, t in enumerate(times[:len(positions)]):
        if not np.any(np.isclose(density.times, t, rtol=0, atol=1e-9 * max(1.0, abs(t)))):
            continue
        x = positions[row][active]
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        k = np.arange(1, kmax + 1)
        if density.d == 2:
            theta = np.arctan2(x[:, 1], x[:, 0])
            a = np.abs(np.exp(1j * np.outer(k, theta)).mean(axis=1))
        else:
            x = x[:PARTICLE_MODE_TOKENS]
            inner = np.clip(x @ x.T, -1.0, 1.0)
            alpha = density.d / 2 - 1
            a = []
            for degree in k:
                p = eval_legendre(degree, inner) if density.d == 3 else \
                    eval_gegenbauer(degree, alpha, inner) / eval_gegenbauer(degree, alpha, 1.0)
                a.append(math.sqrt(max(p.mean(), 0.0)))
            a = np.array(a)
        rows.append(t)
        values.append(a)
    return np.array(rows), np.array(values).reshape(len(rows), kmax)


def seeded_mode_warning(density: Density, rates: np.ndarray | None) -> str | None:
    """A sentence when the mode that --perturbation seeds is not the fastest-growing one."""
    perturbation = str(density.parameters.get("perturbation", "") or "")
    if rates is None or not perturbation:
        return None
    try:
        seeded_mode = int(float(perturbation.split(",")[0]))
    except ValueError:
        return None
    fastest = int(np.argmax(rates)) + 1
    if not 1 <= seeded_mode <= len(rates) or fastest == seeded_mode or rates[fastest - 1] <= 0:
        return None
    return (f"the perturbed mode k = {seeded_mode} grows at gamma_{seeded_mode} = {rates[seeded_mode - 1]:.4g}, "
            f"but mode {fastest} grows faster (gamma_{fastest} = {rates[fastest - 1]:.4g}): particles seed every "
            f"mode at about n^(-1/2), so their mode {fastest} overtakes and they part ways with the density")


def _active(run: Trajectory) -> np.ndarray:
    presence = run.labels.get("presence")
    return np.ones(run.n, dtype=bool) if presence is None else np.asarray(presence) > 0


@script("plot_meanfield.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="a density file (mfattn meanfield)")
    parser.add_argument("--run", type=Path, default=None, help="a particle run (mfattn run) to compare")
    parser.add_argument("--out", type=Path, default=None,
                        help="the PNG to write (default: DENSITY_meanfield.png beside the file)")
    args = parser.parse_args(argv)
    print(plot_meanfield(args.file, args.run, args.out))


if __name__ == "__main__":
    raise SystemExit(main())
