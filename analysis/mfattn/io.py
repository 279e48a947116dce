"""mfattn.io: the loader of the H5MD 1.1 files that ``mfattn run`` and ``mfattn meanfield`` write.

Pure h5py + numpy (Python >= 3.11); runs under /usr/bin/python3 with Debian's python3-h5py.

Layout read (docs/output.md, "Layout"):

    /h5md                              creator/name = "mfattn"
    /particles/tokens                  replica 0
    /particles/tokens_r<r>             replica r >= 1
        position/{step [T], time [T], value [T, n, d]}
        aux_position [n, k], prompt_id [n], presence [n], id [n]
    /particles/prefix                  frozen prefix tokens, when the run had --prefix:
        position [P, d] (time-independent), aux_position [P, k], prompt_id, presence, id [P]
    /observables/<name>/{step, time, value}
        value [T] (scalar) or [T, c] (vector) for a file with one replica,
        value [T, R] or [T, R, c] for a file with R > 1 replicas
    /parameters                        one attribute per option (plus provenance)
    /run                               status, wall_time_s, steps, rejected_steps

Replica rule (the same for positions and observables):

    replica=None   (default) one replica in the file -> no replica axis:
                       positions [T, n, d], observables [T] / [T, c];
                   R > 1 replicas -> replica axis 1, in replica order 0..R-1:
                       positions [T, R, n, d], observables [T, R] / [T, R, c].
    replica="all"  always a replica axis, also when R = 1 (positions [T, R, n, d],
                   observables [T, R] / [T, R, c]): for scripts that treat every file alike.
    replica=r      (int, 0 <= r < R; negative counts from the end) that replica only,
                   no replica axis: positions [T, n, d], observables [T] / [T, c].

``export_torch(module, path)`` writes the weights file of ``mfattn run --weights`` from a PyTorch
layer (see its docstring; ``analysis/export_torch.py`` (mfattn.export_torch_cli) is its command
line).

``Trajectory.stacked`` tells which case a result is in. Labels (aux_position, prompt_id,
presence, id) describe the tokens, which all replicas share: they are taken from the selected
replica's group (replica 0 when stacked), and a stacked load checks that every replica group
holds the same labels.

``n`` is the number of stored tokens (the second-to-last axis of positions), null tokens
included; ``parameters["n"]`` is the option as given and ``parameters.get("active_tokens")``
what the writer counted as active.

A run that was killed leaves every flushed frame readable: if position/value, step and time
differ in length, the loader keeps their common leading frames (for a complete file they agree
and nothing is cut). Use :func:`is_complete` to tell finished files from interrupted ones.

Files written with ``--save-positions ends`` or ``none`` (docs/output.md) keep positions of
only some frames: ``times`` / ``steps`` are then every frame's (the frame clock in
/observables/<name>/{step, time}, which every observable shares), observables have a row per
frame as always, and ``positions`` has a row per *kept* frame, at ``position_times``: the first
(t = 0) and the last frame for ``ends`` (one more per resumed part that reached a longer
horizon), none for ``none`` (shape [0, n, d]). ``save_positions`` says which; with ``all``
(every older file) ``position_times`` equals ``times``. The last frame's full state of such a
file is in /run/checkpoint (for ``--resume``), which the loader does not read.

Example (``mfattn.load`` is this module's ``load``)::

    from mfattn import load
    tr = load("run.h5")
    x = tr.positions                  # [T, n, d] (one replica)
    tr.observables["min_inner"]       # [T]
    tr.parameters["beta"], tr.run["status"]

Density files (``mfattn meanfield``, docs/output.md) have /fields/density and no /particles;
``load`` returns a :class:`Density` for them (``replica`` must then be None):

    /fields/density/value      [T, M] circle (d = 2), [T, M_xi, M] circle with labels,
                               [T, n_theta, n_phi] sphere (d = 3), [T, M_xi, n_theta, n_phi]
                               sphere with labels, [T, n_theta] zonal
    /fields/density/{time, step} [T]
    /fields/density/theta      cell centres 2 pi a / M (circle); polar cell centres from e_1
                               (zonal); Gauss-Legendre polar nodes from e_3 (sphere)
    /fields/density/phi        [n_phi] (sphere only); /fields/density/labels [M_xi] (labels only)
    /fields/density/weights    the grid's shape: sum weights * value = 1 (per label row)
    /observables/<name>/value  [T] (mode_amplitudes [T, 16]: A_1 .. A_16); no step or time
                               of their own: they share the density's frames

Circle values are densities w.r.t. d theta; zonal values w.r.t. the normalized surface measure
(uniform = 1); sphere values w.r.t. the surface measure (uniform = 1 / (4 pi)). Example::

    rho = load("density.h5")           # a Density
    rho.kind, rho.values.shape         # "circle", (T, M)
    rho.marginal(-1), rho.mass(0)      # the last frame's theta-profile, the first's mass
    rho.observables["mode_amplitudes"][:, 0]   # A_1(t)
"""
from __future__ import annotations

import os
import stat
import re
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

__all__ = ["Trajectory", "Density", "load", "replicas", "is_complete", "is_density", "LABELS"]

LABELS = ("aux_position", "prompt_id", "presence", "id")
_REPLICA_GROUP = re.compile(r"^tokens(?:_r([1-9][0-9]*))?$")


