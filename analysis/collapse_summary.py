#!/usr/bin/env python3
"""Outcome table of mfattn runs in a folder: one row per file with the final minimum and mean
pairwise inner product, the energy, the flatness (smallest eigenvalue of the second moment
(1/n) sum x x^T: 0 on a great circle through the origin), the spread of the last coordinate
(0 on a latitude circle of RoPE in d = 3) and collapsed = min inner > 0.999. Optional figures:
1 - min inner against time, and the final states of the d = 3 runs on the sphere.
Runs under /usr/bin/python3 (Debian's h5py, numpy, matplotlib)."""
import argparse
import pathlib

import h5py
import numpy as np


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def summarize(path):
    with h5py.File(path, "r") as f:
        params = f["parameters"].attrs
        obs = f["observables"]
        x = f["particles/tokens/position/value"][-1]
        presence = f["particles/tokens/presence"][()]
        x = x[presence > 0]
        moment = x.T @ x / len(x)
        min_inner = obs["min_inner/value"][()]
        return {
            "file": path.name,
            "case": path.stem.rsplit("_n", 1)[0],
            "kernel": text(params["kernel"]),
            "geometry": text(params["geometry"]) if "geometry" in params else "none",
            "values": text(params["values"]) if "values" in params else "transported",
            "factor": text(params["aux-factor"]) if "aux-factor" in params else "none",
            "n": int(params["n"]),
            "d": int(params["d"]),
            "beta": float(params["beta"]),
            "t_final": float(obs["min_inner/time"][-1]),
            "min_inner": float(min_inner[-1]),
            "mean_inner": float(obs["mean_inner/value"][-1]),
            "energy": float(obs["energy/value"][-1]),
            "flatness": float(np.linalg.eigvalsh(moment)[0]),
            "last_spread": float(np.ptp(x[:, -1])),
            "collapsed": bool(min_inner[-1] > 0.999),
            "times": obs["min_inner/time"][()],
            "min_inner_series": min_inner,
            "final": x,
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--cases", action="store_true", help="table with case, geometry and shape columns")
    parser.add_argument("--figure", type=pathlib.Path, help="1 - min inner against time")
    parser.add_argument("--final-figure", type=pathlib.Path, help="final d = 3 states on the sphere")
    args = parser.parse_args()
    rows = sorted((summarize(p) for p in args.folder.glob("*.h5")), key=lambda r: (r["case"], r["kernel"], r["n"]))
    if not rows:
        raise SystemExit(f"no .h5 files in {args.folder}")
    if args.cases:
        print("| case | kernel | geometry | values | factor | n | d | 1 - min inner | flatness | last-coordinate spread | collapsed |")
        print("|" + "---|" * 11)
        for r in rows:
            print(f"| {r['case']} | {r['kernel']} | {r['geometry']} | {r['values']} | {r['factor']} | {r['n']} | "
                  f"{r['d']} | {1 - r['min_inner']:.2e} | {r['flatness']:.2e} | {r['last_spread']:.2e} | "
                  f"{'yes' if r['collapsed'] else 'no'} |")
    else:
        print("| kernel | n | d | beta | t | 1 - min inner | 1 - mean inner | energy | collapsed |")
        print("|" + "---|" * 9)
        for r in rows:
            print(f"| {r['kernel']} | {r['n']} | {r['d']} | {r['beta']:g} | {r['t_final']:g} | "
                  f"{1 - r['min_inner']:.2e} | {1 - r['mean_inner']:.2e} | {r['energy']:.6f} | "
                  f"{'yes' if r['collapsed'] else 'no'} |")
    import matplotlib.pyplot as plt
    if args.figure:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for r in rows:
            if args.cases and r["n"] != 128:
                continue
            label = f"{r['case']}" if args.cases else f"{r['kernel'].upper()} n={r['n']}"
            ax.plot(r["times"], 1.0 - np.clip(r["min_inner_series"], -1.0, 1.0) + 1e-16, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("t")
        ax.set_ylabel("1 - min_{i,j} <x_i, x_j>")
        ax.set_title("Minimum pairwise inner product" + (" (n = 128)" if args.cases else ""))
        ax.legend(fontsize=7)
        fig.tight_layout()
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figure, dpi=120)
        print(f"figure: {args.figure}")
    if args.final_figure:
        finals = [r for r in rows if r["d"] == 3 and r["n"] == 256]
        if finals:
            columns = min(3, len(finals))
            grid_rows = (len(finals) + columns - 1) // columns
            fig = plt.figure(figsize=(3.4 * columns, 3.6 * grid_rows))
            u, v = np.mgrid[0:2 * np.pi:40j, 0:np.pi:20j]
            for k, r in enumerate(finals):
                ax = fig.add_subplot(grid_rows, columns, k + 1, projection="3d")
                ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v),
                                  color="0.85", linewidth=0.3)
                x = r["final"]
                ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=6, c=np.arange(len(x)), cmap="viridis")
                ax.set_title(f"{r['case']}: {r['kernel'].upper()}, n = {r['n']}, t = {r['t_final']:g}",
                             fontsize=9, pad=0)
                ax.set_box_aspect((1, 1, 1))
                ax.set_axis_off()
            fig.tight_layout()
            args.final_figure.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(args.final_figure, dpi=110)
            print(f"figure: {args.final_figure}")


if __name__ == "__main__":
    main()
