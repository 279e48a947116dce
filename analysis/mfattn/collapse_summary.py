"""Outcome table of mfattn runs in a folder: one row per file with the final minimum and mean
pairwise inner product, the energy, the flatness (smallest eigenvalue of the second moment
(1/n) sum x x^T: 0 on a great circle through the origin), the spread of the last coordinate
(0 on a latitude circle of RoPE in d = 3), the number of clusters (connected components of
<x_i, x_j> > 1 - 1e-4, as the n_clusters observable), the prompts and prefix tokens per prompt,
and collapsed = min inner > 0.999. Optional figures:
1 - min inner against time, and the final states of the d = 3 runs on the sphere.
A file written with --save-positions none has no final positions: its clusters come from the
stored n_clusters observable, its flatness and last-coordinate spread are nan, and the
final-state figure leaves it out (with a note). With --save-positions ends the last kept
frame is the final one, as with all.
Runs under /usr/bin/python3 (Debian's h5py, numpy, matplotlib).

    MPLBACKEND=Agg /usr/bin/python3 analysis/collapse_summary.py FOLDER [--cases] [--figure F.png]
        [--final-figure F.png]

Exit status 2 with one line on stderr for a folder without .h5 files or a file that is not an
mfattn run (mfattn.cli)."""
import argparse
import pathlib

import h5py
import numpy as np

from .cli import BadInput, script
from .plotting import cluster_count


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def summarize(path):
    with h5py.File(path, "r") as f:
        params = f["parameters"].attrs
        obs = f["observables"]
        stored = f["particles/tokens/position/value"]
        presence = f["particles/tokens/presence"][()]
        x = stored[-1][presence > 0] if stored.shape[0] else None  # None: --save-positions none
        moment = x.T @ x / len(x) if x is not None else None
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
            "flatness": float(np.linalg.eigvalsh(moment)[0]) if x is not None else float("nan"),
            "last_spread": float(np.ptp(x[:, -1])) if x is not None else float("nan"),
            "collapsed": bool(min_inner[-1] > 0.999),
            "clusters": cluster_count(x) if x is not None else int(obs["n_clusters/value"][-1]),
            "prompts": int(params["prompts"]) if "prompts" in params else 1,
            "prefix": int(params["prefix"]) if "prefix" in params else 0,
            "prefix_tokens": f["particles/prefix/position"][()] if "particles/prefix" in f else None,
            "times": obs["min_inner/time"][()],
            "min_inner_series": min_inner,
            "final": x,
        }


def summarize_folder(folder):
    """summarize() of every *.h5 directly in ``folder``, sorted by case, kernel and n (the
    table order); BadInput (a ValueError) when there is none."""
    folder = pathlib.Path(folder)
    rows = sorted((summarize(p) for p in folder.glob("*.h5")), key=lambda r: (r["case"], r["kernel"], r["n"]))
    if not rows:
        raise BadInput(f"no .h5 files in {folder}")
    return rows


def min_inner_figure(rows, path, cases=False):
    """1 - min inner against time for ``rows`` (summarize() dicts; with ``cases`` only n = 128,
    labelled by case). Writes ``path`` and returns it."""
    import matplotlib.pyplot as plt
    path = pathlib.Path(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in rows:
        if cases and r["n"] != 128:
            continue
        label = f"{r['case']}" if cases else f"{r['kernel'].upper()} n={r['n']}"
        ax.plot(r["times"], 1.0 - np.clip(r["min_inner_series"], -1.0, 1.0) + 1e-16, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("t")
    ax.set_ylabel("1 - min_{i,j} <x_i, x_j>")
    ax.set_title("Minimum pairwise inner product" + (" (n = 128)" if cases else ""))
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def final_state_figure(rows, path):
    """Final states of the d = 3, n = 256 rows on the sphere. Writes ``path`` and returns it,
    or returns None (nothing written) when no row is d = 3 with n = 256."""
    import matplotlib.pyplot as plt
    path = pathlib.Path(path)
    finals = [r for r in rows if r["d"] == 3 and r["n"] == 256]
    for r in finals:
        if r["final"] is None:
            print(f"note: {r['file']} has no positions (--save-positions none); left out of {path.name}")
    finals = [r for r in finals if r["final"] is not None]
    if not finals:
        return None
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
        if r["prefix_tokens"] is not None:  # frozen prefix tokens as red crosses
            y = r["prefix_tokens"]
            ax.scatter(y[:, 0], y[:, 1], y[:, 2], s=30, marker="x", c="red")
        ax.set_title(f"{r['case']}: {r['kernel'].upper()}, n = {r['n']}, t = {r['t_final']:g}",
                     fontsize=9, pad=0)
        ax.set_box_aspect((1, 1, 1))
        ax.set_axis_off()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@script("collapse_summary.py")
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--cases", action="store_true", help="table with case, geometry and shape columns")
    parser.add_argument("--figure", type=pathlib.Path, help="1 - min inner against time")
    parser.add_argument("--final-figure", type=pathlib.Path, help="final d = 3 states on the sphere")
    args = parser.parse_args(argv)
    rows = summarize_folder(args.folder)
    if args.cases:
        print("| case | kernel | geometry | values | factor | prompts x prefix | n | d | 1 - min inner | "
              "flatness | last-coordinate spread | clusters | collapsed |")
        print("|" + "---|" * 13)
        for r in rows:
            prefix = f"{r['prompts']} x {r['prefix']}" if r["prefix"] else "-"
            print(f"| {r['case']} | {r['kernel']} | {r['geometry']} | {r['values']} | {r['factor']} | {prefix} | "
                  f"{r['n']} | {r['d']} | {1 - r['min_inner']:.2e} | {r['flatness']:.2e} | "
                  f"{r['last_spread']:.2e} | {r['clusters']} | {'yes' if r['collapsed'] else 'no'} |")
    else:
        print("| kernel | n | d | beta | t | 1 - min inner | 1 - mean inner | energy | collapsed |")
        print("|" + "---|" * 9)
        for r in rows:
            print(f"| {r['kernel']} | {r['n']} | {r['d']} | {r['beta']:g} | {r['t_final']:g} | "
                  f"{1 - r['min_inner']:.2e} | {1 - r['mean_inner']:.2e} | {r['energy']:.6f} | "
                  f"{'yes' if r['collapsed'] else 'no'} |")
    if args.figure:
        print(f"figure: {min_inner_figure(rows, args.figure, cases=args.cases)}")
    if args.final_figure:
        written = final_state_figure(rows, args.final_figure)
        if written:
            print(f"figure: {written}")


if __name__ == "__main__":
    raise SystemExit(main())