class _Recorded:
    """What a run's file and a density file share: the frame clock `times` and the /run group."""

    times: np.ndarray
    run: dict[str, Any]

    @property
    def frames(self) -> int:
        """Number of frames T."""
        return int(self.times.shape[0])

    @property
    def status(self) -> str:
        """/run status ("running", "complete", "failed: <reason>", "interrupted: ...")."""
        return str(self.run.get("status", ""))

    @property
    def complete(self) -> bool:
        """True when the run or solve finished (/run status == "complete")."""
        return self.status == "complete"

    def animate(self, out: str | os.PathLike, **options: Any):
        """Writes an animation of this file to `out` (.mp4 or .gif) and returns its path:
        mfattn.animate's animate(path, out, replica, fps, frames, trail, view, poster), from the
        file this object was read from (replica: the one loaded, else 0). Raises ValueError
        (mfattn.animate.AnimationError) for bad input, as the script's exit 2."""
        if getattr(self, "path", None) is None:
            raise ValueError("animate: nothing was read from a file here (mfattn.run and mfattn.meanfield keep "
                             "their file when given out=)")
        replica = getattr(self, "replica", None)
        if replica is not None:
            options.setdefault("replica", replica)
        # Imported here: mfattn.animate imports this module (matplotlib is loaded only to draw).
        from . import animate as animation
        return animation.animate(self.path, out, **options)


def imported_words(state_space: str) -> str:
    """What titles call states imported from another model (docs/import.md): their directions
    when the rows were not unit vectors."""
    return "directions of imported states" if state_space == "euclidean" else "imported states"


