"""Draws token positions from one frame of a density file (``mfattn meanfield``).

    /usr/bin/python3 analysis/sample_density.py DENSITY.h5 --n N --seed S [--frame F] > x0.txt
    mfattn run --init file --init-file x0.txt --n N ...

writes N rows of d numbers (unit vectors, 17 significant digits) drawn i.i.d. from the density
of frame F (default 0; negative counts from the end), so that a particle run starts from the
density that ``mfattn meanfield`` solved (the two lines above are the whole recipe; the run's
n plus its null tokens must be N). The density is treated as constant on each cell of its grid
(negative grid values, which a spectral solve may leave, count as 0):

    circle (d = 2)  a cell a with probability weights_a value_a, then theta uniform in
                    [theta_a - pi / M, theta_a + pi / M): exact for the piecewise-constant
                    density of the finite-volume solver. With labels (--label-points M_xi),
                    token i has the label 2 pi i / N of --positions uniform and is drawn from
                    the conditional density of the nearest label node
                    (round(i M_xi / N) mod M_xi: exact when M_xi divides N).
    zonal (any d)   a polar cell by its mass weights_a value_a, theta uniform in that cell
                    (an approximation: within a cell the measure has the factor
                    sin(theta)^(d - 2), which the draw ignores, an error of the cell's width
                    pi / M), then x = cos(theta) e_1 + sin(theta) u with u uniform on the unit
                    sphere of the coordinates 2..d.
    sphere (d = 3)  a grid point (theta_i, phi_j) by its mass weights_ij value_ij, then a point
                    uniform (in area) on its quadrature cell: phi within phi_j -+ pi / n_phi
                    and cos(theta) within the ring whose area is the Gauss-Legendre weight
                    (edges 1 - cumulative weights, which interlace the nodes). theta is the
                    polar angle from e_3. With labels, token i is drawn from its label
                    node's conditional density, as on the circle.

From Python: ``sample(density, n, rng, frame=0) -> ndarray [n, d]``. Exit status 2 with one
line on stderr for a missing or foreign file or a frame out of range (mfattn.cli).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .cli import script
from .io import Density, load


def _pick(masses: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """count indices into the flattened masses, each with probability mass / total (negative
    masses count as 0)."""
    p = np.clip(np.asarray(masses, dtype=float).ravel(), 0.0, None)
    total = p.sum()
    if not np.isfinite(total) or total <= 0.0:
        raise ValueError("the frame's density has no positive mass to draw from")
    return rng.choice(p.size, size=count, p=p / total)


def sample(density: Density, n: int, rng: np.random.Generator, frame: int = 0) -> np.ndarray:
    """n points [n, d] drawn from frame ``frame`` of ``density`` (see the module docstring)."""
    if n < 1:
        raise ValueError(f"--n {n}: must be at least 1")
    if not -density.frames <= frame < density.frames:
        raise ValueError(f"--frame {frame}: out of range (the file has {density.frames} frames)")
    values = density.values[frame]
    weights = density.weights
    negative = -float(np.clip(density.cell_masses(frame), None, 0.0).sum())
    if negative > 1e-3:
        print(f"sample_density.py: warning: frame {frame} has negative values holding mass "
              f"{negative:.3g}, drawn as 0 (an under-resolved grid? a larger --grid helps)",
              file=sys.stderr)
    edges = density.polar_edges
    def pick_cells() -> np.ndarray:
        """A cell (flat index within a row) per token; with labels token i's row is its label
        node rint(i M_xi / n) mod M_xi, the node of --positions uniform."""
        if density.labels is None:
            return _pick(weights * values, n, rng)
        nodes = len(density.labels)
        label = np.rint(np.arange(n) * nodes / n).astype(np.int64) % nodes
        cells = np.empty(n, dtype=np.int64)
        for c in np.unique(label):
            rows = np.flatnonzero(label == c)
            cells[rows] = _pick(weights[c] * values[c], len(rows), rng)
        return cells

    if density.kind == "circle":
        M = len(density.theta)
        h = 2.0 * np.pi / M
        cells = pick_cells()
        theta = density.theta[cells] + (rng.random(n) - 0.5) * h
        return np.stack([np.cos(theta), np.sin(theta)], axis=1)
    if density.kind == "zonal":
        d = density.d
        cells = _pick(weights * values, n, rng)
        theta = edges[cells] + rng.random(n) * (edges[cells + 1] - edges[cells])
        x = np.zeros((n, d))
        x[:, 0] = np.cos(theta)
        if d > 1:
            u = rng.standard_normal((n, d - 1))
            u /= np.linalg.norm(u, axis=1, keepdims=True)
            x[:, 1:] = np.sin(theta)[:, None] * u
        return x
    # sphere: cells of the Gauss-Legendre rings times equal phi sectors
    n_phi = len(density.phi)
    points = pick_cells()
    ring, sector = np.divmod(points, n_phi)
    mu_top, mu_bottom = np.cos(edges[ring]), np.cos(edges[ring + 1])
    mu = mu_bottom + rng.random(n) * (mu_top - mu_bottom)
    phi = density.phi[sector] + (rng.random(n) - 0.5) * (2.0 * np.pi / n_phi)
    s = np.sqrt(np.clip(1.0 - mu * mu, 0.0, None))
    return np.stack([s * np.cos(phi), s * np.sin(phi), mu], axis=1)


@script("sample_density.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="a density file (mfattn meanfield)")
    parser.add_argument("--n", type=int, required=True, help="rows to draw")
    parser.add_argument("--seed", type=int, required=True, help="seed of NumPy's default_rng")
    parser.add_argument("--frame", type=int, default=0, help="frame to draw from (default 0)")
    args = parser.parse_args(argv)
    density = load(args.file)
    if not isinstance(density, Density):
        raise ValueError(f"{args.file}: a particle run, not a density file (mfattn meanfield)")
    x = sample(density, args.n, np.random.default_rng(args.seed), args.frame)
    np.savetxt(sys.stdout, x, fmt="%.17g")


if __name__ == "__main__":
    raise SystemExit(main())
