"""mfattn.plotting: helpers shared by the plotting scripts (plot_run, plot_sweep, make_figures,
plot_meanfield, plot_reference, examples/phase_diagram.py).

Nothing here draws a whole figure; it loads one replica of an mfattn file with the loader
(mfattn.io.load, frozen prefix tokens included), gives every per-frame observable either as
stored in the file or, when the file lacks it, recomputed from the positions (docs/model.md
section 6), and holds the small pieces every script needs: the recursive file search, the
"which parameters differ between runs" rule, the predicted cluster count k* of the circle,
the phase-diagram style and figure saving. The scripts' error convention is mfattn.cli's.

Recomputation rules (over tokens with presence > 0 of /particles/tokens; prefix tokens are
frozen sources and are left out, like the stored observables of today's writer):

    n_clusters               connected components of the graph <x_i, x_j> > 1 - 1e-4
    clustered_pair_fraction  fraction of pairs i < j with <x_i, x_j> > 1 - 1e-3
    moment_eigenvalues       eigenvalues of (1/n) sum_i x_i x_i^T, in decreasing order
    marginal_spread          1 - largest eigenvalue of that matrix
    min_inner, mean_inner    over pairs i != j

Imported by the scripts, which run under /usr/bin/python3 (Debian's h5py, numpy, scipy,
matplotlib); this module is not a script.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .io import imported_words, load

CLUSTER_DELTA = 1e-4   # delta_c of docs/model.md section 6: cluster graph <x_i, x_j> > 1 - delta_c
PAIR_DELTA = 1e-3      # delta: a pair is "clustered" when <x_i, x_j> > 1 - delta
COLLAPSE_DELTA = 1e-4  # a run has collapsed when its final min_inner >= 1 - COLLAPSE_DELTA
DPI = 110

# /parameters attributes that describe how a run was executed or recorded, not which model
# it integrated: two runs that differ only in these are the same experiment.
BOOKKEEPING = frozenset({
    "out", "overwrite", "resume", "quiet", "threads", "threads_used", "backend", "backend_used",
    "command_line", "config", "config_text", "source_revision", "version", "deflate",
    "fletcher32", "save-velocity", "seed_used", "eps_den_used", "save_every_used",
    "active_tokens", "resumed_from_time", "gradient_flow", "save-positions",
})
# Column order of the parameters that usually define a case; the rest follow alphabetically.
PARAMETER_ORDER = ("kernel", "geometry", "values", "aux-factor", "mask", "n", "d", "beta",
                   "time-scale", "init", "seed", "replicas")


# --- loading ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One replica of one mfattn file.

    positions [P, n, d] hold every stored token (null tokens included) at the frames whose
    positions the file keeps, ``position_times`` [P] (every frame with --save-positions all;
    t = 0 and the last frame with ends; none with none: see ``has_positions`` and
    ``keeps_every_frame``). ``active`` [n] is the presence > 0 mask that observables and
    plots use. ``observables`` maps a name to (times [T_obs], values [T_obs] or [T_obs, c]) as
    stored for this replica. ``prefix`` is None or the loader's frozen prefix tokens
    (/particles/prefix): position [P, d], aux_position [P, k], prompt_id [P], presence [P],
    id [P].
    """

    path: Path
    replica: int
    replicas: int
    times: np.ndarray
    positions: np.ndarray
    labels: dict[str, np.ndarray]
    observables: dict[str, tuple[np.ndarray, np.ndarray]]
    parameters: dict[str, Any]
    status: str
    prefix: dict[str, np.ndarray] | None = None
    position_times: np.ndarray | None = None  # None: the same as times
    save_positions: str = "all"
    _cache: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.position_times is None:
            self.position_times = self.times

    @property
    def has_positions(self) -> bool:
        """False for a file written with --save-positions none (observables only)."""
        return self.positions.shape[0] > 0

    @property
    def keeps_every_frame(self) -> bool:
        """True when there are positions at every frame (trajectories can be drawn and
        observables recomputed)."""
        return self.has_positions and self.positions.shape[0] == self.times.shape[0]

    def no_positions_note(self) -> str:
        return (f"{self.path}: the file has no positions (--save-positions "
                f"{self.save_positions}); only its observables can be used")

    @property
    def stem(self) -> str:
        """File stem, with _r<R> when the file holds several replicas (stable figure names)."""
        return self.path.stem + (f"_r{self.replica}" if self.replicas > 1 else "")

    @property
    def d(self) -> int:
        return int(self.positions.shape[-1])

    @property
    def active(self) -> np.ndarray:
        presence = self.labels.get("presence")
        if presence is None:
            return np.ones(self.positions.shape[1], dtype=bool)
        return np.asarray(presence) > 0

    @property
    def x(self) -> np.ndarray:
        """Active tokens of every frame, [T, m, d]."""
        return self.positions[:, self.active]

    @property
    def final(self) -> np.ndarray:
        """Active tokens of the last frame whose positions are kept, [m, d] (with
        --save-positions ends the last frame itself). ValueError when there is none."""
        if not self.has_positions:
            raise ValueError(self.no_positions_note())
        return self.positions[-1, self.active]

    @property
    def t_final(self) -> float:
        return float(self.times[-1])

    def param(self, name: str, default: Any = None) -> Any:
        return self.parameters.get(name, default)

    def title(self) -> str:
        """One line naming the run: kernel, n, d, beta, t and the non-default extras."""
        p = self.parameters
        if p.get("command") == "import":  # another model's states: no kernel or beta (docs/import.md)
            space = imported_words(str(p.get("state_space", "sphere")))
            return f"{self.stem}: {space} n={int(self.active.sum())} d={self.d} t={self.t_final:g}"
        parts = [str(p.get("kernel", "?")).upper(), f"n={int(self.active.sum())}", f"d={self.d}",
                 f"beta={p.get('beta', float('nan')):g}", f"t={self.t_final:g}"]
        for key, plain in (("geometry", "none"), ("aux-factor", "none"), ("values", "transported"),
                           ("mask", "full")):
            if p.get(key, plain) != plain:
                parts.append(f"{key}={p[key]}")
        if self.replicas > 1:
            parts.append(f"replica {self.replica}")
        return f"{self.stem}: " + " ".join(parts)


