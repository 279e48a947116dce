"""Shared helpers of the mean-field experiments (experiments/meanfield/*.py), which import the
package mfattn from analysis/: run them from the repository root as
``PYTHONPATH=analysis /usr/bin/python3 experiments/meanfield/<script>.py`` (docs/python.md).

- ``binary()``: the mfattn binary: $MFATTN_BINARY, else the first of build/mfattn and
  build-dev/mfattn whose ``meanfield --help`` works.
- ``mfattn(args, out, reuse)``: runs ``mfattn <args> --threads T --out out --overwrite --quiet``
  (T = threads=, else $MFATTN_THREADS, else 1); with reuse=True an existing complete file
  written by the same command line is kept.
- ``Density`` / ``Particles``: the datasets of a density file (mfattn meanfield) and of a
  particle run (mfattn run).
- linear theory of the uniform state (docs: the brief of these experiments, section "Linear
  theory"): ``growth_rate``, ``kappa_critical``, ``metastable_clusters``, from
  mfattn.plot_meanfield's ``growth_rates`` and ``critical_kappa``.
- ``write_samples``: a particle start drawn from a density (mfattn.sample_density).
- ``w1_circle``: the exact Wasserstein-1 distance on the circle between measures given as
  piecewise-constant densities on cells and/or weighted atoms.
- ``write_csv``, ``markdown_table``, ``standard_parser``, ``add_options``, ``finish``.
"""
from __future__ import annotations

import argparse
import csv
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TWO_PI = 2.0 * np.pi

try:
    from mfattn.io import load
    from mfattn.plot_meanfield import critical_kappa, growth_rates
    from mfattn.sample_density import sample
except ModuleNotFoundError as missing:  # the package is analysis/mfattn: PYTHONPATH=analysis
    raise SystemExit(f"{Path(sys.argv[0]).name}: {missing}: run it from the repository root with PYTHONPATH=analysis "
                     "(the package mfattn; docs/python.md)") from None

# ----------------------------------------------------------------------------------------------
# the binary and runs


_BINARY: str | None = None


def binary() -> str:
    global _BINARY
    if _BINARY is not None:
        return _BINARY
    given = os.environ.get("MFATTN_BINARY")
    if given:
        _BINARY = given
        return _BINARY
    for candidate in (ROOT / "build" / "mfattn", ROOT / "build-dev" / "mfattn"):
        if candidate.exists():
            probe = subprocess.run([str(candidate), "meanfield", "--help"], capture_output=True, text=True)
            if probe.returncode == 0:
                _BINARY = str(candidate)
                return _BINARY
    raise SystemExit("no mfattn binary with the meanfield command: build one (cmake --build build) "
                     "or set MFATTN_BINARY")


def _command_line_of(path: Path) -> str | None:
    import h5py
    try:
        with h5py.File(path, "r") as f:
            if f["run"].attrs.get("status", b"") not in ("complete", b"complete"):
                return None
            return str(f["parameters"].attrs["command_line"])
    except Exception:  # noqa: BLE001 - any unreadable file is simply rerun
        return None


