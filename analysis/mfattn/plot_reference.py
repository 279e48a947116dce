"""Figures of the reference experiments (experiments/reference/, docs/reference.md): the
phase diagrams of arXiv:2312.10794's phase-diagrams.py and the sphere run of its sphere.py,
each with the reference's first-order step beside --integrator rk4.

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_reference.py DATA [--out FIGURES]

DATA is the folder experiments/reference/run_reference.py writes (default data/reference):

    DATA/phase_diagram/<kernel>_<matrices>_<integrator>.npz   -> FIGURES/phase_<kernel>_<matrices>.png
        beta x t maps of the batch-mean clustered-pair fraction in the project's one
        phase-diagram style (mfattn.plotting.phase_map: t across, beta up, RdBu_r as the
        reference draws them, the axes starting at the smallest beta and the first
        checkpoint): the reference step, rk4, and their difference (reference - rk4, a
        symmetric colour scale) where both exist. Checkpoints after a run failed
        numerically (NaN) are grey.
    DATA/sphere/{reference,rk4}.h5                             -> FIGURES/sphere.png
        3-D scatter of the tokens on the sphere at a few times, one row per integrator.

FIGURES defaults to DATA/figures. Prints each figure written; exit 2 with one line on stderr
when DATA holds neither experiment (mfattn.cli).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from .cli import BadInput, script
from .io import load
from .plotting import phase_map, pyplot, save_figure

INTEGRATOR_LABEL = {"reference": "reference step (unprojected Euler)", "rk4": "rk4 (same dt)"}


def load_phase(path: Path) -> dict:
    with np.load(path) as f:
        out = {k: f[k] for k in f.files if k != "settings"}
        out["settings"] = json.loads(str(f["settings"])) if "settings" in f.files else {}
    return out


def phase_figures(folder: Path, out: Path) -> list[Path]:
    plt = pyplot()
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for path in sorted(folder.glob("*.npz")):
        parts = path.stem.split("_")
        if len(parts) != 3:
            continue
        kernel, matrices, integrator = parts
        groups.setdefault((kernel, matrices), {})[integrator] = load_phase(path)
    written = []
    for (kernel, matrices), runs in sorted(groups.items()):
        order = [k for k in ("reference", "rk4") if k in runs] + \
                [k for k in sorted(runs) if k not in ("reference", "rk4")]
        panels = [(INTEGRATOR_LABEL.get(k, k), runs[k]["mean"], runs[k]) for k in order]
        if "reference" in runs and "rk4" in runs and runs["reference"]["mean"].shape == runs["rk4"]["mean"].shape:
            panels.append(("difference (reference - rk4)",
                           runs["reference"]["mean"] - runs["rk4"]["mean"], None))
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
        first = runs[order[0]]
        for ax, (label, values, run) in zip(axes[0], panels):
            src = run or first
            if run is not None and run["settings"].get("binary_integrator") == "euler":
                label += "\n(projected euler: this binary lacks euler-unprojected)"
            phase_map(ax, src["betas"], src["checkpoints"], values, difference=run is None,
                      label="difference" if run is None else "clustered pair fraction")
            ax.set_title(label, fontsize=9)
        st = first["settings"]
        fig.suptitle(f"{kernel.upper()}, {matrices} matrices: batch-mean fraction of pairs with "
                     f"<x_i, x_j> > 0.999 (n = {st.get('n')}, d = {st.get('d')}, "
                     f"{st.get('batch')} systems)", fontsize=10)
        fig.tight_layout()
        written.append(save_figure(fig, out / f"phase_{kernel}_{matrices}.png"))
    return written


def sphere_figure(folder: Path, out: Path, times=(0.0, 1.0, 3.0, None)) -> list[Path]:
    plt = pyplot()
    runs = [(tag, folder / f"{tag}.h5") for tag in ("reference", "rk4") if (folder / f"{tag}.h5").is_file()]
    if not runs:
        return []
    loaded = [(tag, load(path)) for tag, path in runs]
    horizon = float(loaded[0][1].times[-1])
    wanted = [horizon if t is None else t for t in times if t is None or t <= horizon]
    fig = plt.figure(figsize=(3.2 * len(wanted), 3.3 * len(loaded)))
    for row, (tag, tr) in enumerate(loaded):
        integrator = tr.parameters.get("integrator", tag)
        for col, t in enumerate(wanted):
            k = int(np.argmin(np.abs(tr.times - t)))
            x = tr.positions[k]
            ax = fig.add_subplot(len(loaded), len(wanted), row * len(wanted) + col + 1, projection="3d")
            u, v = np.mgrid[0:2 * np.pi:30j, 0:np.pi:15j]
            ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v),
                              color="0.85", linewidth=0.3)
            ax.scatter(x[:, 0], x[:, 1], x[:, 2], c="#3658bf", s=12, edgecolors="black",
                       linewidths=0.4, depthshade=False)
            ax.set_box_aspect((1, 1, 1))
            ax.set_axis_off()
            ax.view_init(elev=10, azim=30)
            ax.set_title(f"{integrator}, t = {tr.times[k]:.1f}", fontsize=9)
    tr = loaded[0][1]
    fig.suptitle(f"sphere.py's run: n = {tr.n}, d = 3, beta = {tr.parameters.get('beta')}, "
                 f"{str(tr.parameters.get('kernel', '')).upper()}, dt = {tr.parameters.get('dt')}",
                 fontsize=10)
    return [save_figure(fig, out / "sphere.png")]


@script("plot_reference.py")
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="?", default="data/reference")
    p.add_argument("--out", default=None, help="figure folder (default DATA/figures)")
    a = p.parse_args(argv)
    data = Path(a.data)
    out = Path(a.out) if a.out else data / "figures"
    written = []
    if (data / "phase_diagram").is_dir():
        written += phase_figures(data / "phase_diagram", out)
    if (data / "sphere").is_dir():
        written += sphere_figure(data / "sphere", out)
    if not written:
        raise BadInput(f"{data}: no phase_diagram/*.npz or sphere/*.h5 to draw")
    for path in written:
        print(path)


if __name__ == "__main__":
    raise SystemExit(main())