@dataclass
class Trajectory(_Recorded):
    """Contents of one mfattn file (see the module docstring for the replica rule).

    Attributes:
        path: the file that was read.
        positions: float64 [P, n, d], or [P, R, n, d] when ``stacked``: the frames whose
            positions the file keeps (P = T with save_positions "all").
        times: float64 [T], the frame times (the frame clock).
        steps: int64 [T], the integrator step of every frame.
        position_times: float64 [P], the times of the rows of ``positions``.
        position_steps: int64 [P].
        save_positions: "all", "ends" or "none" (see the module docstring).
        labels: ``aux_position`` [n, k], ``prompt_id`` [n], ``presence`` [n], ``id`` [n].
        observables: name -> value array; replica axis as for positions
            ([T] or [T, c] per replica; [T, R] or [T, R, c] when ``stacked``).
        observable_times: name -> float64 [T_obs], the times of that observable's rows.
        observable_steps: name -> int64 [T_obs].
        parameters: /parameters attributes as Python values (str decoded, numpy scalars as
            int/float/bool, arrays as lists).
        run: /run attributes (status, wall_time_s, steps, rejected_steps), same conversion.
        n: tokens stored per replica (null tokens included).
        d: ambient dimension.
        replicas: R, the number of replicas in the file.
        replica: the replica loaded (int), or None when ``stacked``.
        stacked: True when arrays carry a replica axis (axis 1).
        creator_version: /h5md/creator version attribute ("" if absent).
        prefix: the frozen prefix tokens: ``position`` [P, d], ``aux_position`` [P, k],
            ``prompt_id`` [P], ``presence`` [P], ``id`` [P]; empty when the run had none.
    """

    path: str
    positions: np.ndarray
    times: np.ndarray
    steps: np.ndarray
    labels: dict[str, np.ndarray]
    observables: dict[str, np.ndarray]
    observable_times: dict[str, np.ndarray]
    observable_steps: dict[str, np.ndarray]
    parameters: dict[str, Any]
    run: dict[str, Any]
    n: int
    d: int
    replicas: int
    replica: int | None
    stacked: bool
    creator_version: str = ""
    prefix: dict[str, np.ndarray] = field(default_factory=dict)
    position_times: np.ndarray | None = None
    position_steps: np.ndarray | None = None
    save_positions: str = "all"

    @property
    def position_frames(self) -> int:
        """Number of frames P whose positions the file keeps."""
        return int(self.positions.shape[0])

    @property
    def state_space(self) -> str:
        """"sphere" (every run of mfattn: unit rows) or "euclidean": states imported from another
        model (``mfattn import``, :func:`write`) whose rows are not unit vectors, stored as given;
        drawn and analysed on their directions (:attr:`directions`)."""
        return str(self.parameters.get("state_space", "sphere"))

    @property
    def model_words(self) -> str:
        """How titles name what made the file: "SA, ... beta = 4" for a run (kernel, then beta
        last), or, for states imported from another model, what they are."""
        p = self.parameters
        if p.get("command") == "import":
            return imported_words(self.state_space)
        return str(p.get("kernel", "?")).upper()

    @property
    def directions(self) -> np.ndarray:
        """The positions as points of the sphere: the rows x / |x| of a "euclidean" file (a zero
        row stays zero), the positions themselves on the sphere."""
        x = np.asarray(self.positions)
        if self.state_space == "sphere":
            return x
        # Scaled by each row's largest entry first, as the writer takes the norms: rows of
        # 1e-200 or 1e200 keep their directions.
        scale = np.abs(x).max(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            scaled = np.where(scale > 0, x / np.where(scale > 0, scale, 1.0), 0.0)
            norms = np.linalg.norm(scaled, axis=-1, keepdims=True)
            return np.where(norms > 0, scaled / np.where(norms > 0, norms, 1.0), 0.0)

    def matrices(self, replica: int | None = None) -> dict[str, np.ndarray]:
        """The weights in force, read from the file: ``/particles/tokens[_r<r>]/attention_matrices``
        (docs/output.md), name -> array ("query", "key", "value" [L, d, d], "layer_start" [L], and
        for a whole layer its per-head and mlp arrays). replica: whose group (default: the one
        loaded, else 0); a file with one shared set keeps it in replica 0's group, which every
        replica then reads. Raises ValueError for a result with no file (mfattn.run without out=:
        Model.weights() gives the same numbers) or a file without the group."""
        if self.path is None:
            raise ValueError("matrices: this result was not read from a file (give mfattn.run out=, or take "
                             "mfattn.Model(...).weights())")
        if replica is None:
            replica = self.replica if self.replica is not None else 0
        if not 0 <= replica < self.replicas:
            raise ValueError(f"matrices: replica {replica}: the file holds {self.replicas} (accepted: 0 to "
                             f"{self.replicas - 1})")
        with h5py.File(self.path, "r") as f:
            own = "particles/tokens" + ("" if replica == 0 else f"_r{replica}") + "/attention_matrices"
            group = f.get(own) or f.get("particles/tokens/attention_matrices")
            if not isinstance(group, h5py.Group):
                raise ValueError(f"matrices: {self.path} has no /particles/tokens/attention_matrices group "
                                 "(a file of mfattn import, or one written before the group existed)")
            return {name: np.asarray(value[()]) for name, value in group.items() if isinstance(value, h5py.Dataset)}


@dataclass
class Density(_Recorded):
    """Contents of one density file (``mfattn meanfield``; layout in the module docstring).

    Attributes:
        path: the file that was read (None for mfattn.meanfield's temporary file).
        times: float64 [T], the frame times.
        steps: int64 [T], the solver step of every frame.
        values: float64 [T, *shape], the density at every frame (shape: [M] circle,
            [M_xi, M] circle with labels, [n_theta, n_phi] sphere, [M_xi, n_theta, n_phi]
            sphere with labels, [n_theta] zonal).
        theta: float64, the polar grid (circle: cell centres 2 pi a / M; zonal: polar cell
            centres, angle from e_1; sphere: Gauss-Legendre nodes, angle from e_3).
        phi: float64 [n_phi] (sphere), else None.
        labels: float64 [M_xi], the label nodes xi_c = 2 pi c / M_xi, else None.
        weights: float64 [*shape], the quadrature weights (sum weights * value = 1, per label
            row with labels).
        kind: "circle", "sphere" or "zonal".
        observables: name -> value array, [T] or [T, 16] (mode_amplitudes: A_1 .. A_16).
        parameters: /parameters attributes (every option; "command" is "meanfield").
        run: /run attributes (status, wall_time_s, steps, rejected_steps).
        d: the ambient dimension (parameters["d"]).
        creator_version: /h5md/creator version attribute ("" if absent).
    """

    path: str | None
    times: np.ndarray
    steps: np.ndarray
    values: np.ndarray
    theta: np.ndarray
    phi: np.ndarray | None
    labels: np.ndarray | None
    weights: np.ndarray
    kind: str
    observables: dict[str, np.ndarray]
    parameters: dict[str, Any]
    run: dict[str, Any]
    d: int
    creator_version: str = ""

    def _frame_values(self, frame: int | None) -> np.ndarray:
        return self.values if frame is None else self.values[frame]

    def cell_masses(self, frame: int | None = None) -> np.ndarray:
        """weights * value: the mass of every grid cell (quadrature point), summing to 1 (with
        labels each label row carries 1 / M_xi). [*shape] for one frame, [T, *shape] for
        frame=None."""
        masses = self.weights * self._frame_values(frame)
        return masses / len(self.labels) if self.labels is not None else masses

    def mass(self, frame: int | None = None) -> float | np.ndarray:
        """sum weights * value (the mean over label rows with labels): 1 up to the solver's
        rounding. A float for one frame, [T] for frame=None."""
        masses = self.cell_masses(frame)
        axes = tuple(range(masses.ndim - (len(self.weights.shape)), masses.ndim))
        total = masses.sum(axis=axes)
        return float(total) if frame is not None else total

    @property
    def polar_weights(self) -> np.ndarray:
        """[n_theta]: the weight of each polar cell (circle: 2 pi / M; zonal: the normalized
        measure of the cell; sphere: the ring's surface area)."""
        weights = self.weights[0] if self.labels is not None else self.weights
        return weights.sum(axis=1) if self.kind == "sphere" else weights

    @property
    def polar_edges(self) -> np.ndarray:
        """[n_theta + 1]: the edges of the polar cells, increasing. Circle: theta_a -+ pi / M
        (from -pi / M); zonal: theta_a -+ half the cell; sphere: the rings whose areas are the
        Gauss-Legendre weights (arccos of 1 - cumulative weights, which interlace the nodes)."""
        n = len(self.theta)
        if self.kind == "sphere":
            mu = 1.0 - np.concatenate([[0.0], np.cumsum(self.polar_weights)]) / (2.0 * np.pi)
            mu[0], mu[-1] = 1.0, -1.0
            return np.arccos(np.clip(mu, -1.0, 1.0))
        if self.kind == "circle":
            h = 2.0 * np.pi / n
            return (np.arange(n + 1) - 0.5) * h
        h = np.pi / n
        return np.arange(n + 1) * h

    def marginal(self, frame: int | None = None) -> np.ndarray:
        """The density as a function of the polar angle theta alone: circle the theta-marginal
        w.r.t. d theta (with labels the mean of the conditional rows, each label node carrying
        mass 1 / M_xi); zonal the values themselves; sphere the average over phi (the zonal
        part, w.r.t. the surface measure; with labels of the mean of the label rows). [n_theta]
        for one frame, [T, n_theta] for None."""
        values = self._frame_values(frame)
        if self.kind == "circle" and self.labels is not None:
            return values.mean(axis=-2)
        if self.kind == "sphere":
            if self.labels is not None:
                values = values.mean(axis=-3)
            weights = self.weights[0] if self.labels is not None else self.weights
            return (values * weights).sum(axis=-1) / self.polar_weights
        return np.array(values)

    def polar_angle(self, x: np.ndarray) -> np.ndarray:
        """The angle that :meth:`marginal` is a function of, for unit vectors x [..., d]:
        circle atan2(x_2, x_1) in [0, 2 pi); zonal arccos(x_1); sphere arccos(x_3)."""
        x = np.asarray(x, dtype=float)
        if self.kind == "circle":
            return np.mod(np.arctan2(x[..., 1], x[..., 0]), 2.0 * np.pi)
        axis = 0 if self.kind == "zonal" else 2
        return np.arccos(np.clip(x[..., axis], -1.0, 1.0))

    def histogram(self, x: np.ndarray) -> np.ndarray:
        """The empirical measure of points x [n, d] on the polar cells, in the units of
        :meth:`marginal` (the fraction of points in a cell over :attr:`polar_weights`)."""
        angle = self.polar_angle(np.asarray(x).reshape(-1, np.shape(x)[-1]))
        n = len(self.theta)
        if self.kind == "circle":
            cell = np.floor(angle / (2.0 * np.pi / n) + 0.5).astype(np.int64) % n
        else:
            cell = np.clip(np.searchsorted(self.polar_edges, angle, side="right") - 1, 0, n - 1)
        counts = np.bincount(cell, minlength=n).astype(float)
        return counts / max(len(angle), 1) / self.polar_weights


def _python_value(value: Any) -> Any:
    """HDF5 attribute value -> plain Python: bytes/np.str_ -> str, numpy scalar -> int/float/
    bool, arrays -> lists of such values (0-d arrays -> scalars)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return _python_value(value[()])
        return [_python_value(v) for v in value.tolist()] if value.dtype.kind in "OSU" \
            else value.tolist()
    if isinstance(value, np.generic):
        return _python_value(value.item())
    if isinstance(value, list):
        return [_python_value(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def _attrs(obj: h5py.HLObject) -> dict[str, Any]:
    return {key: _python_value(obj.attrs[key]) for key in obj.attrs}


def _open(path: str | os.PathLike) -> h5py.File:
    """Opens ``path`` read-only. FileNotFoundError if it does not exist, PermissionError if it
    cannot be read, ValueError (with the reason) if it is not an HDF5 file that HDF5 can open."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{path}: not an mfattn H5MD file (a directory)")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"{path}: cannot be read (permission denied)")
    if not stat.S_ISREG(os.stat(path).st_mode):
        # HDF5 would open a FIFO by name and wait on it for ever.
        raise ValueError(f"{path}: not an mfattn H5MD file (not a regular file)")
    if not h5py.is_hdf5(path):
        raise ValueError(f"{path}: not an mfattn H5MD file (not an HDF5 file)")
    # No file locking: a running mfattn holds its lock for the whole run, and every frame it
    # has flushed is readable. HDF5 refuses a second open of a file that this process already
    # holds with other locking flags (a caller's own h5py.File): then use the default flags.
    try:
        try:
            f = h5py.File(path, "r", locking=False)
        except OSError as error:
            if "locking" not in str(error):
                raise
            f = h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"{path}: not a readable mfattn H5MD file (HDF5 finds its signature but "
                         f"cannot open it, truncated or damaged?: {error})") from error
    outside = _reach_outside(f)
    if outside:
        f.close()
        raise ValueError(f"{path}: {outside}; mfattn reads no data outside the file it is given")
    return f


