#!/usr/bin/python3
"""A batched dense peer of the reference code of arXiv:2312.10794 (Geshkovski, Letrouit,
Polyanskiy, Rigollet, "A mathematical perspective on Transformers"; repository
borjanG/2023-transformers-rotf, scripts phase-diagrams.py and sphere.py), written from its
semantics, in NumPy and in PyTorch (CPU, float64).

The reference step, for B systems at once, X of shape [B, n, d] with the tokens as unit rows:

    S = beta * (X @ BF) @ X^T                       [B, n, n]  (BF the bilinear form, I if none)
    SA:  W = softmax(S, over j)                     (torch.nn.functional.softmax: max subtracted)
    USA: W = exp(S) / n                             (no shift)
    Y  = ((W @ X) * eta) @ V + X                    (V acts on row vectors; skipped if V = I)
    X  = Y / |Y| row by row                         (no tangent projection)

with eta = step, except USA without --rawstep: eta = step / max(sqrt(beta) e^(beta - 1/2), 1).
``project=True`` gives instead the projected Euler step of mfattn's ``--integrator euler``
(Y = X + P_X(eta (W X) V), P_x y = y - <x, y> x), to compare against a binary that lacks the
unprojected step.

Time advances by eta from 0, stepping before checking. The statistic is checked at the
checkpoints linspace(0, maxtime, 200): checkpoint c takes the state after the first step whose
accumulated time (t <- t + eta in float64) is >= c; the run stops at the first step with
t >= maxtime. The statistic of a system is the fraction of its ordered pairs i != j with
<x_i, x_j> > 0.999; the reference reports the mean over the batch (every system has the same
number of pairs, so the pooled fraction equals the batch mean).

Random matrices (one per system, or shared: ``noanneal``), with G entries i.i.d. N(0, 1):

    random_kq 1: BF = G1 G2 / sqrt(d)                            normV = sqrt(d)
              2: BF = (G + G^T) / (2 on the diagonal, sqrt 2 off)  normV = sqrt(d)
                 (unit variance everywhere)
              3: BF = (G + G^T) / sqrt(2) (GOE)                   normV = sqrt(d + 1)
              0: BF = I                                           normV = 1
    random_v  1: V = G G^T / sqrt(d);  2: V = BF / normV;  3: V = -BF / normV;  0: V = I
    noanneal  0: new matrices per system and per beta; 1: one set per beta shared by all
              systems; 2: one set for the whole run (never redrawn)
    regen_period T > 0: after the step whose time first exceeds T, 2T, ... (strictly), the
              matrices are redrawn (the redraw is used from the next step on).

Each beta starts from new initial states (normalised Gaussians) in the reference; the peer
draws them, then the matrices, from its own seeded generator (numpy.random.default_rng(seed),
or torch.Generator().manual_seed(seed)); the draws are not the reference's (which come from
the CUDA generator), only their laws are.

mfattn's score is beta <Q x_i, K x_j> = beta x_i^T Q^T K x_j and its values are V x_j (V acts
on column vectors), so an mfattn model (Q, K, V) is the peer's BF = Q^T K, V_row = V^T
(:func:`from_mfattn_matrices`); the reference's BF is mfattn's K with Q = I, and the
reference's V is mfattn's V^T.

sphere.py (n = 64, d = 3, beta = 1, T = 15, dt = 0.1, SA, Q = K = A = I, V = I) is the same
unprojected step for one system with every state kept: :func:`sphere_run`.

Usable as a module (``phase_diagram``, ``simulate``, ``sphere_run``, ``agreement``) and as a
script:

    /usr/bin/python3 tests/peers/reference_peer.py phase --kernel sa --batch 512 \
        --betas 0.1 9 10 --maxtime 30 --backend torch --threads 2 [--json out.json]
    /usr/bin/python3 tests/peers/reference_peer.py sphere --n 256 [--npz out.npz]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "THRESHOLD", "reference_eta", "reference_checkpoints", "checkpoint_steps", "draw_matrices",
    "from_mfattn_matrices", "mfattn_matrices", "mfattn_layers", "mfattn_initial_states", "simulate", "pair_fraction", "phase_diagram", "PhaseDiagram",
    "sphere_run", "agreement", "Agreement", "random_unit_rows",
]

THRESHOLD = 0.999  # the reference's <x_i, x_j> > 0.999
NORM_EPS = 1e-12   # torch.nn.functional.normalize's eps (the norm is clamped below by it)


# --------------------------------------------------------------------------------------------
# The reference's bookkeeping: step size, checkpoints, which step each checkpoint takes.

def reference_eta(kernel: str, beta: float, step: float = 0.1, rawstep: bool = False) -> float:
    """The step the reference takes: ``step`` for SA (use_softmax) or with rawstep, else
    step / max(sqrt(beta) * exp(beta - 1/2), 1)."""
    kernel = _kernel(kernel)
    if kernel == "usa" and not rawstep:
        return step / max(np.sqrt(beta) * np.exp(beta - 0.5), 1.0)
    return float(step)


def reference_maxtime(kernel: str) -> float:
    """The reference's default --maxtime: 30 for softmax, 1 without."""
    return 30.0 if _kernel(kernel) == "sa" else 1.0


