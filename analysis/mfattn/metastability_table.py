"""Plateau table of the metastability runs next to the linear prediction.

    /usr/bin/python3 analysis/metastability_table.py data/metastability [--mfattn build/mfattn]

Runs ``mfattn analyze --json`` on every *.h5 under the folder, whatever its name (one
implementation of plateaus and merges: the C++ one, docs/analyze.md), takes beta and the seed
from each file's /parameters (the seed drawn, seed_used, where --seed was auto), and prints one
Markdown row per beta: the predicted
count k* = argmax_k k^2 I_k(beta) (fastest-growing mode of the uniform state on the circle,
mfattn.plotting.predicted_clusters), then per seed the cluster counts of the plateaus that
last at least half a decade of time, with their span in decades, and the count at the end
(the last frame's time in the header; several when the runs end at different times).
Plateaus with more than n / 8 clusters are left out: they are the start, before the tokens
have gathered (a random start on the circle has many pairs closer than delta_c by chance).

--mfattn defaults to the binary of the checkout or build this package is in (build/mfattn
beside analysis/, or the build folder holding python/mfattn/), else mfattn on PATH. Exit
status 2 with one line on stderr for a folder without .h5 files, a file that is not an mfattn
run, or a failing mfattn analyze (mfattn.cli).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import h5py

from .cli import BadInput, script
from .plotting import find_h5, predicted_clusters

MIN_DECADES = 0.5  # plateaus shorter than this are transients of the merging cascade


def analyze(binary: Path, path: Path) -> dict:
    done = subprocess.run([str(binary), "analyze", "--json", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise BadInput(f"mfattn analyze {path} failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout)


def beta_and_seed(path: Path) -> tuple[float, int]:
    """beta and the seed of the run in ``path``, from its /parameters (seed_used, the seed
    drawn, where the run was asked for --seed auto). SystemExit naming the file when it has
    none (not an mfattn run)."""
    try:
        with h5py.File(path, "r") as f:
            attributes = f["parameters"].attrs
            seed = attributes["seed_used"] if "seed_used" in attributes else attributes["seed"]
            return float(attributes["beta"]), int(seed)
    except (OSError, KeyError, ValueError) as error:
        raise BadInput(f"{path}: no beta and seed in /parameters "
                         f"(not an mfattn run?): {error}") from error


def long_plateaus(report: dict) -> str:
    parts = []
    for p in report["plateaus"]:
        gathered = p["clusters"] <= report["n"] // 8
        if gathered and p["decades"] is not None and p["decades"] >= MIN_DECADES:
            parts.append(f"{p['clusters']} ({p['decades']:.1f})")
    return ", ".join(parts) if parts else "-"


def default_binary() -> Path:
    """The mfattn binary of the checkout or build folder this package lies in: build/mfattn of
    the checkout holding analysis/mfattn/, or the build folder holding python/mfattn/ (and so
    its mfattn); else mfattn on PATH; else build/mfattn (named in the error)."""
    package = Path(__file__).resolve().parent
    for candidate in (package.parents[1] / "build" / "mfattn", package.parents[1] / "mfattn"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("mfattn")
    return Path(found) if found else Path("build") / "mfattn"


@script("metastability_table.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--mfattn", type=Path, default=None,
                        help="the mfattn binary (default: this checkout's or build's, else mfattn on PATH)")
    args = parser.parse_args(argv)
    binary = args.mfattn if args.mfattn is not None else default_binary()
    files = find_h5(args.folder) if args.folder.is_dir() else []
    if not files:
        raise BadInput(f"no .h5 files under {args.folder}")
    rows: dict[float, list[tuple[int, dict]]] = defaultdict(list)
    for path in files:
        beta, seed = beta_and_seed(path)
        rows[beta].append((seed, analyze(binary, path)))
    ends = sorted({r["t_last"] for runs in rows.values() for _, r in runs})
    print(f"| beta | k* | seed: plateau clusters (decades), >= {MIN_DECADES} decade | clusters at "
          f"t = {', '.join(f'{t:g}' for t in ends)} |")
    print("|---|---|---|---|")
    for beta in sorted(rows):
        runs = sorted(rows[beta], key=lambda item: item[0])
        plateaus = "; ".join(f"{seed}: {long_plateaus(r)}" for seed, r in runs)
        finals = ", ".join(str(r["final_clusters"]) for _, r in runs)
        print(f"| {beta:g} | {predicted_clusters(beta)} | {plateaus} | {finals} |")


if __name__ == "__main__":
    raise SystemExit(main())