def _reach_outside(f: h5py.File) -> str:
    """The first external or user-defined link in ``f`` ("" when there is none): HDF5 would
    open its target, another file (a FIFO: a read would wait for ever). The command line
    refuses the same (docs/failure-model.md, "Files that reach outside themselves"); datasets
    whose data lies in other files are refused where they are read (_read)."""
    found: list[str] = []

    def link(name: bytes, info) -> int | None:
        if info.type not in (h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT):
            found.append(f"/{name.decode(errors='replace')} is an external link (to another file)")
            return 1
        return None

    f.id.links.visit(link, info=True)
    return found[0] if found else ""


def _read(dataset: h5py.Dataset, selection: Any = ()) -> Any:
    """``dataset[selection]``, refusing (ValueError) a virtual dataset (its sources are other
    files; a missing one reads as the fill value) or one stored in external files."""
    if dataset.is_virtual or dataset.external:
        kind = "is a virtual dataset (its data lies in other files)" if dataset.is_virtual else \
            "stores its data in external files"
        raise ValueError(f"{dataset.file.filename}: {dataset.name} {kind}; mfattn reads no data outside the "
                         "file it is given")
    return dataset[selection]


def _replica_groups(f: h5py.File, path: str) -> list[str]:
    """Checks that ``f`` is an mfattn H5MD file and returns its particle group names in
    replica order (tokens, tokens_r1, ...). Raises ValueError otherwise."""
    def reject(why: str) -> ValueError:
        return ValueError(f"{path}: not an mfattn H5MD file ({why})")

    if "h5md" not in f or not isinstance(f["h5md"], h5py.Group):
        raise reject("no /h5md group")
    creator = f["h5md"].get("creator")
    name = _python_value(creator.attrs.get("name")) if isinstance(creator, h5py.Group) else None
    if name != "mfattn":
        raise reject(f"/h5md/creator name is {name!r}, not 'mfattn'")
    if "particles" not in f or not isinstance(f["particles"], h5py.Group):
        raise reject("no /particles group")
    found: dict[int, str] = {}
    for key in f["particles"]:
        match = _REPLICA_GROUP.match(key)
        if match:
            found[int(match.group(1) or 0)] = key
    if 0 not in found:
        raise reject("no /particles/tokens group")
    count = len(found)
    if sorted(found) != list(range(count)):
        raise reject(f"replica groups are not numbered 0..{count - 1}: {sorted(found.values())}")
    groups = [found[r] for r in range(count)]
    for key in groups:
        position = f["particles"][key].get("position")
        for name in ("value", "step", "time"):
            if not isinstance(position, h5py.Group) or not isinstance(position.get(name), h5py.Dataset):
                raise reject(f"no /particles/{key}/position/{name} dataset")
        shapes = tuple(position[name].shape for name in ("value", "step", "time"))
        if len(shapes[0]) != 3 or len(shapes[1]) != 1 or len(shapes[2]) != 1:
            raise reject(f"/particles/{key}/position/{{value, step, time}} have shapes "
                         f"{shapes[0]}, {shapes[1]}, {shapes[2]}, expected [T, n, d], [T], [T]")
    return groups


