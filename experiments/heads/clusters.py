#!/usr/bin/python3
"""Clusters of a multi-head layer: how many clusters live at metastable times as H grows, and a
random PyTorch encoder layer run as a flow.

1. Random heads (docs/model.md section 2b): n = 256 tokens in d = 16, SA, H = 1, 2, 4, 8 heads
   of r = d / H (a real model's split), Q_h and K_h from the gaussian preset (entries of variance
   1 / r), V_h = I for every head, so that the H heads move the tokens H times as fast as one:
   the time axis is H t. Per (beta, H) --seeds random starts (the same starts and, for head 0,
   the same Q and K for every H); frames log-spaced to H t = --horizon. The quantity: the
   n_clusters observable (components of <x_i, x_j> > 1 - 1e-4) over H t, its median over seeds,
   and the count at the metastable times H t = 10, 30, 100.
2. A random torch.nn.TransformerEncoderLayer (d = 16, 4 heads, feed-forward width 32, gelu,
   float64, attention bias zeroed, the feed-forward biases kept) exported with
   mfattn.export_torch and run as the flow dx/dt = P_x(attention(x) + MLP(x)) with its
   PyTorch scaling (beta = 1 / sqrt(4)), n = 256, to t = --horizon-torch, and the same layer
   without its feed-forward term (the /mlp group left out): mean inner product, clusters and
   1 - min inner product (how tight the cluster is) over t.

Writes data/heads/clusters.csv, data/heads/encoder.csv and data/figures/heads_clusters.png,
data/figures/heads_encoder.png; prints the tables of docs/experiments.md. About 3 minutes on
2 cores (--quick: one beta, two seeds, shorter horizons, well under a minute).

    MFATTN_BINARY=build/mfattn PYTHONPATH=analysis /usr/bin/python3 experiments/heads/clusters.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
try:
    from mfattn import io as mfattn_io
except ModuleNotFoundError as missing:  # the package is analysis/mfattn: PYTHONPATH=analysis
    raise SystemExit(f"{Path(sys.argv[0]).name}: {missing}: run it from the repository root with PYTHONPATH=analysis "
                     "(the package mfattn; docs/python.md)") from None


def run(binary: str, args: list, out: Path) -> Path:
    command = [binary, "run", *map(str, args), "--threads", os.environ.get("MFATTN_THREADS", "2"), "--quiet",
               "--overwrite", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"clusters.py: {' '.join(command)} failed:\n{done.stderr}")
    return out


def series(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(path) as f:
        return f[f"observables/{name}/time"][:], f[f"observables/{name}/value"][:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--betas", default="4,9")
    parser.add_argument("--horizon", type=float, default=300.0, help="H t reached by every H")
    parser.add_argument("--horizon-torch", type=float, default=60.0)
    parser.add_argument("--binary", default=os.environ.get("MFATTN_BINARY", str(ROOT / "build" / "mfattn")))
    parser.add_argument("--data", default=str(ROOT / "data"))
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.betas, args.horizon, args.horizon_torch = 2, "4", 60.0, 20.0
    data = Path(args.data)
    work = data / "heads"
    work.mkdir(parents=True, exist_ok=True)
    (data / "figures").mkdir(parents=True, exist_ok=True)
    n, d = 256, 16
    heads_list = [1, 2, 4, 8]
    betas = [float(b) for b in args.betas.split(",")]
    marks = [10.0, 30.0, 100.0]

    rows, curves = [], {}
    for beta in betas:
        for heads in heads_list:
            counts = []
            for seed in range(args.seeds):
                out = run(args.binary, ["--n", n, "--d", d, "--heads", heads, "--head-dim", d // heads, "--q", "gaussian",
                                        "--k", "gaussian", "--kernel", "sa", "--beta", beta, "--seed", seed,
                                        "--integrator", "rk4", "--dt", 0.1 / heads, "--horizon", args.horizon / heads,
                                        "--save-log", 40, "--save-positions", "ends"],
                          work / f"b{beta:g}_h{heads}_s{seed}.h5")
                t, c = series(out, "n_clusters")
                counts.append(c)
                row = {"beta": beta, "heads": heads, "seed": seed}
                for mark in marks:
                    if mark <= args.horizon:
                        row[f"clusters_at_Ht_{mark:g}"] = int(c[np.searchsorted(heads * t, mark - 1e-9)])
                rows.append(row)
            curves[(beta, heads)] = (heads * t, np.median(np.array(counts), axis=0))
    with open(work / "clusters.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    # A random PyTorch encoder layer as a flow, with and without its feed-forward term.
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, 4, dim_feedforward=32, activation="gelu", dropout=0.0,
                                             dtype=torch.float64)
    with torch.no_grad():
        layer.self_attn.in_proj_bias.zero_()
        layer.self_attn.out_proj.bias.zero_()
    options = mfattn_io.export_torch(layer, work / "encoder.h5")
    with h5py.File(work / "encoder.h5") as f, h5py.File(work / "encoder_attention.h5", "w") as g:
        f.copy("attention", g)
    encoder_rows, encoder = [], {}
    for label, weights, extra in (("attention + MLP", work / "encoder.h5",
                                   ["--mlp", options["mlp"], "--mlp-activation", options["mlp_activation"]]),
                                  ("attention only", work / "encoder_attention.h5", [])):
        out = run(args.binary, ["--n", n, "--d", d, "--heads", options["heads"], "--head-dim", options["head_dim"],
                                "--beta", repr(options["beta"]), "--kernel", "sa", "--values", "plain",
                                "--weights", weights, *extra, "--integrator", "rk4", "--dt", 0.05,
                                "--horizon", args.horizon_torch, "--save-log", 40, "--seed", 1],
                  work / ("encoder_mlp.h5" if extra else "encoder_attention_run.h5"))
        t, mean_inner = series(out, "mean_inner")
        _, clusters = series(out, "n_clusters")
        _, min_inner = series(out, "min_inner")
        encoder[label] = (t, mean_inner, clusters, min_inner)
        encoder_rows.append({"layer": label, "mean_inner_end": float(mean_inner[-1]), "clusters_end": int(clusters[-1]),
                             "horizon": args.horizon_torch})
    with open(work / "encoder.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(encoder_rows[0]))
        writer.writeheader()
        writer.writerows(encoder_rows)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(betas), figsize=(5.2 * len(betas), 3.8), squeeze=False)
    for ax, beta in zip(axes[0], betas):
        for heads in heads_list:
            x, y = curves[(beta, heads)]
            ax.step(x[1:], y[1:], where="post", label=f"H = {heads}, r = {d // heads}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("H t (the heads' summed time)")
        ax.set_ylabel(f"clusters (median of {args.seeds} seeds)")
        ax.set_title(f"n = {n}, d = {d}, SA, beta = {beta:g}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(data / "figures" / "heads_clusters.png", dpi=130)

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for label, (t, mean_inner, clusters, min_inner) in encoder.items():
        axes[0].plot(t[1:], mean_inner[1:], label=label)
        axes[1].step(t[1:], clusters[1:], where="post", label=label)
        axes[2].plot(t[1:], np.maximum(1.0 - min_inner[1:], 1e-16), label=label)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("t")
    axes[0].set_ylabel("mean <x_i, x_j>")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("t")
    axes[1].set_ylabel("clusters")
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("t")
    axes[2].set_ylabel("1 - min <x_i, x_j> (the cluster's width)")
    axes[0].legend(fontsize=8)
    fig.suptitle("a random nn.TransformerEncoderLayer (d = 16, 4 heads, MLP 32, gelu) as a flow, n = 256")
    fig.tight_layout()
    fig.savefig(data / "figures" / "heads_encoder.png", dpi=130)

    print("| beta | H | r | " + " | ".join(f"clusters at H t = {m:g} (median, range)" for m in marks if m <= args.horizon) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for m in marks if m <= args.horizon) + " |")
    for beta in betas:
        for heads in heads_list:
            cells = []
            for mark in marks:
                if mark > args.horizon:
                    continue
                values = [r[f"clusters_at_Ht_{mark:g}"] for r in rows if r["beta"] == beta and r["heads"] == heads]
                cells.append(f"{int(np.median(values))} ({min(values)}-{max(values)})")
            print(f"| {beta:g} | {heads} | {d // heads} | " + " | ".join(cells) + " |")
    print()
    print("| encoder layer as a flow | mean <x_i, x_j> at the end | clusters at the end |")
    print("| --- | --- | --- |")
    for row in encoder_rows:
        print(f"| {row['layer']} | {row['mean_inner_end']:.3f} | {row['clusters_end']} |")


if __name__ == "__main__":
    main()