def load_runs(path: str | os.PathLike, replica: int | None = None) -> list[Run]:
    """Every replica of ``path`` (replica=None) or just ``replica``, as :class:`Run` objects.

    Raises FileNotFoundError / ValueError (from the loader) with the path in the message for
    a missing or foreign file, ValueError for a replica out of range or a file with no frame.
    """
    path = Path(path)
    if replica is None:
        tr = load(path, replica="all")
        selected = list(range(tr.replicas))
    else:
        tr = load(path, replica=replica)
        selected = [tr.replica]
    if tr.frames == 0:
        raise ValueError(f"{path}: the file holds no frame yet (status {tr.status!r})")
    prefix = tr.prefix if len(tr.prefix.get("position", ())) else None
    runs = []
    for slot, r in enumerate(selected):
        def pick(value: np.ndarray) -> np.ndarray:
            return value[:, slot] if tr.stacked else value
        observables = {name: (tr.observable_times.get(name, tr.times[:len(value)]), pick(value))
                       for name, value in tr.observables.items()}
        runs.append(Run(path=path, replica=r, replicas=tr.replicas, times=tr.times,
                        positions=pick(tr.directions), labels=tr.labels, observables=observables,
                        parameters=tr.parameters, status=tr.status, prefix=prefix,
                        position_times=tr.position_times, save_positions=tr.save_positions))
    return runs


def load_run(path: str | os.PathLike, replica: int = 0) -> Run:
    """One replica of ``path`` (see :func:`load_runs`)."""
    return load_runs(path, replica=replica)[0]


# --- observables -----------------------------------------------------------------------------