def _frame_clock(f: h5py.File, path: str) -> h5py.Group | None:
    """The group holding every frame's step and time of a file that keeps the positions of
    only some frames (it has /run/checkpoint): the first observable in name order (all of
    them hard-link the same two datasets). None for a file that keeps every frame's
    positions, whose position element is its clock. ValueError when the clock is missing."""
    run = f.get("run")
    if not isinstance(run, h5py.Group) or "checkpoint" not in run:
        return None
    observables = f.get("observables")
    for name in sorted(observables) if isinstance(observables, h5py.Group) else ():
        group = observables[name]
        if isinstance(group, h5py.Group) and isinstance(group.get("time"), h5py.Dataset) \
                and isinstance(group.get("step"), h5py.Dataset):
            return group
    raise ValueError(f"{path}: not an mfattn H5MD file (it has /run/checkpoint but no "
                     "observable with step and time)")


def replicas(path: str | os.PathLike) -> int:
    """Number of replicas R stored in an mfattn file (particle groups tokens, tokens_r1, ...)."""
    with _open(path) as f:
        return len(_replica_groups(f, os.fspath(path)))


def is_complete(path: str | os.PathLike) -> bool:
    """True when the file is an mfattn file whose /run status is "complete" (False while it
    runs, after a failure, or when the run was killed); a density file's likewise. ValueError
    for a foreign file."""
    with _open(path) as f:
        if not _is_density(f):
            _replica_groups(f, os.fspath(path))
        run = f.get("run")
        if not isinstance(run, h5py.Group) or "status" not in run.attrs:
            return False
        return _python_value(run.attrs["status"]) == "complete"


def is_density(path: str | os.PathLike) -> bool:
    """True when ``path`` is a density file (``mfattn meanfield``): an mfattn file with
    /fields/density and no /particles."""
    with _open(path) as f:
        return _is_density(f)


def _is_density(f: h5py.File) -> bool:
    return isinstance(f.get("fields/density"), h5py.Group) and "particles" not in f


def _load_density(f: h5py.File, path: str) -> Density:
    """Reads a density file (see :class:`Density`). ValueError when its datasets are missing
    or of the wrong shapes."""
    def reject(why: str) -> ValueError:
        return ValueError(f"{path}: not an mfattn density file ({why})")

    creator = f["h5md"].get("creator") if isinstance(f.get("h5md"), h5py.Group) else None
    name = _python_value(creator.attrs.get("name")) if isinstance(creator, h5py.Group) else None
    if name != "mfattn":
        raise reject(f"/h5md/creator name is {name!r}, not 'mfattn'")
    group = f["fields/density"]
    for key in ("value", "time", "step", "theta", "weights"):
        if not isinstance(group.get(key), h5py.Dataset):
            raise reject(f"no /fields/density/{key} dataset")
    value = group["value"]
    shape = tuple(group["weights"].shape)
    if value.ndim != 1 + len(shape) or tuple(value.shape[1:]) != shape:
        raise reject(f"/fields/density/value has shape {value.shape}, weights {shape}: expected "
                     "[T, *weights.shape]")
    T = min(value.shape[0], group["time"].shape[0], group["step"].shape[0])
    parameters = _attrs(f["parameters"]) if isinstance(f.get("parameters"), h5py.Group) else {}
    phi = np.asarray(_read(group["phi"])) if "phi" in group else None
    labels = np.asarray(_read(group["labels"])) if "labels" in group else None
    kind = "sphere" if phi is not None else "zonal" if parameters.get("zonal") else "circle"
    theta = np.asarray(_read(group["theta"]))
    grid = {"sphere": (len(theta), 0 if phi is None else len(phi)), "zonal": (len(theta),),
            "circle": (len(theta),)}[kind]
    expected = grid if labels is None else (len(labels), *grid)
    if shape != expected:
        raise reject(f"/fields/density/weights has shape {shape}; a {kind} grid of these theta"
                     f"{', phi' if phi is not None else ''}{', labels' if labels is not None else ''}"
                     f" has {expected}")
    observables: dict[str, np.ndarray] = {}
    obs_root = f.get("observables")
    if isinstance(obs_root, h5py.Group):
        for key in obs_root:
            item = obs_root[key]
            if isinstance(item, h5py.Group) and isinstance(item.get("value"), h5py.Dataset):
                observables[key] = np.asarray(_read(item["value"], np.s_[:T]))
    run = _attrs(f["run"]) if isinstance(f.get("run"), h5py.Group) else {}
    d = parameters.get("d", 3 if kind == "sphere" else 2)
    return Density(
        path=path,
        times=np.asarray(_read(group["time"], np.s_[:T])),
        steps=np.asarray(_read(group["step"], np.s_[:T])),
        values=np.asarray(_read(value, np.s_[:T])),
        theta=theta,
        phi=phi,
        labels=labels,
        weights=np.asarray(_read(group["weights"])),
        kind=kind,
        observables=observables,
        parameters=parameters,
        run=run,
        d=int(d),
        creator_version=str(_python_value(creator.attrs.get("version", ""))),
    )


