#!/usr/bin/python3
"""sphere.py of arXiv:2312.10794's code, on the mfattn module: n tokens on S^2 under SA and
USA with the reference's step (x <- normalize(x + dt u), mfattn's --integrator
euler-unprojected), every step a frame, drawn on the sphere at a few times.

    examples/sphere.py [--n 64] [--steps 150] [--dt 0.1] [--beta 1] [--out FOLDER]

writes FOLDER/sphere.png (default: data/figures/). About a second at the defaults.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import _module_path  # noqa: F401  (build/python, the build's package folder, on sys.path)
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import mfattn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--dt", type=float, default=0.1)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "figures"))
    a = parser.parse_args()

    horizon = a.steps * a.dt
    kernels = ["sa", "usa"]
    runs = {k: mfattn.run(n=a.n, d=3, beta=a.beta, kernel=k, integrator="euler-unprojected", dt=a.dt,
                          horizon=horizon, save_every=a.dt, seed=a.seed)
            for k in kernels}
    picks = np.unique(np.linspace(0, len(runs["sa"].times) - 1, 4).round().astype(int))
    figure = plt.figure(figsize=(3.2 * len(picks), 6.4))
    u, v = np.mgrid[0:2 * np.pi:40j, 0:np.pi:20j]
    for row, kernel in enumerate(kernels):
        trajectory = runs[kernel]
        for column, frame in enumerate(picks):
            axes = figure.add_subplot(2, len(picks), row * len(picks) + column + 1, projection="3d")
            axes.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.4)
            x = trajectory.positions[frame]
            axes.scatter(x[:, 0], x[:, 1], x[:, 2], s=12, c="C3" if kernel == "sa" else "C0", depthshade=False)
            axes.set_title(f"{kernel.upper()}  t = {trajectory.times[frame]:g}", fontsize=10)
            axes.set_axis_off()
            axes.set_box_aspect((1, 1, 1))
        print(f"{kernel}: 1 - min <x_i, x_j> at t = {horizon:g}: "
              f"{1 - trajectory.observables['min_inner'][-1]:.3g}")
    figure.suptitle(f"n = {a.n} tokens on S^2, beta = {a.beta:g}, the reference step dt = {a.dt:g}")
    figure.tight_layout()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / "sphere.png", dpi=110)
    print(f"wrote {out / 'sphere.png'}")


if __name__ == "__main__":
    main()
