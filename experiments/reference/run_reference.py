#!/usr/bin/python3
"""The experiments of the reference code of arXiv:2312.10794 (repository
borjanG/2023-transformers-rotf) run by mfattn, each with the reference's step and beside it
with --integrator rk4 (same dt), so a reader sees what the first-order step does.

phase: phase-diagrams.py. For kernel in (sa, usa) x matrices in (identity, random per system:
    randomKQ 1 / randomV 1 unless --random-kq / --random-v) x integrator in (reference step,
    rk4): one mfattn run per beta with `--replicas batch`, frames at the reference's checkpoint
    steps (experiments/reference/mfattn_reference.py), the batch mean and standard error of
    clustered_pair_fraction written to OUT/phase_diagram/<kernel>_<matrices>_<integrator>.npz.
    Defaults are the reference's: batch 2048, 90 betas linspace(0.1, 9, 90), step 0.1 (USA:
    the capped step 0.1 / max(sqrt(beta) e^(beta - 1/2), 1)), T = 30 (SA) and 1 (USA), 200
    checkpoints.
sphere: sphere.py. n = 64, d = 3, beta = 1, SA, T = 15, dt = 0.1, every step a frame:
    OUT/sphere/reference.h5 and OUT/sphere/rk4.h5; the NumPy peer (tests/peers/
    reference_peer.py) from the file's frame 0 is compared with every frame of reference.h5.

--quick: a tiny version of either (seconds), for the tests: 32 systems, 3 betas in [0.1, 4],
T = 2 (SA) and 0.1 (USA); the sphere at n = 16 to T = 2. A configuration the binary cannot
run (no per-replica presets) is left out with a note; without euler-unprojected the
"reference" runs take the projected euler step, and say so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import mfattn_reference as mr  # noqa: E402
import reference_peer as rp  # noqa: E402  (mfattn_reference puts tests/peers on the path)


def binary_path(given) -> Path:
    path = Path(given or os.environ.get("MFATTN_BINARY") or ROOT / "build" / "mfattn")
    if not path.is_file():
        raise SystemExit(f"run_reference: no mfattn binary at {path}")
    return path


def phase(a) -> int:
    binary = binary_path(a.mfattn)
    feats = mr.features(binary)
    out = Path(a.out_dir) / "phase_diagram"
    out.mkdir(parents=True, exist_ok=True)
    if a.quick:
        a.batch, a.betas, a.checkpoints, a.beta_max = 32, 3, 200, 4.0
        maxtimes = {"sa": 2.0, "usa": 0.1}
    else:
        maxtimes = {"sa": a.maxtime_sa, "usa": a.maxtime_usa}
    betas = np.linspace(a.beta_min, a.beta_max, a.betas)
    notes = []
    for kernel in a.kernels.split(","):
        for matrices in a.matrices.split(","):
            kq, v = (a.random_kq, a.random_v) if matrices == "random" else (0, 0)
            for integrator in a.integrators.split(","):
                name = f"{kernel}_{matrices}_{integrator}"
                if (matrices == "random" and not feats.random_matrices(kq, v)):
                    notes.append(f"{name}: left out (no --matrices per-replica with --k "
                                 f"{mr.PRESET_K[kq]} / --v {mr.PRESET_V[v]} in this binary)")
                    print(f"run_reference: {notes[-1]}", flush=True)
                    continue
                t0 = time.perf_counter()
                runs = mr.run_phase_diagram(
                    binary, out / "runs", betas, batch=a.batch, n=a.n, d=a.d, kernel=kernel,
                    step=a.step, maxtime=maxtimes[kernel], checkpoints=a.checkpoints,
                    random_kq=kq, random_v=v, noanneal=0, seed=a.seed, integrator=integrator,
                    jobs=a.jobs, feats=feats, tag=name, keep_files=False,
                    allow_numerical_failure=True)
                seconds = time.perf_counter() - t0
                dg = runs.diagram
                settings = dict(dg.settings, name=name, matrices=matrices, seconds=seconds,
                                notes=runs.notes, binary_integrator=(
                                    "euler-unprojected" if integrator == "reference" and feats.unprojected
                                    else "euler" if integrator == "reference" else integrator))
                np.savez(out / f"{name}.npz", betas=dg.betas, checkpoints=dg.checkpoints,
                         etas=dg.etas, steps=dg.steps, mean=dg.mean,
                         se=rp.standard_error(dg.per_system), settings=json.dumps(settings))
                for w in runs.notes:
                    w = f"{name}: {w}" if w.startswith("beta =") else w
                    if w not in notes:
                        notes.append(w)
                print(f"run_reference: {name}: {len(betas)} betas x {a.batch} systems in "
                      f"{seconds:.1f} s -> {out / (name + '.npz')}", flush=True)
    try:
        (out / "runs").rmdir()
    except OSError:
        pass
    for w in notes:
        print(f"note: {w}")
    return 0


def sphere(a) -> int:
    binary = binary_path(a.mfattn)
    feats = mr.features(binary)
    out = Path(a.out_dir) / "sphere"
    out.mkdir(parents=True, exist_ok=True)
    n, T = (16, 2.0) if a.quick else (a.n, a.T)
    reference = "euler-unprojected" if feats.unprojected else "euler"
    if not feats.unprojected:
        print("note: no --integrator euler-unprojected in this binary: projected euler instead")
    for tag, integrator in (("reference", reference), ("rk4", "rk4")):
        cmd = [str(binary), "run", "--n", str(n), "--d", "3", "--beta", repr(a.beta), "--kernel",
               "sa", "--integrator", integrator, "--dt", "0.1", "--horizon", repr(T),
               "--save-every", "0.1", "--seed", str(a.seed), "--quiet", "--overwrite", "--out",
               str(out / f"{tag}.h5")]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"run_reference: mfattn failed ({done.returncode}): {' '.join(cmd)}\n"
                             f"{done.stderr}")
        print(f"run_reference: sphere {tag} ({integrator}) n={n}: {time.perf_counter() - t0:.2f} s "
              f"-> {out / (tag + '.h5')}", flush=True)
    try:
        from mfattn.io import load  # the package mfattn of analysis/ (run_with_figures.sh sets PYTHONPATH)
    except ModuleNotFoundError as missing:
        raise SystemExit(f"run_reference: {missing}: run it through sphere.sh, or with PYTHONPATH=analysis from "
                         "the repository root") from None
    tr = load(out / "reference.h5")
    z = rp.sphere_run(n=n, d=3, beta=a.beta, T=T, dt=0.1, x0=tr.positions[0],
                      project=not feats.unprojected)
    err = float(np.abs(tr.positions - z).max()) if z.shape == tr.positions.shape else float("inf")
    rk = load(out / "rk4.h5")
    gap = float(np.abs(rk.positions - tr.positions).max())
    print(f"run_reference: sphere: the NumPy peer of sphere.py from the same start differs from "
          f"mfattn's {reference} run by at most {err:.2e} over {tr.frames} frames; "
          f"rk4 differs from it by at most {gap:.2e}")
    return 0 if err < 1e-10 else 1


def comma_list(accepted: tuple[str, ...]):
    """An argparse type: a comma-separated list of some of ``accepted``, in the given order;
    anything else is an error naming the value and what is accepted."""
    def parse(text: str) -> str:
        items = [item.strip() for item in text.split(",")]
        unknown = [item for item in items if item not in accepted]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: accepted: a comma-separated list of "
                                             f"{', '.join(accepted)}")
        return ",".join(items)
    return parse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    ph = sub.add_parser("phase", help="phase-diagrams.py")
    ph.add_argument("--mfattn", default=None, help="binary (default $MFATTN_BINARY, build/mfattn)")
    ph.add_argument("--out-dir", default=str(ROOT / "data" / "reference"),
                    help="folder for phase_diagram/*.npz (default: data/reference of the checkout)")
    ph.add_argument("--kernels", default="sa,usa", type=comma_list(("sa", "usa")),
                    help="comma-separated, of: sa, usa (default sa,usa)")
    ph.add_argument("--matrices", default="identity,random", type=comma_list(("identity", "random")),
                    help="comma-separated, of: identity, random (per-system draws; default both)")
    ph.add_argument("--integrators", default="reference,rk4", type=comma_list(("reference", "rk4")),
                    help="comma-separated, of: reference (the reference's step), rk4 (default both)")
    ph.add_argument("--random-kq", type=int, default=1, choices=[1, 2, 3],
                    help="the reference's randomKQ preset for random matrices: 1, 2 or 3 (default 1)")
    ph.add_argument("--random-v", type=int, default=1, choices=[0, 1, 2, 3],
                    help="the reference's randomV preset: 0, 1, 2 or 3 (default 1)")
    ph.add_argument("--batch", type=int, default=2048, help="systems per beta (default 2048)")
    ph.add_argument("--n", type=int, default=32, help="tokens per system (default 32)")
    ph.add_argument("--d", type=int, default=2, help="dimension (default 2)")
    ph.add_argument("--betas", type=int, default=90, help="number of betas (default 90)")
    ph.add_argument("--beta-min", type=float, default=0.1, help="smallest beta (default 0.1)")
    ph.add_argument("--beta-max", type=float, default=9.0, help="largest beta (default 9)")
    ph.add_argument("--maxtime-sa", type=float, default=30.0, help="horizon of the SA runs (default 30)")
    ph.add_argument("--maxtime-usa", type=float, default=1.0, help="horizon of the USA runs (default 1)")
    ph.add_argument("--step", type=float, default=0.1,
                    help="the step (default 0.1; USA: capped at 0.1 / max(sqrt(beta) e^(beta - 1/2), 1))")
    ph.add_argument("--checkpoints", type=int, default=200, help="frames per run (default 200)")
    ph.add_argument("--seed", type=int, default=0, help="seed of the initial states (default 0)")
    ph.add_argument("--jobs", type=int, default=mr.default_jobs(), help="runs at once (default: the cores)")
    ph.add_argument("--quick", action="store_true", help="32 systems, 3 betas up to 4, T = 2 (SA), 0.1 (USA)")
    sp = sub.add_parser("sphere", help="sphere.py")
    sp.add_argument("--mfattn", default=None, help="binary (default $MFATTN_BINARY, build/mfattn)")
    sp.add_argument("--out-dir", default=str(ROOT / "data" / "reference"),
                    help="folder for sphere/*.h5 (default: data/reference of the checkout)")
    sp.add_argument("--n", type=int, default=64, help="tokens (default 64)")
    sp.add_argument("--T", type=float, default=15.0, help="horizon (default 15)")
    sp.add_argument("--beta", type=float, default=1.0, help="beta (default 1)")
    sp.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    sp.add_argument("--quick", action="store_true", help="n = 16, T = 2")
    a = p.parse_args(argv)
    return phase(a) if a.command == "phase" else sphere(a)


if __name__ == "__main__":
    sys.exit(main())