def reference_checkpoints(maxtime: float, count: int = 200) -> np.ndarray:
    """linspace(0, maxtime, count) as torch.linspace computes it in float64 (which for these
    arguments agrees with numpy.linspace; torch is used when it is importable)."""
    try:
        import torch
        return torch.linspace(0.0, float(maxtime), int(count), dtype=torch.float64).numpy().copy()
    except ImportError:
        return np.linspace(0.0, float(maxtime), int(count))


def checkpoint_steps(eta: float, maxtime: float, checkpoints: np.ndarray) -> np.ndarray:
    """For each checkpoint, the number of steps after which the reference takes it: the first
    step s whose accumulated time t_s (t_0 = 0, t_s = t_{s-1} + eta in float64) is >= the
    checkpoint. The reference stops at the first step with t_s >= maxtime (it takes the
    remaining checkpoints there when they are <= t_s)."""
    checkpoints = np.asarray(checkpoints, dtype=np.float64)
    out = np.empty(checkpoints.shape[0], dtype=np.int64)
    t, s, c = 0.0, 0, 0
    while c < checkpoints.shape[0]:
        t = t + eta
        s += 1
        while c < checkpoints.shape[0] and t >= checkpoints[c]:
            out[c] = s
            c += 1
        if t >= maxtime and c < checkpoints.shape[0]:
            raise ValueError(f"checkpoint {checkpoints[c]} lies beyond maxtime {maxtime}")
    return out


def step_times(eta: float, steps: int) -> np.ndarray:
    """t_1..t_steps as the reference accumulates them (t <- t + eta)."""
    out = np.empty(steps, dtype=np.float64)
    t = 0.0
    for s in range(steps):
        t = t + eta
        out[s] = t
    return out


def _kernel(kernel: str) -> str:
    k = kernel.lower()
    if k in ("sa", "softmax"):
        return "sa"
    if k in ("usa", "unnormalized", "unnormalised"):
        return "usa"
    raise ValueError(f"kernel must be 'sa' or 'usa', not {kernel!r}")


# --------------------------------------------------------------------------------------------
# Backends: the same operations on NumPy arrays or torch tensors.

class _NumpyOps:
    name = "numpy"

    def __init__(self, seed: int, threads: int | None = None):
        self.rng = np.random.default_rng(seed)

    def randn(self, *shape):
        return self.rng.standard_normal(shape)

    def asarray(self, a):
        return np.array(a, dtype=np.float64, copy=True)

    def to_numpy(self, a):
        return np.asarray(a)

    def eye(self, d):
        return np.eye(d)[np.newaxis]

    def transpose(self, a):
        return np.swapaxes(a, -1, -2)

    def normalize(self, y):
        norm = np.sqrt(np.einsum("bnd,bnd->bn", y, y))[..., np.newaxis]
        return y / np.maximum(norm, NORM_EPS)

    def new_buffers(self, B, n, d):
        return {"S": np.empty((B, n, n)), "Y": np.empty((B, n, d))}

    def step(self, x, beta, eta, sa, bf, v, project, buf):
        S, Y = buf["S"], buf["Y"]
        xb = np.matmul(x, bf) if bf is not None else x
        np.matmul(xb, np.swapaxes(x, 1, 2), out=S)
        S *= beta
        if sa:
            S -= S.max(axis=2, keepdims=True)
            np.exp(S, out=S)
            S /= S.sum(axis=2, keepdims=True)
        else:
            np.exp(S, out=S)
            S /= x.shape[1]
        np.matmul(S, x, out=Y)
        Y *= eta
        if v is not None:
            Y = np.matmul(Y, v)
        if project:
            Y -= np.einsum("bnd,bnd->bn", Y, x)[..., np.newaxis] * x
        Y += x
        return self.normalize(Y)

    def pair_fraction(self, x, threshold):
        G = np.matmul(x, np.swapaxes(x, 1, 2))
        n = x.shape[1]
        hits = (G > threshold).sum(axis=(1, 2)) - (np.einsum("bii->bi", G) > threshold).sum(axis=1)
        return hits / float(n * (n - 1)) if n > 1 else np.ones(x.shape[0])