def gram(x: np.ndarray) -> np.ndarray:
    """<x_i, x_j> of one frame x [m, d]."""
    return x @ x.T


def pair_values(x: np.ndarray) -> np.ndarray:
    """<x_i, x_j> over pairs i < j of one frame x [m, d]."""
    return gram(x)[np.triu_indices(x.shape[0], k=1)]


def cluster_count(x: np.ndarray, delta: float = CLUSTER_DELTA) -> int:
    """Connected components of the graph with an edge where <x_i, x_j> > 1 - delta."""
    from scipy.sparse.csgraph import connected_components
    if x.shape[0] == 0:
        return 0
    count, _ = connected_components(gram(x) > 1.0 - delta, directed=False)
    return int(count)


def clustered_pair_fraction(x: np.ndarray, delta: float = PAIR_DELTA) -> float:
    """Fraction of pairs i < j with <x_i, x_j> > 1 - delta (NaN with fewer than 2 tokens)."""
    pairs = pair_values(x)
    return float(np.mean(pairs > 1.0 - delta)) if pairs.size else float("nan")


def second_moment(x: np.ndarray) -> np.ndarray:
    """(1/m) sum_i x_i x_i^T of one frame x [m, d]."""
    return x.T @ x / max(x.shape[0], 1)


def moment_eigenvalues(x: np.ndarray) -> np.ndarray:
    """Eigenvalues of the second moment, decreasing."""
    return np.linalg.eigvalsh(second_moment(x))[::-1]


def _min_inner(x: np.ndarray) -> float:
    pairs = pair_values(x)
    return float(pairs.min()) if pairs.size else float("nan")


def _mean_inner(x: np.ndarray) -> float:
    pairs = pair_values(x)
    return float(pairs.mean()) if pairs.size else float("nan")


# Per-frame recomputation of an observable from the active tokens of one frame.
RECOMPUTE: dict[str, Callable[[np.ndarray], Any]] = {
    "n_clusters": cluster_count,
    "clustered_pair_fraction": clustered_pair_fraction,
    "moment_eigenvalues": moment_eigenvalues,
    "marginal_spread": lambda x: 1.0 - moment_eigenvalues(x)[0],
    "min_inner": _min_inner,
    "mean_inner": _mean_inner,
}