def load(path: str | os.PathLike, replica: int | str | None = None) -> Trajectory | Density:
    """Reads an mfattn H5MD file.

    Args:
        path: the .h5 file written by ``mfattn run`` (or ``mfattn meanfield``).
        replica: None (default: replica axis only when the file holds R > 1 replicas),
            "all" (always a replica axis), or an int selecting one replica (no replica axis).
            See the module docstring for the shapes. A density file takes None only.

    Returns:
        A :class:`Trajectory`, or a :class:`Density` for a density file (/fields/density and
        no /particles).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        PermissionError: ``path`` cannot be read.
        ValueError: ``path`` is not an mfattn H5MD file (a directory, not HDF5, an HDF5 file
            that cannot be opened, no mfattn creator, position datasets missing or of the wrong
            shape; the message says which), ``replica`` is out of range, or the replica groups
            of a stacked load disagree in shape or labels.
        OSError: reading a dataset of an mfattn file failed.
    """
    spath = os.fspath(path)
    with _open(spath) as f:
        if _is_density(f):
            if replica is not None:
                raise ValueError(f"{spath}: a density file has no replicas (replica must be None, "
                                 f"not {replica!r})")
            return _load_density(f, spath)
        groups = _replica_groups(f, spath)
        R = len(groups)
        if replica is None:
            stacked = R > 1
            selected = list(range(R)) if stacked else [0]
        elif isinstance(replica, str):
            if replica != "all":
                raise ValueError(f"replica must be None, 'all' or an int, not {replica!r}")
            stacked = True
            selected = list(range(R))
        elif isinstance(replica, (int, np.integer)) and not isinstance(replica, bool):
            r = int(replica)
            if not -R <= r < R:
                raise ValueError(f"{spath}: replica {r} out of range (the file holds {R})")
            stacked = False
            selected = [r % R]
        else:
            raise ValueError(f"replica must be None, 'all' or an int, not {replica!r}")

        particles = f["particles"]
        first = particles[groups[selected[0]]]
        value0 = first["position/value"]
        if value0.ndim != 3:
            raise ValueError(f"{spath}: position/value has shape {value0.shape}, expected [T, n, d]")
        _, n, d = value0.shape
        lengths = []
        for r in selected:
            pos = particles[groups[r]]["position"]
            if pos["value"].shape[1:] != (n, d):
                raise ValueError(f"{spath}: replica {r} has position shape {pos['value'].shape},"
                                 f" replica {selected[0]} has [T, {n}, {d}]")
            lengths += [pos["value"].shape[0], pos["step"].shape[0], pos["time"].shape[0]]
        P = min(lengths)

        pos0 = first["position"]
        position_times = np.asarray(_read(pos0["time"], np.s_[:P]))
        position_steps = np.asarray(_read(pos0["step"], np.s_[:P]))
        clock = _frame_clock(f, spath)
        if clock is None:  # every frame's positions: the position element is the clock
            times, steps = position_times, position_steps
        else:
            T = min(clock["time"].shape[0], clock["step"].shape[0])
            times, steps = np.asarray(_read(clock["time"], np.s_[:T])), np.asarray(_read(clock["step"], np.s_[:T]))
        if stacked:
            positions = np.empty((P, len(selected), n, d), dtype=value0.dtype)
            for slot, r in enumerate(selected):
                positions[:, slot] = _read(particles[groups[r]]["position/value"], np.s_[:P])
        else:
            positions = np.asarray(_read(value0, np.s_[:P]))

        labels = {name: np.asarray(_read(first[name])) for name in LABELS if name in first}
        if stacked:
            for r in selected[1:]:
                group = particles[groups[r]]
                for name, ref in labels.items():
                    if name not in group or not np.array_equal(_read(group[name]), ref):
                        raise ValueError(f"{spath}: label {name} of replica {r} differs from "
                                         f"replica {selected[0]}")

        observables: dict[str, np.ndarray] = {}
        observable_times: dict[str, np.ndarray] = {}
        observable_steps: dict[str, np.ndarray] = {}
        obs_root = f.get("observables")
        if isinstance(obs_root, h5py.Group):
            for name in obs_root:
                group = obs_root[name]
                if not isinstance(group, h5py.Group) or "value" not in group:
                    continue
                value = np.asarray(_read(group["value"]))
                if R > 1:
                    if value.ndim < 2 or value.shape[1] != R:
                        raise ValueError(f"{spath}: observable {name} has shape {value.shape}, "
                                         f"expected [T, {R}, ...] for {R} replicas")
                    value = value[:, selected] if stacked else value[:, selected[0]]
                elif stacked:
                    value = value[:, np.newaxis]
                observables[name] = value
                if "time" in group:
                    observable_times[name] = np.asarray(_read(group["time"]))
                if "step" in group:
                    observable_steps[name] = np.asarray(_read(group["step"]))

        parameters = _attrs(f["parameters"]) if isinstance(f.get("parameters"), h5py.Group) else {}
        save_positions = str(parameters.get("save-positions", "all" if clock is None else
                                            "ends" if P else "none"))
        run = _attrs(f["run"]) if isinstance(f.get("run"), h5py.Group) else {}
        creator_version = _python_value(f["h5md/creator"].attrs.get("version", ""))
        prefix_group = particles.get("prefix")
        prefix = {}
        if isinstance(prefix_group, h5py.Group):
            prefix = {name: np.asarray(_read(prefix_group[name]))
                      for name in ("position",) + LABELS if name in prefix_group}

    return Trajectory(
        path=spath,
        positions=positions,
        times=times,
        steps=steps,
        labels=labels,
        observables=observables,
        observable_times=observable_times,
        observable_steps=observable_steps,
        parameters=parameters,
        run=run,
        n=int(n),
        d=int(d),
        replicas=R,
        replica=None if stacked else selected[0],
        stacked=stacked,
        creator_version=str(creator_version),
        prefix=prefix,
        position_times=position_times,
        position_steps=position_steps,
        save_positions=save_positions,
    )


# ---------------------------------------------------------------------------------------------
# Weights files for `mfattn run --weights` (docs/model.md, section 2b), from PyTorch layers.