class _TorchOps:
    name = "torch"

    def __init__(self, seed: int, threads: int | None = None):
        import torch
        self.torch = torch
        if threads:
            torch.set_num_threads(int(threads))
        self.gen = torch.Generator().manual_seed(int(seed))

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.gen, dtype=self.torch.float64)

    def asarray(self, a):
        return self.torch.tensor(np.asarray(a, dtype=np.float64))

    def to_numpy(self, a):
        return a.numpy().copy()

    def eye(self, d):
        return self.torch.eye(d, dtype=self.torch.float64).unsqueeze(0)

    def transpose(self, a):
        return a.transpose(-1, -2)

    def normalize(self, y):
        return self.torch.nn.functional.normalize(y, dim=2)

    def new_buffers(self, B, n, d):
        t = self.torch
        return {"S": t.empty(B, n, n, dtype=t.float64), "Y": t.empty(B, n, d, dtype=t.float64),
                "XB": t.empty(B, n, d, dtype=t.float64), "Y2": t.empty(B, n, d, dtype=t.float64),
                "X": t.empty(B, n, d, dtype=t.float64)}

    def step(self, x, beta, eta, sa, bf, v, project, buf):
        t = self.torch
        S, Y = buf["S"], buf["Y"]
        if bf is not None:
            t.matmul(x, bf, out=buf["XB"])
            xb = buf["XB"]
        else:
            xb = x
        t.matmul(xb, x.transpose(1, 2), out=S)
        S *= beta
        if sa:
            S = t.nn.functional.softmax(S, dim=2)
        else:
            t.exp(S, out=S)
            S /= x.shape[1]
        t.matmul(S, x, out=Y)
        Y *= eta
        if v is not None:
            t.matmul(Y, v, out=buf["Y2"])
            Y.copy_(buf["Y2"])
        if project:
            Y -= (Y * x).sum(dim=2, keepdim=True) * x
        Y += x
        # A fresh output tensor each step (x is read above; normalize into the other buffer).
        out = buf["X"] if x is not buf["X"] else buf.setdefault("X2", t.empty_like(x))
        t.nn.functional.normalize(Y, dim=2, out=out)
        return out

    def pair_fraction(self, x, threshold):
        t = self.torch
        G = t.matmul(x, x.transpose(1, 2))
        n = x.shape[1]
        if n < 2:
            return np.ones(x.shape[0])
        hits = (G > threshold).sum(dim=(1, 2)) - (t.diagonal(G, dim1=1, dim2=2) > threshold).sum(dim=1)
        return (hits.to(t.float64) / float(n * (n - 1))).numpy().copy()


def _ops(backend: str, seed: int, threads: int | None):
    if backend == "numpy":
        return _NumpyOps(seed, threads)
    if backend == "torch":
        return _TorchOps(seed, threads)
    raise ValueError(f"backend must be 'numpy' or 'torch', not {backend!r}")


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


# --------------------------------------------------------------------------------------------
# Matrices.

def draw_matrices(ops, random_kq: int, random_v: int, count: int, d: int):
    """(BF, V) with the reference's laws, each [count, d, d] (count = batch for matrices per
    system, 1 for a shared set), or None for the identity (the reference skips the product)."""
    if random_kq == 1:
        bf = ops.randn(count, d, d)
        bf = (bf @ ops.randn(count, d, d)) / math.sqrt(d)
        norm_v = math.sqrt(d)
    elif random_kq == 2:
        g = ops.randn(count, d, d)
        norma = np.full((d, d), math.sqrt(2.0))
        np.fill_diagonal(norma, 2.0)
        bf = (g + ops.transpose(g)) / ops.asarray(norma)
        norm_v = math.sqrt(d)
    elif random_kq == 3:
        g = ops.randn(count, d, d)
        bf = (g + ops.transpose(g)) / math.sqrt(2.0)
        norm_v = math.sqrt(d + 1)
    elif random_kq == 0:
        bf = None
        norm_v = 1.0
    else:
        raise ValueError(f"random_kq must be 0..3, not {random_kq}")
    if random_v == 1:
        g = ops.randn(count, d, d)
        v = (g @ ops.transpose(g)) / math.sqrt(d)
    elif random_v in (2, 3):
        base = bf if bf is not None else ops.eye(d)
        v = (base if random_v == 2 else -base) / norm_v
    elif random_v == 0:
        v = None
    else:
        raise ValueError(f"random_v must be 0..3, not {random_v}")
    return bf, v