def observable(run: Run, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(times, values) of observable ``name``: as stored in the file when it is there,
    otherwise recomputed from the positions of every frame (RECOMPUTE); None when neither
    is possible (e.g. the energy of a file without it, or any observable missing from a file
    without every frame's positions)."""
    if name in run.observables:
        times, values = run.observables[name]
        return np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    if name not in RECOMPUTE or not run.keeps_every_frame:
        return None
    if name not in run._cache:
        x = run.x
        values = np.array([RECOMPUTE[name](x[t]) for t in range(x.shape[0])], dtype=float)
        run._cache[name] = (run.times, values)
    return run._cache[name]


def observable_is_stored(run: Run, name: str) -> bool:
    return name in run.observables


def final_value(run: Run, name: str) -> float:
    """Last value of a scalar observable (stored or recomputed); NaN when unavailable. A
    marginal_spread missing from the file is taken from stored moment_eigenvalues first."""
    if name == "marginal_spread" and name not in run.observables and "moment_eigenvalues" in run.observables:
        return float(1.0 - np.max(run.observables["moment_eigenvalues"][1][-1]))
    series = observable(run, name)
    if series is None or len(series[1]) == 0:
        return float("nan")
    return float(series[1][-1])


# --- positions -------------------------------------------------------------------------------


def uses_positions(run: Run) -> bool:
    """True when the token positions xi enter the model (a geometry, an auxiliary factor or a
    causal / window mask; the per-prompt mask uses prompt ids, not xi) and vary between the
    active tokens: only then is x against xi worth a figure. Files that do not record these
    parameters fall back to "xi varies"."""
    xi = run.labels.get("aux_position")
    if xi is None or xi.size == 0:
        return False
    xi = np.asarray(xi, dtype=float).reshape(xi.shape[0], -1)[run.active]
    if xi.shape[0] < 2 or not np.any(np.ptp(xi, axis=0) > 0):
        return False
    keys = {"geometry": "none", "aux-factor": "none"}
    if not any(k in run.parameters for k in (*keys, "mask")):
        return True
    masks = str(run.parameters.get("mask", "full")).split("+")  # e.g. causal+per-prompt
    return (any(run.parameters.get(k, plain) != plain for k, plain in keys.items())
            or any(m in ("causal", "window") for m in masks))


# --- theory ----------------------------------------------------------------------------------


def predicted_clusters(beta: float, k_max: int = 1000) -> int:
    """k* = argmax_k k^2 I_k(beta): the fastest-growing Fourier mode of the uniform state on
    the circle (linearising dtheta_i/dt = (1/n) sum_j e^{beta cos(theta_j - theta_i)}
    sin(theta_j - theta_i) gives the rate k^2 I_k(beta) / beta for mode k), hence the number
    of clusters of the first metastable plateau. Uses scipy.special.ive = iv * e^{-beta}:
    the same argmax without overflow at large beta."""
    from scipy.special import ive
    if not beta > 0:
        return 1
    k = np.arange(1, k_max + 1)
    return int(k[np.argmax(k.astype(float) ** 2 * ive(k, beta))])


# --- sweeps of files -------------------------------------------------------------------------


def find_h5(folder: str | os.PathLike) -> list[Path]:
    """Every *.h5 under ``folder`` (recursively, into symlinked folders too: runs are often
    linked in from scratch space; a folder reached twice, as through a link cycle, is read
    once), sorted by path. A file reached twice, as through a sweep's by-parameters links to
    its cases, is read once, under the path that is not a link where there is one."""
    found: dict[str, Path] = {}
    seen = set()
    for root, folders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            folders[:] = []
            continue
        seen.add(real)
        for name in files:
            path = Path(root) / name
            if not name.endswith(".h5") or not path.is_file():
                continue
            key = os.path.realpath(path)
            if key not in found or (found[key].is_symlink() and not path.is_symlink()):
                found[key] = path
    return sorted(found.values())


def _comparable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def varied_parameters(parameter_sets: list[dict[str, Any]]) -> list[str]:
    """Names of the model parameters (not BOOKKEEPING) whose value differs between the given
    /parameters dicts (a name missing from some counts as differing), in PARAMETER_ORDER then
    alphabetical order."""
    names = set().union(*parameter_sets) - BOOKKEEPING if parameter_sets else set()
    varied = {name for name in names
              if len({repr(_comparable(p.get(name))) for p in parameter_sets}) > 1}
    ordered = [name for name in PARAMETER_ORDER if name in varied]
    return ordered + sorted(varied - set(ordered))


def format_value(value: Any) -> str:
    """A parameter or outcome as table text: floats with %g, None/NaN as empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:g}"
    if isinstance(value, list):
        return ",".join(format_value(v) for v in value)
    return str(value)


# --- figures ---------------------------------------------------------------------------------


def pyplot():
    """matplotlib.pyplot with the non-interactive Agg backend unless MPLBACKEND says
    otherwise (the scripts run on machines without a display)."""
    import matplotlib
    if "MPLBACKEND" not in os.environ:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Writes ``fig`` to ``path`` (creating its folder), closes it, returns the path."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def time_axis(ax, times: np.ndarray, linear: bool = False) -> np.ndarray:
    """Log-scales ``ax``'s x axis when some time is positive (unless ``linear``: the layers of
    imported states) and returns the mask of the frames that can be drawn on it (t > 0; every
    frame when the axis stays linear)."""
    positive = np.asarray(times) > 0
    if positive.any() and not linear:
        ax.set_xscale("log")
        return positive
    return np.ones(len(times), dtype=bool)


# --- the phase diagram ------------------------------------------------------------------------
# One style for every beta x t phase diagram the project draws (plot_sweep.py, plot_reference.py,
# examples/phase_diagram.py): time across, beta up, the reference code's colour map
# (arXiv:2312.10794 draws its maps with RdBu_r), 0 to 1 for a fraction, a symmetric scale for
# a difference, and both axes spanning exactly the computed values: the first cell starts at
# the smallest beta and the first frame, not half a cell before them.

PHASE_COLOUR_MAP = "RdBu_r"


def _cell_edges(centres: np.ndarray, log: bool = False) -> np.ndarray:
    """Edges of the cells around sorted ``centres`` (midpoints between neighbours, in log
    space when ``log``), the outer edges at the first and last centre themselves."""
    values = np.log(centres) if log else np.asarray(centres, dtype=float)
    if values.size == 1:
        edges = np.array([values[0] - 0.5, values[0] + 0.5])
    else:
        edges = np.r_[values[0], (values[1:] + values[:-1]) / 2, values[-1]]
    return np.exp(edges) if log else edges


def evenly_spaced(values: np.ndarray, log: bool = False) -> bool:
    """True when the sorted ``values`` (at least 3) have equal gaps (equal ratios when
    ``log``), to 1 part in 1000 of the range."""
    values = np.asarray(values, dtype=float)
    if values.size < 3 or (log and values[0] <= 0):
        return values.size == 2 and (not log or values[0] > 0)
    v = np.log(values) if log else values
    gaps = np.diff(v)
    return bool(np.all(np.abs(gaps - gaps.mean()) <= 1e-3 * (v[-1] - v[0])))


def phase_map(ax, betas, times, values, *, log_time: bool = False, difference: bool = False,
              label: str = f"fraction of pairs with <x_i, x_j> > 1 - {PAIR_DELTA:g}"):
    """Draws a beta x t map on ``ax`` in the project's one phase-diagram style and returns
    the mesh (for a colour bar). ``values`` is [len(betas), len(times)]; NaN cells (a run that
    failed numerically) are grey and the title notes it. The beta axis is numeric when the
    betas are evenly spaced (linear) or evenly spaced in log (log axis); otherwise every beta
    gets a row of the same height, labelled with its value (cells sized by uneven gaps would
    hide the small betas). ``log_time`` puts t on a log axis (frames at t > 0 only)."""
    betas = np.asarray(betas, dtype=float)
    times = np.asarray(times, dtype=float)
    values = np.asarray(values, dtype=float)
    if log_time:
        keep = times > 0
        times, values = times[keep], values[:, keep]
        ax.set_xscale("log")
    t_edges = _cell_edges(times, log=log_time)
    if evenly_spaced(betas):
        b_edges, rows = _cell_edges(betas), None
    elif evenly_spaced(betas, log=True):
        b_edges, rows = _cell_edges(betas, log=True), None
        ax.set_yscale("log")
    else:
        b_edges, rows = np.arange(betas.size + 1) - 0.5, np.arange(betas.size)
    masked = np.ma.masked_invalid(values)
    if difference:
        limit = float(np.ma.max(np.abs(masked))) if masked.count() else 0.0
        limit = limit or 1e-16
        low, high = -limit, limit
    else:
        low, high = 0.0, 1.0
    if masked.mask.any():
        ax.set_facecolor("0.7")
        label += "\n(grey: the run failed numerically)"
    mesh = ax.pcolormesh(t_edges, b_edges, masked, cmap=PHASE_COLOUR_MAP, vmin=low, vmax=high,
                         shading="flat", rasterized=True)
    if rows is not None:
        labelled = rows[::max(1, -(-betas.size // 12))]
        ax.set_yticks(labelled)
        ax.set_yticklabels([f"{betas[r]:.4g}" for r in labelled])
    ax.set_xlim(t_edges[0], t_edges[-1])
    ax.set_ylim(b_edges[0], b_edges[-1])
    ax.set_xlabel("t (log scale)" if log_time else "t")
    ax.set_ylabel("beta")
    ax.figure.colorbar(mesh, ax=ax, label=label)
    return mesh
