#!/usr/bin/python3
"""The exact-realization table and figure of docs/realization.md: `mfattn realize` for each
mechanism (and the contrasts) at n = 64, 128, 256, 1024, printed as a Markdown table of the
distance beside the noise floor, and the figure data/figures/realization.png (one panel per
mechanism at n = 256, analysis/plot_realization.py).

    /usr/bin/python3 experiments/realization/run_realization.py [--sizes 64,128,256,1024] [--out-dir data/realization]

MFATTN_BINARY names the binary (default build/mfattn). About a minute on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("rope", "vmf-mixture", []),
    ("rope", "cap", []),
    ("rope-mixed", "vmf-mixture", []),
    ("prefix-gauge", "vmf-mixture", []),
    ("prefix-gauge", "cap", []),
    ("prefix-gauge", "vmf-mixture", ["--no-pin"]),
    ("rope", "vmf-mixture", ["--contrast", "distance-bias", "--horizon", "100"]),
    ("rope", "vmf-mixture", ["--contrast", "plain-values"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,128,256,1024")
    parser.add_argument("--out-dir", default=str(ROOT / "data" / "realization"))
    parser.add_argument("--figure", default=str(ROOT / "data" / "figures" / "realization.png"))
    a = parser.parse_args()
    binary = os.environ.get("MFATTN_BINARY", str(ROOT / "build" / "mfattn"))
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = []
    for mechanism, target, extra in CASES:
        cells = []
        for n in sizes:
            name = f"{mechanism}_{target}{''.join(extra).replace('--', '_')}_{n}.h5"
            command = [binary, "realize", "--mechanism", mechanism, "--target", target, "--n", str(n), *extra,
                       "--out", str(out / name), "--overwrite", "--json"]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            result = json.loads(done.stdout)
            cells.append(f"{result['distance']:.3g} / {result['noise_floor']:.3g}")
        label = " ".join([mechanism, target, *[e for e in extra if e not in ("--horizon", "100")]])
        metric = {"rope": "W1, circle", "rope-mixed": "energy, torus"}.get(mechanism, "energy, sphere")
        rows.append(f"| {label} | {metric} | " + " | ".join(cells) + " |")
    print("| mechanism, target | metric | " + " | ".join(f"n = {n}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    print("\n".join(rows))
    panels = [out / f"rope_cap_256.h5", out / f"rope-mixed_vmf-mixture_256.h5", out / f"prefix-gauge_vmf-mixture_256.h5",
              out / f"prefix-gauge_vmf-mixture_no-pin_256.h5"]
    Path(a.figure).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "analysis" / "plot_realization.py"), *map(str, panels), "--out", a.figure],
                   check=True, env=dict(os.environ, MPLBACKEND="Agg"))


if __name__ == "__main__":
    main()