def from_mfattn_matrices(Q=None, K=None, V=None):
    """mfattn matrices (d x d, or [R, d, d] per replica; None = identity) -> the peer's
    (bf, v): bf = Q^T K (score x_i^T Q^T K x_j), v = V^T (the peer applies v to row vectors).
    Arrays come back as float64 [R or 1, d, d], or None for the identity."""
    def stack(a):
        if a is None:
            return None
        a = np.asarray(a, dtype=np.float64)
        return a[np.newaxis] if a.ndim == 2 else a

    Q, K, V = stack(Q), stack(K), stack(V)
    if Q is None and K is None:
        bf = None
    else:
        if Q is None:
            bf = K.copy()
        elif K is None:
            bf = np.swapaxes(Q, -1, -2).copy()
        else:
            bf = np.matmul(np.swapaxes(Q, -1, -2), K)
    v = None if V is None else np.ascontiguousarray(np.swapaxes(V, -1, -2))
    return bf, v


_REPLICA_GROUP = re.compile(r"tokens(?:_r([1-9][0-9]*))?$")
_ATTENTION = {"Q": "query", "K": "key", "V": "value"}


def mfattn_layers(path) -> dict[str, Any]:
    """Every layer's matrices an mfattn run used, as its file records them
    (/particles/tokens[_r<r>]/attention_matrices: layer_start [L], query, key, value
    [L, d, d], acting on column vectors; replica groups other than replica 0 hold them only
    with --matrices per-replica). Returns {"layer_start": [L], "Q", "K", "V": [R, L, d, d]}
    (R = 1 for shared matrices), or None for a file without the record."""
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        groups = sorted((int(m.group(1) or 0), key) for key in f["particles"]
                        for m in [_REPLICA_GROUP.match(key)] if m)
        records = [f[f"particles/{key}/attention_matrices"] for _, key in groups
                   if "attention_matrices" in f[f"particles/{key}"]]
        if not records:
            return None
        out: dict[str, Any] = {"layer_start": np.asarray(records[0]["layer_start"][()])}
        for key, name in _ATTENTION.items():
            out[key] = np.stack([np.asarray(r[name][()], dtype=np.float64) for r in records])
    return out


def mfattn_matrices(path, layer: int = 0) -> dict[str, np.ndarray | None]:
    """The Q, K, V of one layer (default the first) of an mfattn run: {"Q", "K", "V"}, each
    [R, d, d] (one per replica, --matrices per-replica) or [d, d] (shared).

    Read from the file's attention_matrices record (:func:`mfattn_layers`). A file without it
    (a build that does not record them) falls back to /parameters: "identity" (or "") is None,
    an existing text file given to --q/--k/--v is read as mfattn reads it; a drawn preset then
    raises LookupError.
    """
    layers = mfattn_layers(path)
    if layers is not None:
        out = {}
        for key in ("Q", "K", "V"):
            m = layers[key][:, layer]
            out[key] = m[0] if m.shape[0] == 1 else m
        return out
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        params = {k: f["parameters"].attrs[k] for k in f["parameters"].attrs} if "parameters" in f else {}
    out: dict[str, np.ndarray | None] = {}
    for key in ("Q", "K", "V"):
        value = params.get(key.lower(), "identity")
        value = value.decode() if isinstance(value, bytes) else str(value)
        if value in ("", "identity"):
            out[key] = None
        elif os.path.isfile(value):
            out[key] = _load_matrix_text(value)
        else:
            raise LookupError(f"{path}: --{key.lower()} {value} was drawn, but the file stores "
                              f"no attention_matrices")
    return out


