#!/usr/bin/env python3
"""Outcome table of collapse runs: one row per mfattn file (final time, minimum and mean
pairwise inner product, energy, collapsed = min_inner > 0.999), and optionally a figure of
the minimum inner product against time. Runs under /usr/bin/python3 (Debian's h5py)."""
import argparse
import pathlib

import h5py
import numpy as np


def summarize(path):
    with h5py.File(path, "r") as f:
        params = f["parameters"].attrs
        obs = f["observables"]
        times = obs["min_inner/time"][()]
        min_inner = obs["min_inner/value"][()]
        return {
            "file": path.name,
            "kernel": params["kernel"].decode() if isinstance(params["kernel"], bytes) else params["kernel"],
            "n": int(params["n"]),
            "d": int(params["d"]),
            "beta": float(params["beta"]),
            "t_final": float(times[-1]),
            "min_inner": float(min_inner[-1]),
            "mean_inner": float(obs["mean_inner/value"][-1]),
            "energy": float(obs["energy/value"][-1]),
            "collapsed": bool(min_inner[-1] > 0.999),
            "status": f["run"].attrs["status"],
            "times": times,
            "min_inner_series": min_inner,
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--figure", type=pathlib.Path)
    args = parser.parse_args()
    rows = sorted((summarize(p) for p in args.folder.glob("*.h5")), key=lambda r: (r["kernel"], r["n"]))
    if not rows:
        raise SystemExit(f"no .h5 files in {args.folder}")
    header = "| kernel | n | d | beta | t | 1 - min inner | 1 - mean inner | energy | collapsed |"
    print(header)
    print("|" + "---|" * 9)
    for r in rows:
        print(f"| {r['kernel']} | {r['n']} | {r['d']} | {r['beta']:g} | {r['t_final']:g} | "
              f"{1 - r['min_inner']:.2e} | {1 - r['mean_inner']:.2e} | {r['energy']:.6f} | "
              f"{'yes' if r['collapsed'] else 'no'} |")
    if args.figure:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for r in rows:
            ax.plot(r["times"], 1.0 - np.clip(r["min_inner_series"], -1.0, 1.0) + 1e-16,
                    label=f"{r['kernel'].upper()} n={r['n']}")
        ax.set_yscale("log")
        ax.set_xlabel("t")
        ax.set_ylabel("1 - min_{i,j} <x_i, x_j>")
        ax.set_title(f"Baseline collapse, d = {rows[0]['d']}, beta = {rows[0]['beta']:g}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figure, dpi=120)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