def _torch_activation(function: Any) -> str:
    """relu, gelu (erf form) or tanh for a TransformerEncoderLayer's activation; anything else
    (leaky relu, ReLU6, the tanh form of gelu, ...) is refused."""
    import torch
    import torch.nn.functional as F

    if function is F.relu or type(function) is torch.nn.ReLU:
        return "relu"
    if function is torch.tanh or function is F.tanh or type(function) is torch.nn.Tanh:
        return "tanh"
    if function is F.gelu or (type(function) is torch.nn.GELU and getattr(function, "approximate", "none") == "none"):
        return "gelu"
    raise ValueError(f"export_torch: activation {function!r} is not relu, gelu (erf form) or tanh")


def weights_file_layers(path: str | os.PathLike) -> int:
    """The layers of a weights file: its datasets' leading axis, or 1."""
    with h5py.File(path, "r") as f:
        if "attention/query" in f:
            return f["attention/query"].shape[0] if f["attention/query"].ndim == 4 else 1
        return f["mlp/b1"].shape[0] if f["mlp/b1"].ndim == 2 else 1


def _torch_layer_weights(layer: Any) -> dict[str, Any]:
    """The arrays of one nn.MultiheadAttention or nn.TransformerEncoderLayer (float64 NumPy)."""
    import numpy as np
    import torch

    mlp = None
    attention = layer
    if isinstance(layer, torch.nn.TransformerEncoderLayer):
        attention = layer.self_attn
        mlp = {"w1": layer.linear1.weight, "b1": layer.linear1.bias, "w2": layer.linear2.weight,
               "b2": layer.linear2.bias, "activation": _torch_activation(layer.activation)}
    if not isinstance(attention, torch.nn.MultiheadAttention):
        raise ValueError("export_torch: takes a torch.nn.MultiheadAttention or a torch.nn.TransformerEncoderLayer "
                         f"(or a list of them), not {type(layer).__name__}")
    if getattr(attention, "add_zero_attn", False):
        raise ValueError("export_torch: add_zero_attn adds a zero key to every softmax; mfattn's heads have none")
    if not attention._qkv_same_embed_dim:
        raise ValueError("export_torch: kdim and vdim must equal embed_dim (tokens attend to themselves)")
    if getattr(attention, "bias_k", None) is not None or getattr(attention, "bias_v", None) is not None:
        raise ValueError("export_torch: add_bias_kv appends a key and a value to every softmax (a zero key still "
                         "weighs e^0); mfattn's heads have none")
    for name in ("in_proj_bias",):
        bias = getattr(attention, name, None)
        if bias is not None and bool(torch.any(bias != 0)):
            raise ValueError(f"export_torch: the attention's {name} is not zero; mfattn's heads take no "
                             "attention bias (build the layer with bias=False, or zero it)")
    if attention.out_proj.bias is not None and bool(torch.any(attention.out_proj.bias != 0)):
        raise ValueError("export_torch: the attention's out_proj.bias is not zero; mfattn's heads take no "
                         "attention bias (build the layer with bias=False, or zero it)")

    def array(tensor: Any, size: int = 0) -> Any:
        if tensor is None:  # a layer built with bias=False: a zero bias
            return np.zeros(size)
        return np.asarray(tensor.detach().to(torch.float64).cpu().numpy(), dtype=np.float64)

    d, heads = attention.embed_dim, attention.num_heads
    r = d // heads
    w = array(attention.in_proj_weight)
    out = {
        "query": w[:d].reshape(heads, r, d), "key": w[d:2 * d].reshape(heads, r, d),
        "value": w[2 * d:].reshape(heads, r, d), "output": array(attention.out_proj.weight),
        "d": d, "heads": heads, "head_dim": r,
    }
    if mlp:
        width = mlp["w1"].shape[0]
        out.update({"mlp_w1": array(mlp["w1"]), "mlp_b1": array(mlp["b1"], width), "mlp_w2": array(mlp["w2"]),
                    "mlp_b2": array(mlp["b2"], d)})
        out["activation"] = mlp["activation"]
    return out


