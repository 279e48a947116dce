#!/usr/bin/python3
"""The beta x t phase diagram of phase-diagrams.py (arXiv:2312.10794) on the mfattn module:
for each beta, a batch of random initial conditions of n = 32 tokens in d = 2 (one run with
--replicas SYSTEMS), SA with the reference step, and the batch mean of the fraction of
clustered pairs (<x_i, x_j> > 1 - 1e-3) at every checkpoint. The betas run in parallel
threads (mfattn.run releases the GIL: the sweep pattern of docs/python.md).

    examples/phase_diagram.py [--systems 512] [--betas 10] [--horizon 30] [--jobs 2] [--out FOLDER]

writes FOLDER/phase_diagram.png (the project's phase-diagram style: t across, beta up) and
FOLDER/phase_diagram.npz (default: data/figures/).
About 10 s on 2 cores at the defaults.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _module_path  # noqa: F401  (build/python, the build's package folder, on sys.path)
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import mfattn  # noqa: E402
from mfattn.plotting import phase_map  # noqa: E402  (the project's one phase-diagram style)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", type=int, default=512, help="random initial conditions per beta")
    parser.add_argument("--betas", type=int, default=10, help="betas in [0.1, 9]")
    parser.add_argument("--horizon", type=float, default=30.0)
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each on one thread)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "figures"))
    a = parser.parse_args()

    betas = np.linspace(0.1, 9.0, a.betas)

    def clustered_fraction(beta: float) -> np.ndarray:
        run = mfattn.run(n=a.n, d=2, kernel="sa", beta=float(beta), integrator="euler-unprojected", dt=0.1,
                         horizon=a.horizon, save_every=a.horizon / a.checkpoints, replicas=a.systems,
                         save_positions="none", seed=a.seed, threads=1)
        return run.times, run.observables["clustered_pair_fraction"].reshape(len(run.times), -1).mean(axis=1)

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(clustered_fraction, betas))
    times = results[0][0]
    fraction = np.stack([r[1] for r in results])  # [betas, checkpoints]

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "phase_diagram.npz", betas=betas, times=times, clustered_pair_fraction=fraction)
    figure, axes = plt.subplots(figsize=(6.5, 4))
    phase_map(axes, betas, times, fraction, label="clustered pairs (batch mean)")
    axes.set_title(f"SA, n = {a.n}, d = 2, {a.systems} random starts per beta", fontsize=10)
    figure.tight_layout()
    figure.savefig(out / "phase_diagram.png", dpi=120)
    print(f"wrote {out / 'phase_diagram.png'}; clustered fraction at t = {times[-1]:g}: "
          + ", ".join(f"beta {b:.2g}: {f:.2f}" for b, f in zip(betas, fraction[:, -1])))


if __name__ == "__main__":
    main()
