#!/usr/bin/python3
"""One query against n keys (Bruno, Rigollet, Chen, Polyanskiy, Lin, arXiv:2605.08505): where
does the softmax plan of a query over n iid uniform keys on S^{d-1} stop spreading over many
keys and pick a few? The largest of n keys' scores is 1 - O(n^{-2/(d-1)}) (the cap around the
query that holds one key of n), so the plan concentrates once beta (1 - max_j <q, k_j>) is of
order one: the critical beta_n* ~ n^{2/(d-1)}.

For d = 3 and 4 and n = 1e2 .. 1e6, `mfattn keys` (64 samples each) at beta = c n^{2/(d-1)},
c from 1e-3 to 1e2; the figure draws the largest weight and the entropy over log n against c,
one curve per n (they fall on one curve where the scaling holds), with the critical line
c = 1. Writes data/attention/one_query_d{d}_n{n}.h5, data/attention/one_query.csv (d, n, c,
beta, the means and standard errors) and data/figures/one_query.png; prints the table of
docs/experiments.md (the largest weight at c = 0.1, 1, 10). About a minute on 2 cores
(--quick: n = 1e2 and 1e3, 8 samples, no figure).

    /usr/bin/python3 experiments/attention/one_query.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MFATTN_BINARY", ROOT / "build" / "mfattn"))
STATISTICS = ("largest_weight", "entropy", "participation", "output_along_query")


def measure(d: int, n: int, factors: np.ndarray, samples: int, folder: Path) -> list[dict]:
    scale = n ** (2 / (d - 1))
    betas = factors * scale
    out = folder / f"one_query_d{d}_n{n}.h5"
    subprocess.run([str(BINARY), "keys", "--d", str(d), "--n", str(n), "--beta", ",".join(f"{b:.17g}" for b in betas),
                    "--samples", str(samples), "--seed", str(d), "--quiet", "--overwrite", "--out", str(out)], check=True)
    rows = []
    with h5py.File(out, "r") as f:
        for b, (c, beta) in enumerate(zip(factors, betas)):
            row = dict(d=d, n=n, c=c, beta=beta)
            for name in STATISTICS:
                row[name] = float(f["keys/mean/" + name][0, b])
                row[name + "_se"] = float(f["keys/standard_error/" + name][0, b])
            rows.append(row)
    return rows


def draw(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dims = sorted({r["d"] for r in rows})
    figure, axes = plt.subplots(2, len(dims), figsize=(5 * len(dims), 7), squeeze=False)
    for column, d in enumerate(dims):
        for n in sorted({r["n"] for r in rows if r["d"] == d}):
            own = [r for r in rows if r["d"] == d and r["n"] == n]
            c = [r["c"] for r in own]
            axes[0, column].errorbar(c, [r["largest_weight"] for r in own], [r["largest_weight_se"] for r in own],
                                     label=f"n = {n:.0e}", marker=".")
            axes[1, column].errorbar(c, [r["entropy"] / np.log(n) for r in own],
                                     [r["entropy_se"] / np.log(n) for r in own], marker=".")
        for row in range(2):
            axes[row, column].set_xscale("log")
            axes[row, column].axvline(1.0, color="grey", linestyle="--", linewidth=1)
            axes[row, column].set_xlabel(r"$c = \beta / n^{2/(d-1)}$")
        axes[0, column].set_title(f"d = {d}: one query, n uniform keys")
        axes[0, column].set_ylabel("largest weight (mean over samples)")
        axes[1, column].set_ylabel("entropy / log n")
        axes[0, column].legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--data", default=str(ROOT / "data"))
    args = parser.parse_args()
    data = Path(args.data)
    folder = data / "attention"
    folder.mkdir(parents=True, exist_ok=True)
    factors = np.logspace(-3, 2, 16)
    counts = [100, 1000] if args.quick else [100, 1000, 10000, 100000, 1000000]
    samples = 8 if args.quick else args.samples
    rows = [row for d in (3, 4) for n in counts for row in measure(d, n, factors, samples, folder)]
    with open(folder / "one_query.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if not args.quick:
        draw(rows, data / "figures" / "one_query.png")
    print("| d | n | largest weight at c = 0.1 | at c = 1 | at c = 10 |")
    print("| --- | --- | --- | --- | --- |")
    for d in (3, 4):
        for n in counts:
            own = {round(float(np.log10(r["c"])), 6): r for r in rows if r["d"] == d and r["n"] == n}
            cells = []
            for exponent in (-1, 0, 1):
                nearest = min(own, key=lambda e: abs(e - exponent))
                r = own[nearest]
                cells.append(f"{r['largest_weight']:.3g} +- {r['largest_weight_se']:.1g}")
            print(f"| {d} | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