def export_torch(module: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Write the weights file of ``mfattn run --weights`` from a PyTorch layer, and return the options
    that run it as PyTorch computes it.

    ``module``: a ``torch.nn.MultiheadAttention`` or ``torch.nn.TransformerEncoderLayer`` (its
    ``self_attn`` and its ``linear2(activation(linear1(x)))``), or a list of them (a
    ``torch.nn.TransformerEncoder``'s ``layers``): several layers get a leading layer axis, which
    ``--layer-time`` spreads over time. The attention takes no bias (a nonzero one is refused).
    The datasets are float64: /attention/query, key, value [H, r, d] (in_proj_weight split per
    head), /attention/output [d, H r] (out_proj.weight), /mlp/w1 [W, d], b1 [W], w2 [d, W], b2 [d]
    with the attribute activation.

    Returns the options (``beta`` = 1 / sqrt(r), PyTorch's scaling, ``kernel="sa"``,
    ``values="plain"``, ``heads``, ``head_dim``, ``mlp``, ``mlp_activation``, ``weights``) for
    ``mfattn.Model(n=n, **options)`` or the command line (several layers also need
    ``layer_time=``; ``weights_file_layers(path)`` says how many there are).
    """
    import torch

    if isinstance(module, torch.nn.TransformerEncoder):
        layers = list(module.layers)
    elif isinstance(module, (list, tuple, torch.nn.ModuleList)):
        layers = list(module)
    else:
        layers = [module]
    if not layers:
        raise ValueError("export_torch: no layer given")
    parts = [_torch_layer_weights(layer) for layer in layers]
    shapes = {(p["d"], p["heads"], p["head_dim"], p.get("mlp_w1", np.empty((0,))).shape, p.get("activation")) for p in parts}
    if len(shapes) != 1:
        raise ValueError("export_torch: the layers differ in d, heads, feed-forward width or activation")
    first = parts[0]

    def stacked(name: str) -> Any:
        return np.stack([p[name] for p in parts]) if len(parts) > 1 else first[name]

    tmp = f"{os.fspath(path)}.part"
    with h5py.File(tmp, "w") as f:
        group = f.create_group("attention")
        for name in ("query", "key", "value", "output"):
            group.create_dataset(name, data=stacked(name))
        if "mlp_w1" in first:
            mlp = f.create_group("mlp")
            for name in ("w1", "b1", "w2", "b2"):
                mlp.create_dataset(name, data=stacked("mlp_" + name))
            mlp.attrs["activation"] = first["activation"]
    os.replace(tmp, path)
    options = {
        "d": first["d"], "heads": first["heads"], "head_dim": first["head_dim"], "beta": 1.0 / np.sqrt(first["head_dim"]),
        "kernel": "sa", "values": "plain", "weights": os.fspath(path),
    }
    if "mlp_w1" in first:
        options["mlp"] = first["mlp_w1"].shape[0]
        options["mlp_activation"] = first["activation"]
    return options


# ---------------------------------------------------------------------------------------------
# Other models' states as mfattn files (docs/import.md).

def write(path: str | os.PathLike, positions: Any, times: Any = None, labels: dict[str, Any] | None = None,
          parameters: dict[str, Any] | None = None, *, cluster_delta: float = 1e-4, deflate: bool = False,
          overwrite: bool = False, source: str = "mfattn.io.write") -> str:
    """Writes token states of any model as an mfattn particle file that ``mfattn analyze``,
    ``info``, ``view``, ``animate``, :func:`load` and the plots take (docs/import.md), through
    the C++ writer of ``mfattn run`` and ``mfattn import`` (the layout lives in one place).

    positions: [T, n, d] or [T, R, n, d] (frames, replicas, tokens, dimension), e.g. a network's
        hidden states layer by layer. Rows that are not unit vectors are stored as given
        (``state_space`` "euclidean") and analysed on their directions.
    times: [T] strictly increasing; None: 0, 1, ..., T - 1 (the layer index).
    labels: optional ``presence`` [n] (>= 0; tokens of presence 0 are stored and left out of the
        observables), ``prompt_id`` [n] (integers), ``sequence_position`` [n] (default 0..n-1,
        stored as aux_position).
    parameters: name -> int, float, bool, str or a sequence of numbers, stored in /parameters as
        given (the names the file writes itself, such as "command" or "beta", are refused: no
        model made these states, and the file says so rather than inventing its parameters).
    The file is published whole under ``path`` or not at all. Returns the state space
    ("sphere" or "euclidean"). ValueError for what it refuses; FileExistsError when ``path``
    exists and ``overwrite`` is False; OSError for a failed write."""
    from . import _core
    if _core is None:
        from . import _missing_core
        raise _missing_core("io.write")
    x = np.asarray(positions)
    if x.dtype == object or not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise ValueError(f"positions: expected an array of numbers, got dtype {x.dtype}")
    if np.iscomplexobj(x):
        raise ValueError("positions: complex states are not accepted (real [T, n, d] or [T, R, n, d])")
    if x.ndim == 3:
        x = x[:, np.newaxis]
    elif x.ndim != 4:
        raise ValueError(f"positions: shape {x.shape}; expected [T, n, d] or [T, R, n, d]")
    labels = dict(labels or {})
    unknown = sorted(set(labels) - {"presence", "prompt_id", "sequence_position"})
    if unknown:
        raise ValueError(f"labels: {', '.join(unknown)} not accepted (presence, prompt_id, sequence_position)")
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"{path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{path}: a folder, not a file")
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(f"{path} exists (give overwrite=True to replace it)")
    stored = {_parameter_name(name): _parameter_value(name, value) for name, value in dict(parameters or {}).items()}
    return _core.write_states(path, np.ascontiguousarray(x, dtype=np.float64),
                              None if times is None else np.asarray(times, dtype=np.float64),
                              labels.get("presence"), labels.get("prompt_id"), labels.get("sequence_position"),
                              stored, source, float(cluster_delta), bool(deflate),
                              bool(overwrite))


def _parameter_name(name: Any) -> str:
    """A /parameters attribute name: a non-empty str without NUL or '/', at most 255 characters."""
    if not isinstance(name, str) or not name or "\0" in name or "/" in name or len(name) > 255:
        raise ValueError(f"parameters: {name!r}: a name is a non-empty str of at most 255 characters, without "
                         "'/' or NUL")
    return name


def _parameter_value(name: str, value: Any) -> Any:
    """The value stored for a parameter: bool, int (64-bit), float, str (no NUL) or a list of
    floats (a sequence of numbers); numpy scalars and 0-d arrays as their Python values."""
    accepted = "an int, a float, a bool, a str or a sequence of numbers"
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -2**63 <= value < 2**63:
            raise ValueError(f"parameters: '{name}': {value} does not fit a 64-bit integer")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError(f"parameters: '{name}': a str with a NUL character cannot be stored")
        return value
    if value is None or isinstance(value, (bytes, dict, set)):
        raise ValueError(f"parameters: '{name}': {type(value).__name__} is not stored ({accepted})")
    try:
        numbers = np.asarray(value)
    except Exception as error:  # noqa: BLE001 - any failure is the same refusal
        raise ValueError(f"parameters: '{name}': not stored ({accepted})") from error
    if numbers.ndim != 1 or not (np.issubdtype(numbers.dtype, np.number) or numbers.dtype == bool) or \
            np.iscomplexobj(numbers):
        raise ValueError(f"parameters: '{name}': not stored ({accepted}; a sequence is one axis of real numbers)")
    return [float(v) for v in numbers]