def mfattn(args: list, out: Path, reuse: bool = False, threads: int | None = None,
           capture: bool = False) -> subprocess.CompletedProcess | None:
    """Runs ``mfattn args --out out --overwrite --quiet`` (and --threads when given). With
    reuse, a complete file at ``out`` whose recorded command line has the same options is
    kept and nothing runs (returns None)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args = [str(a) for a in args]
    # one thread per run unless told (MFATTN_THREADS or threads=): OpenMP threads on a busy
    # 2-core machine wait on each other (a 256-token run took 30 s on 2 threads, 0.1 s on 1)
    if threads is None:
        threads = int(os.environ.get("MFATTN_THREADS", "1"))
    args += ["--threads", str(threads)]
    full = [binary(), *args, "--out", str(out), "--overwrite", "--quiet"]
    if reuse and out.exists():
        recorded = _command_line_of(out)
        if recorded is not None and recorded.split()[1:] == full[1:]:
            return None
    for attempt in range(30):  # the binary may be in the middle of a rebuild (being linked)
        try:
            done = subprocess.run(full, capture_output=True, text=True)
            break
        except (PermissionError, FileNotFoundError, OSError):
            if attempt == 29:
                raise
            time.sleep(5)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {shlex.join(full)}\n{done.stderr.strip()}")
    return done


def run_parallel(jobs: int, tasks: list, function) -> list:
    """function(task) for every task, ``jobs`` at a time (threads around subprocesses)."""
    if jobs <= 1:
        return [function(t) for t in tasks]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(function, tasks))


# ----------------------------------------------------------------------------------------------
# files


class _RunFile:
    """The datasets every mfattn file has: ``time`` of the group GROUP and the /run attributes;
    a subclass reads the rest in ``_read(f, g)``."""

    GROUP = ""

    def __init__(self, path: Path):
        import h5py
        self.path = Path(path)
        with h5py.File(path, "r") as f:
            g = f[self.GROUP]
            self.time = g["time"][()]
            self._read(f, g)
            self.run = dict(f["run"].attrs)

    def _read(self, f, g) -> None:
        raise NotImplementedError

    @property
    def wall_time(self) -> float:
        return float(self.run.get("wall_time_s", np.nan))


class Density(_RunFile):
    """A density file of ``mfattn meanfield``."""

    GROUP = "fields/density"

    def _read(self, f, g) -> None:
        self.value = g["value"][()]
        self.weights = g["weights"][()]
        self.theta = g["theta"][()]
        self.labels = g["labels"][()] if "labels" in g else None
        self.obs = {name: f["observables"][name]["value"][()] for name in f["observables"]}
        self.parameters = dict(f["parameters"].attrs)

    def frame_at(self, t: float) -> int:
        i = int(np.argmin(np.abs(self.time - t)))
        if abs(self.time[i] - t) > 1e-9 * max(1.0, abs(t)):
            raise ValueError(f"{self.path}: no frame at t = {t} (nearest {self.time[i]})")
        return i


class Particles(_RunFile):
    """The positions of a particle run of ``mfattn run``."""

    GROUP = "particles/tokens/position"

    def _read(self, f, g) -> None:
        self.position = g["value"][()]
        self.obs = {name: f["observables"][name]["value"][()] for name in f.get("observables", {})}
        self.obs_time = {name: f["observables"][name]["time"][()] for name in f.get("observables", {})
                         if "time" in f["observables"][name]}

    def angles(self, frame: int) -> np.ndarray:
        x = self.position[frame]
        return np.mod(np.arctan2(x[:, 1], x[:, 0]), TWO_PI)


def write_density_file(path: Path, values: np.ndarray) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, np.asarray(values, dtype=float), fmt="%.17g")
    return path


def write_samples(density_file: Path, n: int, seed: int, out: Path) -> Path:
    """x0 text file of n samples of frame 0 (analysis/sample_density.py's ``sample``, seeded
    like its --seed: the file ``sample_density.py DENSITY --n N --seed S`` prints)."""
    out = Path(out)
    np.savetxt(out, sample(load(density_file), n, np.random.default_rng(seed)), fmt="%.17g")
    return out


# ----------------------------------------------------------------------------------------------
# linear theory of the uniform state (Q = K = V = I)


def growth_rate(l, beta: float, d: int = 2, kernel: str = "usa", kappa: float = 0.0,
                rescaled: bool = False):
    """gamma_l (l >= 1, a number or an array) of analysis/plot_meanfield.py's growth_rates:
    l (l + d - 2) (c_l/beta - 1/kappa) (USA) or (c_l/(beta c_0) - 1/kappa) (SA); kappa = 0 means
    no noise; rescaled multiplies the USA kernel by exp(-beta)."""
    l = np.asarray(l, dtype=np.int64)
    rates = growth_rates(d, beta, kernel, kappa, int(l.max()),
                         time_scale="rescaled" if rescaled else "natural")
    return rates[l - 1]


def kappa_critical(beta: float, kernel: str = "usa", d: int = 2) -> float:
    """Noise level kappa_c below which (kappa < kappa_c, more noise) the uniform state is stable
    (analysis/plot_meanfield.py's critical_kappa): gamma_1 = 0."""
    return critical_kappa(beta, kernel, d)


def metastable_clusters(beta: float, kmax: int = 200) -> int:
    """argmax_k k^2 I_k(beta): the fastest-growing mode of the circle USA (arXiv:2410.23228)."""
    return int(np.argmax(growth_rates(2, beta, "usa", 0.0, kmax, time_scale="rescaled"))) + 1


# ----------------------------------------------------------------------------------------------
# Wasserstein-1 on the circle


class CircleMeasure:
    """A probability measure on [0, 2 pi): a piecewise-constant density on cells centred at
    theta_a = 2 pi a / M (values w.r.t. d theta times the cell weights) plus/or atoms."""

    def __init__(self, cell_masses=None, atoms=None, atom_weights=None):
        self.knots = np.zeros(0)
        self.cdf_knots = np.zeros(0)
        total = 0.0
        if cell_masses is not None:
            m = np.asarray(cell_masses, dtype=float)
            M = m.size
            h = TWO_PI / M
            # cell 0 is split by the origin: [0, h/2) and [2 pi - h/2, 2 pi)
            edges = (np.arange(M) + 0.5) * h
            self.knots = np.concatenate([[0.0], edges, [TWO_PI]])
            pieces = np.concatenate([[m[0] / 2.0], m[1:], [m[0] / 2.0]])
            self.cdf_knots = np.concatenate([[0.0], np.cumsum(pieces)])
            total += m.sum()
        self.atoms = np.zeros(0)
        self.atom_weights = np.zeros(0)
        if atoms is not None:
            a = np.mod(np.asarray(atoms, dtype=float), TWO_PI)
            w = np.full(a.size, 1.0 / a.size) if atom_weights is None else np.asarray(atom_weights, float)
            order = np.argsort(a)
            self.atoms, self.atom_weights = a[order], w[order]
            self.atom_cdf = np.concatenate([[0.0], np.cumsum(self.atom_weights)])
            total += w.sum()
        self.total = total

    def breaks(self) -> np.ndarray:
        return np.concatenate([self.knots, self.atoms])

    def cdf(self, x: np.ndarray, right: bool) -> np.ndarray:
        """F(x+) (right=True) or F(x-), normalised to total mass 1."""
        value = np.zeros_like(x)
        if self.knots.size:
            value += np.interp(x, self.knots, self.cdf_knots)
        if self.atoms.size:
            idx = np.searchsorted(self.atoms, x, side="right" if right else "left")
            value += self.atom_cdf[idx]
        return value / self.total


def w1_circle(mu: CircleMeasure, nu: CircleMeasure) -> float:
    """W1 = min_c int_0^{2 pi} |F_mu - F_nu - c| d theta, exact: between consecutive break
    points (cell edges, atoms) D = F_mu - F_nu is linear; c is the median of D under
    d theta (bisection), and the integral of |D - c| over each linear piece is exact."""
    b = np.unique(np.concatenate([[0.0, TWO_PI], mu.breaks(), nu.breaks()]))
    left, right = b[:-1], b[1:]
    length = right - left
    keep = length > 0
    left, right, length = left[keep], right[keep], length[keep]
    u = mu.cdf(left, True) - nu.cdf(left, True)      # D just right of the left end
    v = mu.cdf(right, False) - nu.cdf(right, False)  # D just left of the right end
    lo_v, hi_v = np.minimum(u, v), np.maximum(u, v)

    def measure_below(c: float) -> float:
        span = hi_v - lo_v
        frac = np.where(span > 0, np.clip((c - lo_v) / np.where(span > 0, span, 1.0), 0.0, 1.0),
                        (lo_v <= c).astype(float))
        return float(np.sum(length * frac))

    lo, hi = float(lo_v.min()), float(hi_v.max())
    half = 0.5 * float(length.sum())
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if measure_below(mid) < half:
            lo = mid
        else:
            hi = mid
    c = 0.5 * (lo + hi)
    a, z = u - c, v - c
    same = a * z >= 0
    absolute = np.abs(a) + np.abs(z)
    integral = np.where(same, 0.5 * length * absolute,
                        0.5 * length * (a * a + z * z) / np.where(absolute > 0, absolute, 1.0))
    return float(integral.sum())


def density_measure(density: Density, frame: int) -> CircleMeasure:
    return CircleMeasure(cell_masses=density.weights * density.value[frame])


def particle_measure(particles: Particles, frame: int) -> CircleMeasure:
    return CircleMeasure(atoms=particles.angles(frame))


# ----------------------------------------------------------------------------------------------
# tables and arguments


def write_csv(path: Path, rows: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not rows:
        path.write_text("")
        return path
    fields = list(rows[0].keys())
    for row in rows[1:]:
        for key in row:
            if key not in fields:
                fields.append(key)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def fmt(value, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            return "nan" if np.isnan(value) else str(value)
        return format(float(value), spec)
    return str(value)


def markdown_table(rows: list[dict], columns: list[str] | None = None, spec: str = ".4g") -> str:
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c), spec) for c in columns) + " |")
    return "\n".join(lines)


