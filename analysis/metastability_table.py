#!/usr/bin/env python3
"""Plateau table of the metastability runs next to the linear prediction.

    /usr/bin/python3 analysis/metastability_table.py data/metastability [--mfattn build/mfattn]

Runs ``mfattn analyze --json`` on every *.h5 in the folder (one implementation of plateaus
and merges: the C++ one, docs/analyze.md) and prints one Markdown row per beta: the predicted
count k* = argmax_k k^2 I_k(beta) (fastest-growing mode of the uniform state on the circle,
plotting_common.predicted_clusters), then per seed the cluster counts of the plateaus that
last at least half a decade of time, with their span in decades, and the count at the end.
Plateaus with more than n / 8 clusters are left out: they are the start, before the tokens
have gathered (a random start on the circle has many pairs closer than delta_c by chance).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from plotting_common import predicted_clusters

MIN_DECADES = 0.5  # plateaus shorter than this are transients of the merging cascade


def analyze(binary: Path, path: Path) -> dict:
    done = subprocess.run([str(binary), "analyze", "--json", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"mfattn analyze {path} failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout)


def beta_and_seed(path: Path) -> tuple[float, int]:
    """beta<b>_seed<s>.h5 as written by experiments/run_collapse.sh."""
    beta, seed = path.stem.split("_")
    return float(beta.removeprefix("beta")), int(seed.removeprefix("seed"))


def long_plateaus(report: dict) -> str:
    parts = []
    for p in report["plateaus"]:
        gathered = p["clusters"] <= report["n"] // 8
        if gathered and p["decades"] is not None and p["decades"] >= MIN_DECADES:
            parts.append(f"{p['clusters']} ({p['decades']:.1f})")
    return ", ".join(parts) if parts else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--mfattn", type=Path,
                        default=Path(__file__).resolve().parents[1] / "build" / "mfattn")
    args = parser.parse_args()
    files = sorted(args.folder.glob("beta*_seed*.h5"))
    if not files:
        print(f"metastability_table.py: no beta*_seed*.h5 files in {args.folder}", file=sys.stderr)
        return 1
    rows: dict[float, list[tuple[int, dict]]] = defaultdict(list)
    for path in files:
        beta, seed = beta_and_seed(path)
        rows[beta].append((seed, analyze(args.mfattn, path)))
    print(f"| beta | k* | seed: plateau clusters (decades), >= {MIN_DECADES} decade | clusters at t = 1e5 |")
    print("|---|---|---|---|")
    for beta in sorted(rows):
        runs = sorted(rows[beta], key=lambda item: item[0])
        plateaus = "; ".join(f"{seed}: {long_plateaus(r)}" for seed, r in runs)
        finals = ", ".join(str(r["final_clusters"]) for _, r in runs)
        print(f"| {beta:g} | {predicted_clusters(beta)} | {plateaus} | {finals} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
