"""Target against realized law for files of `mfattn realize` (docs/realization.md): one panel
per file. Circle (rope): histograms of the target's angles (rotated by the optimal rotation the
distance found) and of the realized angles. Torus (rope-mixed): both samples in the square of
the two block angles. Sphere (prefix-gauge): both samples on the sphere (the first three
coordinates).

    /usr/bin/python3 analysis/plot_realization.py FILE.h5 [FILE.h5 ...] --out FIGURE.png

Exit 2 with one line on stderr for a missing file or one that is not a file of `mfattn realize`
(mfattn.cli).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np

from .cli import BadInput, script


def panel(figure, index, count, path):
    if not Path(path).is_file():
        raise BadInput(f"{path}: no such file")
    with h5py.File(path, "r") as f:
        if "realization" not in f:
            raise BadInput(f"{path}: not a file of mfattn realize (no /realization group)")
        group = f["realization"]
        target, realized = group["target"][()], group["realized"][()]
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in group.attrs.items()}
    title = (f"{attrs['mechanism']} / {attrs['target']}" + ("" if attrs.get("contrast", "none") == "none"
                                                            else f" / {attrs['contrast']}")
             + ("" if attrs.get("pinned", "no") == "yes" or attrs["mechanism"] != "prefix-gauge" else " / free u")
             + f"\nn = {len(realized)}, distance {attrs['distance']:.3g} (noise {attrs['noise_floor']:.3g})")
    two_pi = 2 * np.pi
    if target.ndim == 1:
        axes = figure.add_subplot(1, count, index)
        rotated = np.mod(target + attrs.get("rotation_0", 0.0), two_pi)
        bins = np.linspace(0, two_pi, 41)
        axes.hist(rotated, bins=bins, density=True, alpha=0.5, label="target sample (rotated)", color="0.4")
        axes.hist(np.mod(realized, two_pi), bins=bins, density=True, histtype="step", lw=2, label="realized", color="C3")
        axes.set_xlabel("angle on the latitude circle")
        axes.legend(fontsize=8)
    elif target.shape[1] == 2:
        axes = figure.add_subplot(1, count, index)
        shift = np.array([attrs.get("rotation_0", 0.0), attrs.get("rotation_1", 0.0)])
        shifted = np.mod(target + shift, two_pi)
        axes.scatter(shifted[:, 0], shifted[:, 1], s=6, color="0.5", label="target sample (rotated)")
        axes.scatter(np.mod(realized[:, 0], two_pi), np.mod(realized[:, 1], two_pi), s=6, color="C3", label="realized")
        axes.set_xlim(0, two_pi)
        axes.set_ylim(0, two_pi)
        axes.set_xlabel("block 0 angle")
        axes.set_ylabel("block 1 angle")
        axes.legend(fontsize=8, loc="upper right")
    else:
        axes = figure.add_subplot(1, count, index, projection="3d")
        axes.scatter(target[:, 0], target[:, 1], target[:, 2], s=5, color="0.5", label="target sample")
        axes.scatter(realized[:, 0], realized[:, 1], realized[:, 2], s=5, color="C3", label="realized")
        axes.set_box_aspect((1, 1, 1))
        axes.legend(fontsize=8)
    axes.set_title(title, fontsize=9)


@script("plot_realization.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out", required=True)
    a = parser.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure = plt.figure(figsize=(4.4 * len(a.files), 4.2))
    for index, path in enumerate(a.files, start=1):
        panel(figure, index, len(a.files), path)
    figure.tight_layout()
    figure.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    raise SystemExit(main())