def standard_parser(name: str, doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny version (about a minute or less)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "data" / "meanfield",
                        help="data folder: runs in OUT_DIR/<name>[_quick]/, the CSV OUT_DIR/<name>[_quick].csv "
                             "(default data/meanfield)")
    parser.add_argument("--figure-dir", type=Path, default=ROOT / "data" / "figures",
                        help="figure folder (default data/figures): meanfield_<name>[_quick].png")
    parser.add_argument("--reuse", action="store_true",
                        help="keep existing complete runs written by the same command line")
    parser.set_defaults(_name=name)
    return parser


def add_options(parser: argparse.ArgumentParser, defaults: dict) -> None:
    """parser.add_argument(option, type=type(default), default=default) for each option: default
    (an int, a float or a string)."""
    for option, default in defaults.items():
        parser.add_argument(option, type=type(default), default=default)


class Paths:
    def __init__(self, args: argparse.Namespace):
        tag = args._name + ("_quick" if args.quick else "")
        self.runs = Path(args.out_dir) / tag
        self.runs.mkdir(parents=True, exist_ok=True)
        self.csv = Path(args.out_dir) / f"{tag}.csv"
        Path(args.figure_dir).mkdir(parents=True, exist_ok=True)
        self.figure = Path(args.figure_dir) / f"meanfield_{tag}.png"


def pyplot():
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def finish(fig, paths: Paths, clock: "Clock", count: int, what: str = "runs", dpi: int = 130) -> None:
    """The end of every script: lays out and saves the figure, then prints
    ``<count> <what> in <clock>; CSV ...; figure ...``."""
    fig.tight_layout()
    fig.savefig(paths.figure, dpi=dpi)
    print(f"\n{count} {what} in {clock}; CSV {paths.csv}; figure {paths.figure}")


class Clock:
    def __init__(self):
        self.start = time.time()

    def __str__(self) -> str:
        return f"{time.time() - self.start:.1f} s"