def _load_matrix_text(path) -> np.ndarray:
    """A matrix file as mfattn reads it: numbers separated by whitespace or commas, '#'
    comments, blank lines skipped."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].replace(",", " ").split()
            if line:
                rows.append([float(x) for x in line])
    return np.array(rows, dtype=np.float64)


def mfattn_initial_states(path) -> np.ndarray:
    """Frame 0 of every replica of an mfattn file: [R, n, d]."""
    import h5py
    with h5py.File(path, "r", locking=False) as f:
        groups = sorted((int(m.group(1) or 0), key) for key in f["particles"]
                        for m in [_REPLICA_GROUP.match(key)] if m)
        return np.stack([np.asarray(f[f"particles/{key}/position/value"][0]) for _, key in groups])


def random_unit_rows(B: int, n: int, d: int, seed: int = 0) -> np.ndarray:
    """B systems of n normalised Gaussian rows in R^d (numpy.random.default_rng(seed))."""
    x = np.random.default_rng(seed).standard_normal((B, n, d))
    return x / np.linalg.norm(x, axis=2, keepdims=True)


# --------------------------------------------------------------------------------------------
# Trajectories and the statistic.

def simulate(x0, beta: float, steps: int, eta: float, kernel: str = "sa", bf=None, v=None,
             project: bool = False, backend: str = "numpy", threads: int | None = None,
             keep: str = "all") -> np.ndarray:
    """``steps`` reference steps from the given states.

    x0: [B, n, d] (or [n, d]: one system) unit rows. bf, v: [B or 1, d, d] (or [d, d]) in the
    reference's convention (see :func:`from_mfattn_matrices`), None for the identity.
    keep: "all" -> [steps + 1, B, n, d] (x0 first); "last" -> [B, n, d]. The input shape's
    system axis is dropped again for a single [n, d] system.
    """
    x0 = np.asarray(x0, dtype=np.float64)
    single = x0.ndim == 2
    if single:
        x0 = x0[np.newaxis]
    ops = _ops(backend, 0, threads)
    x = ops.asarray(x0)
    bf_ = None if bf is None else ops.asarray(np.asarray(bf).reshape((-1,) + np.shape(bf)[-2:]))
    v_ = None if v is None else ops.asarray(np.asarray(v).reshape((-1,) + np.shape(v)[-2:]))
    B, n, d = x0.shape
    buf = ops.new_buffers(B, n, d)
    sa = _kernel(kernel) == "sa"
    frames = [x0.copy()] if keep == "all" else None
    for _ in range(int(steps)):
        x = ops.step(x, beta, eta, sa, bf_, v_, project, buf)
        if frames is not None:
            frames.append(ops.to_numpy(x))
    if keep == "all":
        out = np.stack(frames)
        return out[:, 0] if single else out
    out = ops.to_numpy(x)
    return out[0] if single else out


def pair_fraction(x, threshold: float = THRESHOLD) -> np.ndarray:
    """Per-system fraction of ordered pairs i != j with <x_i, x_j> > threshold; x [..., n, d]."""
    x = np.asarray(x, dtype=np.float64)
    lead = x.shape[:-2]
    flat = x.reshape((-1,) + x.shape[-2:])
    return _NumpyOps(0).pair_fraction(flat, threshold).reshape(lead)


@dataclass
class PhaseDiagram:
    """The reference's phase-diagram output, plus what a statistical comparison needs.

    betas [nb]; checkpoints [nc] (the reference's times_list); etas [nb]; steps [nb, nc]: the
    step count at which each checkpoint was taken; unique [nb, nc]: True for the first
    checkpoint of each distinct step (later ones repeat its value); mean [nb, nc]: the batch
    mean (the reference's density_tensor); per_system [nb, nc, B]; seconds: the wall time of
    the simulation loop (matrix and state draws included, set-up and imports not); states
    [nb, B, n, d]: the final state of each beta, with ``keep_states``.
    """
    betas: np.ndarray
    checkpoints: np.ndarray
    etas: np.ndarray
    steps: np.ndarray
    unique: np.ndarray
    mean: np.ndarray
    per_system: np.ndarray
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    states: np.ndarray | None = None


def phase_diagram(betas, batch: int = 512, n: int = 32, d: int = 2, kernel: str = "sa",
                  step: float = 0.1, rawstep: bool = False, maxtime: float | None = None,
                  checkpoints: int = 200, random_kq: int = 0, random_v: int = 0,
                  noanneal: int = 0, regen_period: float = 0.0, seed: int = 0,
                  backend: str = "torch", threads: int | None = None, project: bool = False,
                  threshold: float = THRESHOLD, x0=None, bf=None, v=None,
                  keep_states: bool = False) -> PhaseDiagram:
    """phase-diagrams.py's loop for each beta (a fresh batch of states per beta).

    x0 ([nb, B, n, d] or [B, n, d], the same for every beta), bf and v ([B or 1, d, d]) may be
    given instead of drawn; given matrices are never redrawn.
    """
    kernel = _kernel(kernel)
    betas = np.asarray(betas, dtype=np.float64).reshape(-1)
    if maxtime is None:
        maxtime = reference_maxtime(kernel)
    ckpts = reference_checkpoints(maxtime, checkpoints)
    ops = _ops(backend, seed, threads)
    nb, nc = betas.shape[0], ckpts.shape[0]
    mean = np.zeros((nb, nc))
    per_system = np.zeros((nb, nc, batch))
    steps_of = np.zeros((nb, nc), dtype=np.int64)
    unique = np.zeros((nb, nc), dtype=bool)
    etas = np.zeros(nb)
    states = np.zeros((nb, batch, n, d)) if keep_states else None
    given = bf is not None or v is not None
    if given:
        bf = None if bf is None else ops.asarray(bf)
        v = None if v is None else ops.asarray(v)
    shared_run = None
    if not given and noanneal >= 2:
        shared_run = draw_matrices(ops, random_kq, random_v, 1, d)
    sa = kernel == "sa"
    buf = ops.new_buffers(batch, n, d)
    t0 = time.perf_counter()
    for b, beta in enumerate(betas):
        eta = reference_eta(kernel, beta, step, rawstep)
        etas[b] = eta
        if x0 is None:
            g = ops.randn(batch, n, d)
            x = ops.normalize(g)
        else:
            xs = np.asarray(x0, dtype=np.float64)
            x = ops.asarray(xs[b] if xs.ndim == 4 else xs)
        if given:
            mats = (bf, v)
        elif shared_run is not None:
            mats = shared_run
        else:
            mats = draw_matrices(ops, random_kq, random_v, 1 if noanneal == 1 else batch, d)
        regen_time = regen_period if regen_period > 0 else math.inf
        t, s, c = 0.0, 0, 0
        while True:
            x = ops.step(x, float(beta), eta, sa, mats[0], mats[1], project, buf)
            t = t + eta
            s += 1
            if c < nc and t >= ckpts[c]:
                frac = ops.pair_fraction(x, threshold)
                first = True
                while c < nc and t >= ckpts[c]:
                    per_system[b, c] = frac
                    mean[b, c] = frac.mean()
                    steps_of[b, c] = s
                    unique[b, c] = first
                    first = False
                    c += 1
            if t >= maxtime:
                break
            if t > regen_time:
                if not given and shared_run is None:
                    mats = draw_matrices(ops, random_kq, random_v, 1 if noanneal == 1 else batch, d)
                regen_time += regen_period
        if states is not None:
            states[b] = ops.to_numpy(x)
    seconds = time.perf_counter() - t0
    settings = dict(batch=batch, n=n, d=d, kernel=kernel, step=step, rawstep=rawstep,
                    maxtime=maxtime, checkpoints=checkpoints, random_kq=random_kq,
                    random_v=random_v, noanneal=noanneal, regen_period=regen_period, seed=seed,
                    backend=ops.name, threads=threads, project=project, threshold=threshold)
    return PhaseDiagram(betas=betas, checkpoints=ckpts, etas=etas, steps=steps_of,
                        unique=unique, mean=mean, per_system=per_system, seconds=seconds,
                        settings=settings, states=states)


def sphere_run(n: int = 64, d: int = 3, beta: float = 1.0, T: float = 15.0, dt: float = 0.1,
               softmax: bool = True, A=None, V=None, seed: int = 0, x0=None,
               project: bool = False) -> np.ndarray:
    """sphere.py's loop: int(T/dt) steps of the unprojected step from normalised Gaussians
    (or x0 [n, d]), every state kept: returns z [num_steps, n, d], num_steps = int(T/dt) + 1,
    z[0] = x0. A (score x_i^T A^T A x_j) and V (values V x_j, column vectors, as sphere.py
    applies them) default to the identity."""
    num_steps = int(T / dt) + 1
    if x0 is None:
        g = np.random.default_rng(seed).standard_normal((n, d))
        x0 = g / np.linalg.norm(g, axis=1, keepdims=True)
    bf = None if A is None else np.asarray(A).T @ np.asarray(A)
    v = None if V is None else np.asarray(V).T
    return simulate(x0, beta, num_steps - 1, dt, "sa" if softmax else "usa", bf=bf, v=v,
                    project=project, backend="numpy", keep="all")


# --------------------------------------------------------------------------------------------
# Statistical agreement of two batch means.

@dataclass
class Agreement:
    """z [cells]: (mean_a - mean_b) / sqrt(se_a^2 + se_b^2) (0 where both means are equal,
    inf where they differ with zero error); beyond3: cells with |z| > 3; allowed3: how many
    cells beyond 3 SE chance allows (see :func:`agreement`); binomial3 and permutation3 the two
    bounds it is the larger of; max_abs_z; ok: beyond3 <= allowed3 and max_abs_z <= 4.5."""
    z: np.ndarray
    cells: int
    beyond3: int
    allowed3: int
    max_abs_z: float
    ok: bool
    binomial3: int = 0
    permutation3: int = 0

    def summary(self) -> str:
        return (f"{self.cells} cells: {self.beyond3} beyond 3 SE (chance allows {self.allowed3}:"
                f" binomial {self.binomial3}, permutation {self.permutation3}),"
                f" max |z| = {self.max_abs_z:.2f} -> {'agree' if self.ok else 'DISAGREE'}")


def standard_error(per_system: np.ndarray) -> np.ndarray:
    """Standard error of the batch mean over the last axis (sample standard deviation / sqrt(B))."""
    B = per_system.shape[-1]
    return per_system.std(axis=-1, ddof=1) / math.sqrt(B) if B > 1 else np.zeros(per_system.shape[:-1])


def _z_scores(per_a: np.ndarray, per_b: np.ndarray) -> np.ndarray:
    diff = per_a.mean(axis=-1) - per_b.mean(axis=-1)
    se = np.sqrt(standard_error(per_a) ** 2 + standard_error(per_b) ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(se > 0, diff / np.where(se > 0, se, 1.0),
                        np.where(diff == 0, 0.0, np.inf * np.sign(diff)))


def agreement(per_a: np.ndarray, per_b: np.ndarray, mask: np.ndarray | None = None,
              max_z: float = 4.5, quantile: float = 0.999, permutations: int = 1000,
              seed: int = 0) -> Agreement:
    """Compares two samples cell by cell: per_a [nb, nc, Ba] and per_b [nb, nc, Bb] are the
    per-system statistics of nb independent groups of systems (one per beta), each followed
    over nc cells (checkpoints); mask [nb, nc] selects the cells compared (default all).

    Fails when a cell's |z| exceeds ``max_z`` or more cells exceed 3 than chance allows. The
    checkpoints of one system are strongly correlated, so cells beyond 3 SE come in runs: the
    count that chance allows is the larger of the ``quantile`` of Binomial(cells, P(|N(0,1)| >
    3)) (independent cells, at least 1) and the same quantile of the count under the null
    hypothesis, by ``permutations`` random reassignments of each beta's pooled systems (whole
    time series) to the two samples (seeded: deterministic). ``permutations=0`` keeps the
    binomial bound alone. Leading axes other than [nb, nc] are taken as the groups' cells.
    """
    from scipy.stats import binom, norm

    per_a, per_b = np.asarray(per_a, dtype=np.float64), np.asarray(per_b, dtype=np.float64)
    if per_a.shape[:-1] != per_b.shape[:-1]:
        raise ValueError(f"cells differ: {per_a.shape[:-1]} vs {per_b.shape[:-1]}")
    z = _z_scores(per_a, per_b)
    keep = np.ones(z.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    zc = z[keep].reshape(-1)
    cells = int(zc.size)
    p3 = 2.0 * norm.sf(3.0)
    binomial = max(1, int(binom.ppf(quantile, cells, p3))) if cells else 0
    permuted = 0
    if permutations > 0 and cells:
        groups = per_a.reshape((-1,) + per_a.shape[-2:]) if per_a.ndim >= 3 else per_a[np.newaxis]
        other = per_b.reshape((-1,) + per_b.shape[-2:]) if per_b.ndim >= 3 else per_b[np.newaxis]
        gmask = keep.reshape((groups.shape[0], groups.shape[1]))
        pooled = np.concatenate([groups, other], axis=-1)       # [G, nc, Ba + Bb]
        Ba, total = groups.shape[-1], pooled.shape[-1]
        Bb = total - Ba
        rng = np.random.default_rng(seed)
        counts = np.zeros(permutations, dtype=np.int64)
        for g in range(pooled.shape[0]):
            X = pooled[g][gmask[g]]                               # [cells of g, Ba + Bb]
            if X.shape[0] == 0:
                continue
            # Each column of pick marks the Ba systems that a reassignment gives to sample a;
            # the sums of both samples for every reassignment are two matrix products.
            order = np.argsort(rng.random((permutations, total)), axis=1)[:, :Ba]
            pick = np.zeros((total, permutations))
            pick[order.T, np.arange(permutations)[None, :]] = 1.0
            sa, qa = X @ pick, (X * X) @ pick
            sb, qb = X.sum(axis=1)[:, None] - sa, (X * X).sum(axis=1)[:, None] - qa
            ma, mb = sa / Ba, sb / Bb
            va = np.maximum(qa - Ba * ma * ma, 0.0) / max(Ba - 1, 1)
            vb = np.maximum(qb - Bb * mb * mb, 0.0) / max(Bb - 1, 1)
            se = np.sqrt(va / Ba + vb / Bb)
            diff = ma - mb
            with np.errstate(divide="ignore", invalid="ignore"):
                zk = np.where(se > 1e-12, diff / np.where(se > 1e-12, se, 1.0),
                              np.where(np.abs(diff) <= 1e-12, 0.0, np.inf))
            counts += np.sum(np.abs(zk) > 3.0, axis=0)
        permuted = int(np.quantile(counts, quantile, method="higher"))
    allowed = max(binomial, permuted)
    beyond = int(np.sum(np.abs(zc) > 3.0))
    max_abs = float(np.max(np.abs(zc))) if cells else 0.0
    return Agreement(z=zc, cells=cells, beyond3=beyond, allowed3=allowed, max_abs_z=max_abs,
                     ok=bool(beyond <= allowed and max_abs <= max_z), binomial3=binomial,
                     permutation3=permuted)


# --------------------------------------------------------------------------------------------
# Command line.

def _betas(values):
    if len(values) != 3:
        raise argparse.ArgumentTypeError("--betas takes BETAMIN BETAMAX COUNT")
    return np.linspace(float(values[0]), float(values[1]), int(values[2]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    ph = sub.add_parser("phase", help="phase-diagrams.py's workload; prints one JSON line")
    ph.add_argument("--kernel", choices=["sa", "usa"], default="sa")
    ph.add_argument("--n", type=int, default=32)
    ph.add_argument("--d", type=int, default=2)
    ph.add_argument("--batch", type=int, default=512)
    ph.add_argument("--betas", nargs=3, default=["0.1", "9", "10"], metavar=("MIN", "MAX", "COUNT"))
    ph.add_argument("--maxtime", type=float, default=None, help="default 30 (sa), 1 (usa)")
    ph.add_argument("--step", type=float, default=0.1)
    ph.add_argument("--rawstep", action="store_true")
    ph.add_argument("--checkpoints", type=int, default=200)
    ph.add_argument("--random-kq", type=int, default=0, choices=range(4))
    ph.add_argument("--random-v", type=int, default=0, choices=range(4))
    ph.add_argument("--noanneal", type=int, default=0, choices=range(3))
    ph.add_argument("--regen-period", type=float, default=0.0)
    ph.add_argument("--project", action="store_true", help="projected Euler instead")
    ph.add_argument("--seed", type=int, default=0)
    ph.add_argument("--backend", choices=["torch", "numpy"], default="torch")
    ph.add_argument("--threads", type=int, default=None)
    ph.add_argument("--json", default=None, help="also write betas, checkpoints and means here")
    sp = sub.add_parser("sphere", help="sphere.py's loop (NumPy); prints one JSON line")
    sp.add_argument("--n", type=int, default=64)
    sp.add_argument("--d", type=int, default=3)
    sp.add_argument("--beta", type=float, default=1.0)
    sp.add_argument("--T", type=float, default=15.0)
    sp.add_argument("--dt", type=float, default=0.1)
    sp.add_argument("--usa", action="store_true", help="no denominator (sphere.py's denominator=False)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--npz", default=None, help="write z [num_steps, n, d] here")
    a = p.parse_args(argv)

    if a.command == "phase":
        res = phase_diagram(_betas(a.betas), batch=a.batch, n=a.n, d=a.d, kernel=a.kernel,
                            step=a.step, rawstep=a.rawstep, maxtime=a.maxtime,
                            checkpoints=a.checkpoints, random_kq=a.random_kq, random_v=a.random_v,
                            noanneal=a.noanneal, regen_period=a.regen_period, seed=a.seed,
                            backend=a.backend, threads=a.threads, project=a.project)
        out = {"workload": "phase", **res.settings, "betas": res.betas.tolist(),
               "seconds": res.seconds, "final_mean": res.mean[:, -1].tolist()}
        if a.json:
            with open(a.json, "w") as f:
                json.dump({**out, "checkpoints": res.checkpoints.tolist(),
                           "etas": res.etas.tolist(), "steps": res.steps.tolist(),
                           "mean": res.mean.tolist()}, f)
        print(json.dumps(out))
    else:
        t0 = time.perf_counter()
        z = sphere_run(a.n, a.d, a.beta, a.T, a.dt, softmax=not a.usa, seed=a.seed)
        seconds = time.perf_counter() - t0
        if a.npz:
            np.savez(a.npz, z=z)
        print(json.dumps({"workload": "sphere", "n": a.n, "d": a.d, "beta": a.beta, "T": a.T,
                          "dt": a.dt, "frames": int(z.shape[0]), "seconds": seconds,
                          "final_pair_fraction": float(pair_fraction(z[-1]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
