"""The bipodal phase and the collapse time T(n) on the circle (Menon and Murray): Q = V = I,
K = diag(a, b), beta = 1, SA, tokens iid uniform on S^1. The tokens first gather into two
antipodal clusters aligned with K's dominant axis, stay there for a long time (an unstable
saddle with a slow escape), then collapse; the paper reports T(n) ~ C(a, b) ln n + D(a, b).

For n in --sizes and --seeds, `mfattn run` (--evaluation auto: the circle's Fourier series from
n = 1024 at this beta, docs/model.md section 2f) to --horizon with log-spaced frames, and `mfattn analyze
--json`: the collapse time (the first frame from which min_inner >= 1 - 1e-4 holds), the start
and end of the two-cluster plateau, and the angle of the two clusters against K's axes. Fits
T = C ln n + D (least squares over every run, with standard errors) and prints the table;
writes data/fast/bipodal_time.csv and data/figures/bipodal_time.png.

    MFATTN_BINARY=build/mfattn MPLBACKEND=Agg /usr/bin/python3 experiments/fast/bipodal_time.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import tempfile
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MFATTN_BINARY", ROOT / "build" / "mfattn"))


def run_once(n: int, seed: int, args, folder: Path) -> dict:
    k = folder / "k.txt"
    np.savetxt(k, np.diag([args.a, args.b]), fmt="%.17g")
    out = folder / f"n{n}_s{seed}.h5"
    subprocess.run([str(BINARY), "run", "--n", str(n), "--d", "2", "--beta", "1", "--kernel", "sa", "--k", str(k),
                    "--init", "uniform", "--seed", str(seed), "--integrator", "rk4", "--dt", str(args.dt),
                    "--horizon", str(args.horizon), "--save-log", str(args.frames), "--evaluation", "auto",
                    "--out", str(out), "--overwrite", "--quiet"], check=True)
    analysis = json.loads(subprocess.run([str(BINARY), "analyze", str(out), "--json"], capture_output=True, text=True,
                                         check=True).stdout)
    two = [p for p in analysis["plateaus"] if p["clusters"] == 2]
    row = {"n": n, "seed": seed, "collapse_time": analysis["collapse_time"],
           "two_start": two[0]["t_start"] if two else None, "two_end": two[-1]["t_end"] if two else None,
           "axis_angle": None}
    if two:
        # The two clusters' axis (the second moment's leading eigenvector) against e_2, K's larger
        # axis when b > a, in the middle of the plateau.
        with h5py.File(out) as f:
            times = f["particles/tokens/position/time"][:]
            frame = int(np.argmin(np.abs(times - 0.5 * (two[0]["t_start"] + two[-1]["t_end"]))))
            x = f["particles/tokens/position/value"][frame]
        vector = np.linalg.eigh(x.T @ x)[1][:, -1]
        row["axis_angle"] = float(np.degrees(np.arccos(min(1.0, abs(vector[1 if args.b > args.a else 0])))))
    out.unlink()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 100, 1000, 10000 with two seeds (under a minute)")
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--a", type=float, default=1.0)
    parser.add_argument("--b", type=float, default=1.5)
    parser.add_argument("--horizon", type=float, default=150.0)
    parser.add_argument("--dt", type=float, default=0.1)
    parser.add_argument("--frames", type=int, default=80)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "data" / "fast")
    parser.add_argument("--figure-dir", type=Path, default=ROOT / "data" / "figures")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.seeds = "100,1000,10000", 2
    sizes = [int(n) for n in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for seed in range(args.seeds):
                rows.append(run_once(n, seed, args, Path(tmp)))
                print(rows[-1], flush=True)
    done = [r for r in rows if r["collapse_time"] is not None]
    if len(done) < len(rows):
        print(f"{len(rows) - len(done)} runs did not collapse by t = {args.horizon:g} (left out of the fit)")
    ln_n = np.log([r["n"] for r in done])
    T = np.array([r["collapse_time"] for r in done])
    A = np.vstack([ln_n, np.ones_like(ln_n)]).T
    (C, D), *_ = np.linalg.lstsq(A, T, rcond=None)
    dof = max(len(T) - 2, 1)
    cov = np.sum((A @ [C, D] - T) ** 2) / dof * np.linalg.inv(A.T @ A)
    print(f"\nQ = V = I, K = diag({args.a:g}, {args.b:g}), beta = 1, SA, circle; collapse time T(n) over {args.seeds} seeds")
    print("| n | T mean | T min | T max | two clusters from | to | axis angle (deg) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in sizes:
        part = [r for r in done if r["n"] == n]
        if not part:
            continue
        mean = lambda key: np.mean([r[key] for r in part if r[key] is not None])  # noqa: E731
        print(f"| {n} | {np.mean([r['collapse_time'] for r in part]):.2f} | {min(r['collapse_time'] for r in part):.2f} "
              f"| {max(r['collapse_time'] for r in part):.2f} | {mean('two_start'):.2f} | {mean('two_end'):.2f} "
              f"| {mean('axis_angle'):.1f} |")
    print(f"fit T = C ln n + D: C = {C:.3f} +- {np.sqrt(cov[0, 0]):.3f}, D = {D:.2f} +- {np.sqrt(cov[1, 1]):.2f}")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "bipodal_time.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    ax.plot(ln_n, T, "o", mfc="none", alpha=0.6, label="runs")
    grid = np.linspace(ln_n.min(), ln_n.max(), 50)
    ax.plot(grid, C * grid + D, "-", label=f"T = {C:.2f} ln n + {D:.1f}")
    ax.set_xlabel("ln n")
    ax.set_ylabel("collapse time T")
    ax.set_title(f"K = diag({args.a:g}, {args.b:g}), beta = 1: the bipodal phase's exit", fontsize=9)
    ax.legend()
    args.figure_dir.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.figure_dir / "bipodal_time.png", dpi=110)
    print(f"wrote {args.out_dir / 'bipodal_time.csv'} and {args.figure_dir / 'bipodal_time.png'}")


if __name__ == "__main__":
    main()
