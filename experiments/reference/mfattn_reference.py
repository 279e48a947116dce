#!/usr/bin/python3
"""mfattn runs of the reference workloads of arXiv:2312.10794 (repository
borjanG/2023-transformers-rotf: phase-diagrams.py, sphere.py), and their statistic read back
in the peer's layout (tests/peers/reference_peer.py), so the two compare cell by cell.

One `mfattn run` per beta, with R = batch replicas, the reference's step size (eta, the USA cap
included) as --dt, and as frames (--save-times) exactly the steps at which the reference takes
its checkpoints: checkpoint c is the state after the first step s whose accumulated time is
>= c, so the frame is at t = s * eta and the run's horizon is the last such step. mfattn takes
s steps of eta to reach it (a fixed-step run lands on each frame, and a remainder within 1e-9
of the step is one step), so its state at a frame is the reference's after s steps.

The option mapping (docs/reference.md):

    reference                    mfattn run
    use_softmax / not            --kernel sa / usa
    step, the USA cap, rawstep   --dt eta (reference_peer.reference_eta)
    randomKQ 0 / 1 / 2 / 3       --q identity --k identity / gaussian-product / wigner-unit / goe-unit
    randomV  0 / 1 / 2 / 3       --v identity / wishart / plus-form / minus-form
    noanneal 0 / 1 / 2           --matrices per-replica / shared (seed per beta) / shared (one seed)
    regen_period T               --regen-period T
    batch                        --replicas
    the statistic                /observables/clustered_pair_fraction with --pair-delta 0.001
    the step                     --integrator euler-unprojected

:func:`features` reads what the binary offers from `mfattn run --help`; where the reference's
step is missing the runs fall back to the projected `euler` (and say so: ``PhaseRuns.notes``),
and a random-matrix workload without per-replica presets raises :class:`MissingFeature`.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "peers"))
import reference_peer as rp  # noqa: E402

PRESET_K = {0: "identity", 1: "gaussian-product", 2: "wigner-unit", 3: "goe-unit"}
PRESET_V = {0: "identity", 1: "wishart", 2: "plus-form", 3: "minus-form"}
PAIR_DELTA = 1e-3  # <x_i, x_j> > 1 - 1e-3 = the reference's 0.999


class MissingFeature(RuntimeError):
    """The binary lacks an option that the workload needs."""


@dataclass
class Features:
    """What `mfattn run --help` offers. ``integrators``: the names listed for --integrator;
    ``k_presets`` / ``v_presets``: the reference presets that --k / --v list."""
    help_text: str
    integrators: set[str]
    unprojected: bool
    matrices: bool
    save_positions: bool
    regen_period: bool
    k_presets: set[str]
    v_presets: set[str]

    def random_matrices(self, random_kq: int, random_v: int) -> bool:
        return (self.matrices and (random_kq == 0 or PRESET_K[random_kq] in self.k_presets)
                and (random_v == 0 or PRESET_V[random_v] in self.v_presets))


def _option_block(text: str, option: str) -> str | None:
    """The help text of ``option`` (a line that starts with it, up to the next option line or
    blank line), or None when no line starts with it. Option lines are indented by a few
    spaces; a description's wrapped line that starts with an option's name (``--integrator
    stochastic-heun)``) sits in the description column and is not one."""
    m = re.search(rf"^[ \t]{{0,4}}{re.escape(option)}\b(.*?)(?=\n[ \t]{{0,4}}--[a-z]|\n[ \t]*\n|\n\S|\Z)",
                  text, re.S | re.M)
    # A description wraps at spaces (and may at a hyphen): join the lines again.
    return re.sub(r"-\s*\n\s*", "-", m.group(1)) if m else None


def features(binary) -> Features:
    done = subprocess.run([str(binary), "run", "--help"], capture_output=True, text=True, timeout=60)
    text = done.stdout + done.stderr
    integ = _option_block(text, "--integrator") or ""
    integrators = set(re.findall(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", integ))
    k_block, v_block = _option_block(text, "--k") or "", _option_block(text, "--v") or ""
    return Features(
        help_text=text,
        integrators=integrators,
        unprojected="euler-unprojected" in integ,
        matrices=_option_block(text, "--matrices") is not None,
        save_positions=_option_block(text, "--save-positions") is not None,
        regen_period=_option_block(text, "--regen-period") is not None,
        k_presets={p for p in PRESET_K.values() if p in k_block},
        v_presets={p for p in PRESET_V.values() if p in v_block},
    )


@dataclass
class CheckpointPlan:
    """Where the reference takes its checkpoints for one beta: ``steps`` [nc] the step count of
    each checkpoint, ``frame_steps`` the distinct ones (ascending), ``save_times`` their times
    s * eta (mfattn's frames), ``horizon`` the last of them."""
    beta: float
    eta: float
    checkpoints: np.ndarray
    steps: np.ndarray
    frame_steps: np.ndarray
    save_times: np.ndarray
    horizon: float


def checkpoint_plan(kernel: str, beta: float, step: float = 0.1, rawstep: bool = False,
                    maxtime: float | None = None, count: int = 200) -> CheckpointPlan:
    if maxtime is None:
        maxtime = rp.reference_maxtime(kernel)
    eta = rp.reference_eta(kernel, beta, step, rawstep)
    ckpts = rp.reference_checkpoints(maxtime, count)
    steps = rp.checkpoint_steps(eta, maxtime, ckpts)
    frame_steps = np.unique(steps)
    save_times = frame_steps.astype(np.float64) * eta
    return CheckpointPlan(beta=float(beta), eta=eta, checkpoints=ckpts, steps=steps,
                          frame_steps=frame_steps, save_times=save_times,
                          horizon=float(save_times[-1]))


def run_arguments(plan: CheckpointPlan, feats: Features, *, kernel: str, n: int, d: int,
                  replicas: int, seed: int, integrator: str = "reference", random_kq: int = 0,
                  random_v: int = 0, noanneal: int = 0, regen_period: float = 0.0,
                  keep_positions: bool = False) -> tuple[list[str], list[str]]:
    """`mfattn run` arguments (without --out, --threads) for one beta, and notes on what fell
    back. integrator: "reference" (euler-unprojected; projected euler where the binary lacks
    it), or any mfattn integrator name (e.g. "rk4")."""
    notes: list[str] = []
    if integrator == "reference":
        if feats.unprojected:
            integrator = "euler-unprojected"
        else:
            integrator = "euler"
            notes.append("no --integrator euler-unprojected in this binary: projected euler instead "
                         "(the peer then takes the projected step too)")
    args = ["--n", str(n), "--d", str(d), "--kernel", rp._kernel(kernel), "--beta", repr(float(plan.beta)),
            "--integrator", integrator, "--dt", repr(plan.eta), "--horizon", repr(plan.horizon),
            "--save-times=" + ",".join(repr(float(t)) for t in plan.save_times),
            "--replicas", str(replicas), "--seed", str(seed), "--pair-delta", repr(PAIR_DELTA),
            "--init", "uniform"]
    if random_kq or random_v:
        if not feats.random_matrices(random_kq, random_v):
            raise MissingFeature(f"this binary has no --matrices / --k {PRESET_K[random_kq]} / "
                                 f"--v {PRESET_V[random_v]} (random matrices with the reference's laws)")
        args += ["--q", "identity", "--k", PRESET_K[random_kq], "--v", PRESET_V[random_v],
                 "--matrices", "per-replica" if noanneal == 0 else "shared"]
    if regen_period > 0:
        if not feats.regen_period:
            raise MissingFeature("this binary has no --regen-period")
        args += ["--regen-period", repr(float(regen_period))]
    if feats.save_positions and not keep_positions:
        args += ["--save-positions", "none"]
    elif not keep_positions:
        notes.append("no --save-positions in this binary: every frame's positions are written")
    return args, notes


def read_pair_fraction(path, plan: CheckpointPlan, missing_ok: bool = False) -> np.ndarray:
    """clustered_pair_fraction at each checkpoint of ``plan``: [nc, R]. With ``missing_ok``
    the checkpoints past the file's last frame (a failed run) are NaN."""
    import h5py
    with h5py.File(path, "r", locking=False) as f:
        group = f["observables/clustered_pair_fraction"]
        value = np.asarray(group["value"][()], dtype=np.float64)
        times = np.asarray(group["time"][()], dtype=np.float64)
    if value.ndim == 1:
        value = value[:, np.newaxis]
    idx = np.searchsorted(times, plan.save_times - 1e-9 * np.maximum(1.0, plan.save_times))
    idx = np.minimum(idx, times.size - 1)
    bad = np.abs(times[idx] - plan.save_times) > 1e-9 * np.maximum(1.0, plan.save_times)
    if missing_ok and bad.any():
        value = np.concatenate([value, np.full((1,) + value.shape[1:], np.nan)])
        idx = np.where(bad, value.shape[0] - 1, idx)
    elif bad.any():
        raise ValueError(f"{path}: no frame at t = {plan.save_times[bad][0]!r} (the file holds "
                         f"{times.size} frames up to {times[-1]!r})")
    by_step = dict(zip(plan.frame_steps.tolist(), idx.tolist()))
    return value[[by_step[s] for s in plan.steps.tolist()]]


@dataclass
class PhaseRuns:
    """mfattn's phase diagram in the peer's layout (reference_peer.PhaseDiagram) plus the
    wall time of all runs (``seconds``), the files and the notes on fallbacks."""
    diagram: rp.PhaseDiagram
    seconds: float
    files: list[Path]
    commands: list[list[str]]
    notes: list[str] = field(default_factory=list)


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def run_phase_diagram(binary, out_dir, betas, *, batch: int = 512, n: int = 32, d: int = 2,
                      kernel: str = "sa", step: float = 0.1, rawstep: bool = False,
                      maxtime: float | None = None, checkpoints: int = 200, random_kq: int = 0,
                      random_v: int = 0, noanneal: int = 0, regen_period: float = 0.0,
                      seed: int = 0, integrator: str = "reference", jobs: int | None = None,
                      feats: Features | None = None, tag: str = "", keep_files: bool = True,
                      timeout: float = 3600.0, allow_numerical_failure: bool = False) -> PhaseRuns:
    """One `mfattn run` per beta (``jobs`` at once, cores / jobs threads each), seed
    ``seed + index`` (noanneal 2: ``seed`` for every beta, so the initial states are shared
    too). Returns the statistic at the reference's checkpoints.

    A run that fails raises RuntimeError, except with ``allow_numerical_failure`` a numerical
    failure (exit 3, e.g. USA weights overflowing when rk4's unnormalised stages leave the
    sphere): its checkpoints after the failure are NaN and ``notes`` says which beta failed
    and why."""
    binary = Path(binary)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    feats = feats or features(binary)
    jobs = jobs or default_jobs()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    betas = np.asarray(betas, dtype=np.float64).reshape(-1)
    plans = [checkpoint_plan(kernel, b, step, rawstep, maxtime, checkpoints) for b in betas]
    commands, files, notes = [], [], []
    for i, plan in enumerate(plans):
        args, why = run_arguments(plan, feats, kernel=kernel, n=n, d=d, replicas=batch,
                                  seed=seed if noanneal >= 2 else seed + i, integrator=integrator,
                                  random_kq=random_kq, random_v=random_v, noanneal=noanneal,
                                  regen_period=regen_period)
        for w in why:
            if w not in notes:
                notes.append(w)
        path = out_dir / f"{tag or kernel}_beta{i:03d}.h5"
        files.append(path)
        commands.append([str(binary), "run", *args, "--threads", str(threads), "--quiet",
                         "--overwrite", "--out", str(path)])

    failed: dict[int, str] = {}

    def one(i, cmd):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode == 3 and allow_numerical_failure:
            failed[i] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "exit 3"
        elif done.returncode != 0:
            raise RuntimeError(f"mfattn exited with {done.returncode}: {' '.join(cmd[:12])} ...\n"
                               f"{done.stderr.strip()[-2000:]}")

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for fut in [pool.submit(one, i, c) for i, c in enumerate(commands)]:
            fut.result()
    seconds = time.perf_counter() - t0

    nb, nc = betas.size, plans[0].checkpoints.size
    per_system = np.zeros((nb, nc, batch))
    steps = np.zeros((nb, nc), dtype=np.int64)
    unique = np.zeros((nb, nc), dtype=bool)
    for i, (plan, path) in enumerate(zip(plans, files)):
        if i in failed:
            notes.append(f"beta = {plan.beta:g}: {failed[i]}")
            per_system[i] = read_pair_fraction(path, plan, missing_ok=True) if path.is_file() \
                else np.nan
        else:
            per_system[i] = read_pair_fraction(path, plan)
        steps[i] = plan.steps
        unique[i] = np.concatenate([[True], plan.steps[1:] != plan.steps[:-1]])
        if not keep_files and path.exists():
            path.unlink()
    diagram = rp.PhaseDiagram(
        betas=betas, checkpoints=plans[0].checkpoints, etas=np.array([p.eta for p in plans]),
        steps=steps, unique=unique, mean=per_system.mean(axis=2), per_system=per_system,
        seconds=seconds,
        settings=dict(batch=batch, n=n, d=d, kernel=rp._kernel(kernel), step=step, rawstep=rawstep,
                      maxtime=plans[0].checkpoints[-1], checkpoints=checkpoints,
                      random_kq=random_kq, random_v=random_v, noanneal=noanneal,
                      regen_period=regen_period, seed=seed, integrator=integrator, jobs=jobs,
                      threads=threads, projected_fallback=not feats.unprojected and integrator == "reference"))
    return PhaseRuns(diagram=diagram, seconds=seconds, files=files if keep_files else [],
                     commands=commands, notes=notes)
