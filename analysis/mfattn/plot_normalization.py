"""The clustered-pair fraction over time per normalization placement (docs/model.md section 2c)
and for Sinkhorn attention (section 2d),
one panel per beta, from the curves.csv that experiments/normalization/collapse.py writes
(columns placement, beta, time, fraction).

    /usr/bin/python3 analysis/plot_normalization.py CURVES.csv --out FIGURE.png

Exit 2 with one line on stderr for a file that is not such a table (mfattn.cli).
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict

from .cli import BadInput, script


@script("plot_normalization.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("curves")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    series: dict[float, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    try:
        with open(args.curves, newline="") as f:
            for row in csv.DictReader(f):
                series[float(row["beta"])][row["placement"]].append((float(row["time"]), float(row["fraction"])))
    except (OSError, KeyError, ValueError) as error:
        raise BadInput(f"{args.curves}: not a curves table ({error})") from None
    if not series:
        raise BadInput(f"{args.curves}: no rows")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    betas = sorted(series)
    fig, axes = plt.subplots(1, len(betas), figsize=(4.6 * len(betas), 3.6), squeeze=False, sharey=True)
    for ax, beta in zip(axes[0], betas):
        for placement, points in series[beta].items():
            points = [p for p in points if p[0] > 0]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=placement)
        ax.set_xscale("log")
        ax.set_xlabel("t")
        ax.set_title(f"n = 128, d = 16, random Q, K, V, beta = {beta:g}", fontsize=9)
    axes[0][0].set_ylabel("clustered-pair fraction\n(median over seeds)")
    # Below the panels, so that no curve is hidden behind it.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               title="--normalization (sinkhorn: --kernel sinkhorn, post)", title_fontsize=8)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(args.out, dpi=130)


if __name__ == "__main__":
    raise SystemExit(main())
