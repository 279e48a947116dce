#!/usr/bin/env python3
"""Whole trajectories of two or more mfattn binaries (or kernel sets), case by case.

Usage (Debian's Python, which has h5py and NumPy):
  /usr/bin/python3 tests/compare_builds.py REFERENCE OTHER [OTHER ...] [--bitwise] [--threads T]

Each binary is a path, optionally followed by environment settings for it, comma-separated:
  build/mfattn  build/mfattn,MFATTN_CPU_KERNELS=avx2  /tmp/old/build/mfattn

Every case runs `mfattn run` for 20 RK4 steps (dopri5 and Euler-Maruyama where the case says)
at n = 150 (the small-system cases at n <= 48) with frames at t = 0.5 and 1, once per binary, and compares the whole
/particles/tokens/position/value arrays with the reference's. The cases cover what a change
to the pair loops or the physics can break: the three CPU loops, d = 3, 4, 20 and 64, SA and USA,
random Q, K and V, RoPE and axial/mixed gauges, transported and plain values, the causal,
window and per-prompt masks, every auxiliary factor, prefix tokens, presence amplitudes and
null tokens, noise, dopri5 and replicas, whole layers (heads of r < d, feed-forward terms),
Sinkhorn attention, every normalization placement; the `meanfield` cases run `mfattn
meanfield` to t = 1 (the circle by FFT, by the pair loop and with labels, S^2 with and without
labels, a zonal grid) and compare /fields/density/value.

Prints one row per case: the largest |x_other - x_reference| for each other binary.
--observables: compare every /observables series too (the energy, inner products, ...), and
name the series that differ.
--bitwise: exit 1 unless every array is identical to the reference's, bit for bit (a
refactoring's check); otherwise exit 1 when a difference exceeds --tolerance (1e-12: what
separate builds and kernel sets must meet, docs/cpu-kernels.md).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

# Presence amplitudes for n = 150: some null (p = 0), some fractional, some above 1.
PRESENCE = ",".join(("1", "0.5", "2", "0", "1", "0.25")[i % 6] for i in range(150))

CASES = {
    "symmetric d3 usa": ["--d", "3", "--kernel", "usa"],
    "symmetric d4 sa presence": ["--d", "4", "--kernel", "sa", "--amplitudes", PRESENCE],
    "symmetric d20 sa rope": ["--d", "20", "--kernel", "sa", "--geometry", "rope"],
    "symmetric d64 sa": ["--d", "64", "--kernel", "sa", "--beta", "4"],
    "symmetric d3 window distance": ["--d", "3", "--kernel", "sa", "--mask", "window", "--window", "30",
                                     "--aux-factor", "distance", "--aux-lambda", "0.05"],
    "symmetric d20 gaussian null tokens": ["--d", "20", "--kernel", "usa", "--aux-factor", "gaussian",
                                           "--aux-sigma", "20", "--null-tokens", "13"],
    "one-sided d3 causal": ["--d", "3", "--kernel", "sa", "--mask", "causal"],
    "one-sided d20 random q": ["--d", "20", "--kernel", "usa", "--q", "gaussian", "--beta", "0.5"],
    "one-sided d3 random k v plain values": ["--d", "3", "--kernel", "sa", "--k", "gaussian", "--v", "gaussian",
                                             "--geometry", "rope", "--values", "plain"],
    "one-sided d4 cosine": ["--d", "4", "--kernel", "usa", "--aux-factor", "cosine", "--aux-omega", "0.3"],
    "one-sided d3 toeplitz window": ["--d", "3", "--kernel", "usa", "--aux-factor", "toeplitz",
                                     "--toeplitz-coefficients", "1,-0.5,0.25", "--toeplitz-frequencies",
                                     "0.1,0.4,1.3", "--mask", "window", "--window", "40"],
    "one-sided d20 causal gaussian": ["--d", "20", "--kernel", "sa", "--mask", "causal", "--aux-factor", "gaussian",
                                      "--aux-sigma", "20"],
    "small d3 usa n40": ["--n", "40", "--d", "3", "--kernel", "usa"],
    "small d4 sa presence v n33": ["--n", "33", "--d", "4", "--kernel", "sa", "--v", "gaussian", "--amplitudes",
                                   ",".join(("1", "0.5", "0")[i % 3] for i in range(33))],
    "small d2 sa rescaled n48": ["--n", "48", "--d", "2", "--kernel", "sa", "--beta", "30", "--time-scale",
                                 "rescaled"],
    "symmetric d3 power": ["--d", "3", "--kernel", "usa", "--aux-factor", "power", "--aux-power", "0.7"],
    "one-sided d20 causal power": ["--d", "20", "--kernel", "sa", "--mask", "causal", "--aux-factor", "power",
                                   "--aux-power", "1.5"],
    "one-sided d3 causal distance": ["--d", "3", "--kernel", "usa", "--mask", "causal", "--aux-factor", "distance",
                                     "--aux-lambda", "0.1"],
    "prefix d3 per-prompt": ["--d", "3", "--kernel", "sa", "--prefix", "5", "--mask", "per-prompt", "--prompts", "3"],
    "prefix d3 gaussian energy": ["--d", "3", "--kernel", "usa", "--prefix", "4", "--aux-factor", "gaussian",
                                  "--aux-sigma", "3", "--positions", "uniform"],
    "prefix d20 weight": ["--d", "20", "--kernel", "sa", "--prefix", "7", "--prefix-weight", "2.5"],
    "dopri5 d3 sa replicas": ["--d", "3", "--kernel", "sa", "--integrator", "dopri5", "--replicas", "3"],
    "noise d3 usa": ["--d", "3", "--kernel", "usa", "--integrator", "euler-maruyama", "--noise-kappa", "0.5"],
    # The scalar consumers of the kernels layer: the reference backend and, with a prefix, the
    # energy's prefix rows (compared with --observables).
    "reference d3 causal distance prefix": ["--d", "3", "--kernel", "sa", "--backend", "reference", "--mask",
                                            "causal", "--aux-factor", "distance", "--aux-lambda", "0.1",
                                            "--prefix", "4"],
    "reference d4 cosine rope": ["--d", "4", "--kernel", "usa", "--backend", "reference", "--aux-factor",
                                 "cosine", "--aux-omega", "0.3", "--geometry", "rope"],
    "reference d3 gaussian prefix": ["--d", "3", "--kernel", "usa", "--backend", "reference", "--aux-factor",
                                     "gaussian", "--aux-sigma", "3", "--prefix", "4", "--positions", "uniform"],
    "reference d3 per-prompt window": ["--d", "3", "--kernel", "usa", "--backend", "reference", "--prefix", "5",
                                       "--mask", "per-prompt", "--prompts", "3"],
    # A whole layer (heads of r < d, a feed-forward term), Sinkhorn attention and the
    # normalization placements, on the cpu and the reference backend.
    "layer d6 heads mlp": ["--d", "6", "--kernel", "sa", "--heads", "3", "--head-dim", "2", "--q", "gaussian",
                           "--k", "gaussian", "--v", "gaussian", "--mlp", "8", "--mlp-activation", "gelu"],
    "layer d4 heads rope usa": ["--d", "4", "--kernel", "usa", "--heads", "2", "--head-dim", "4", "--q", "gaussian",
                                "--geometry", "rope", "--beta", "0.5"],
    "layer d3 heads prefix per-prompt": ["--d", "3", "--kernel", "sa", "--heads", "2", "--head-dim", "3", "--prefix",
                                         "4", "--mask", "per-prompt", "--prompts", "3", "--mlp", "5"],
    "reference layer d5 heads mlp": ["--d", "5", "--kernel", "sa", "--backend", "reference", "--heads", "2",
                                     "--head-dim", "3", "--q", "gaussian", "--k", "gaussian", "--mlp", "6",
                                     "--mlp-activation", "tanh"],
    "sinkhorn d3": ["--d", "3", "--kernel", "sinkhorn"],
    "sinkhorn d4 window rope": ["--d", "4", "--kernel", "sinkhorn", "--mask", "window", "--window", "30", "--geometry", "rope",
                                "--sinkhorn-iterations", "20"],
    "sinkhorn layer d4 heads": ["--d", "4", "--kernel", "sinkhorn", "--heads", "2", "--head-dim", "2", "--q",
                                "gaussian", "--k", "gaussian"],
    "reference sinkhorn d3 prefix": ["--d", "3", "--kernel", "sinkhorn", "--backend", "reference", "--prefix", "3"],
    **{f"placement {placement} d4 sa": ["--d", "4", "--kernel", "sa", "--normalization", placement, "--q", "gaussian"]
       for placement in ("pre", "peri", "ngpt", "none")},
    "placement pre layer d4 mlp": ["--d", "4", "--kernel", "usa", "--normalization", "pre", "--heads", "2",
                                   "--mlp", "6"],
    "reference placement peri d3": ["--d", "3", "--kernel", "sa", "--backend", "reference", "--normalization",
                                    "peri"],
    # The mean-field solvers (mfattn meanfield; /fields/density/value is compared): the circle
    # by FFT, by the pair loop and with label nodes, S^2 with and without labels, zonal grids.
    "meanfield circle fourier": {"meanfield": ["--d", "2", "--beta", "3", "--grid", "128", "--init-density", "vmf",
                                               "--init-kappa", "1"]},
    "meanfield circle quadrature": {"meanfield": ["--d", "2", "--beta", "2", "--grid", "48", "--q", "gaussian",
                                                  "--perturbation", "2,0.05"]},
    "meanfield circle labels rope": {"meanfield": ["--d", "2", "--grid", "32", "--label-points", "4", "--positions",
                                                   "uniform", "--geometry", "rope", "--perturbation", "1,0.05",
                                                   "--kernel", "sa"]},
    "meanfield sphere": {"meanfield": ["--d", "3", "--grid", "12", "--noise-kappa", "8", "--perturbation", "2,0.05"]},
    "meanfield sphere labels": {"meanfield": ["--d", "3", "--grid", "8", "--label-points", "4", "--positions",
                                              "uniform", "--geometry", "rope", "--rope-freqs", "1", "--init-density",
                                              "vmf", "--noise-kappa", "10"]},
    "meanfield zonal d8": {"meanfield": ["--d", "8", "--zonal", "--beta", "2", "--grid", "96", "--init-density", "vmf",
                                         "--init-kappa", "2", "--kernel", "sa"]},
}


def observed(f):
    """Every time series under /observables, by name (--observables)."""
    series = {}
    if "observables" in f:
        for name, group in f["observables"].items():
            if isinstance(group, h5py.Group) and "value" in group:
                series["observables/" + name] = group["value"][...]
    return series


def run_case(spec, extra, out, threads, observables=False, is_reference=False):
    binary, *settings = spec.split(",")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    for setting in settings:
        key, value = setting.split("=", 1)
        env[key] = value
    if isinstance(extra, dict):
        # A density (mfattn meanfield): frames at t = 0.5 and 1 of the default step control.
        argv = [binary, "meanfield", "--horizon", "1", "--save-every", "0.5", "--threads", str(threads), "--quiet",
                "--overwrite", "--out", out, *extra["meanfield"]]
        subprocess.run(argv, check=True, env=env, stderr=subprocess.PIPE if is_reference else None, text=True)
        with h5py.File(out, "r") as f:
            arrays = {"position": f["fields/density/value"][...]}
            if observables:
                arrays.update(observed(f))
            return arrays
    # n = 150 unless the case names its own (the small-system loop takes at most 48 tokens).
    size = [] if "--n" in extra else ["--n", "150"]
    argv = [binary, "run", *size, "--horizon", "1", "--save-every", "0.5", "--dt", "0.05",
            "--seed", "3", "--threads", str(threads), "--quiet", "--overwrite", "--out", out]
    argv += extra + ([] if "--integrator" in extra else ["--integrator", "rk4"])
    # The reference's stderr is kept for its refusals (an older binary without an option).
    subprocess.run(argv, check=True, env=env, stderr=subprocess.PIPE if is_reference else None, text=True)
    with h5py.File(out, "r") as f:
        arrays = {"position": f["particles/tokens/position/value"][...]}
        if observables:
            arrays.update(observed(f))
        return arrays


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binaries", nargs="+", help="REFERENCE OTHER [OTHER ...] (path[,VAR=VALUE...])")
    parser.add_argument("--bitwise", action="store_true", help="require identical bits")
    parser.add_argument("--tolerance", type=float, default=1e-12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--observables", action="store_true",
                        help="compare every /observables series too (energy, inner products, ...)")
    a = parser.parse_args()
    if len(a.binaries) < 2:
        parser.error("give a reference and at least one binary to compare with it")
    failed = False
    skipped = 0
    with tempfile.TemporaryDirectory() as tmp:
        width = max(len(name) for name in CASES)
        print(f"{'case':{width}s}  " + "  ".join(f"{os.path.basename(b.split(',')[0])}{b[len(b.split(',')[0]):]}"
                                                 for b in a.binaries[1:]))
        for name, extra in CASES.items():
            try:
                reference = run_case(a.binaries[0], extra, os.path.join(tmp, "reference.h5"), a.threads,
                                     a.observables, is_reference=True)
            except subprocess.CalledProcessError as error:
                if error.returncode != 2:
                    sys.stderr.write(error.stderr or "")
                    raise
                # An older reference binary without an option of the case (exit 2, a usage
                # error): nothing to compare with.
                print(f"{name:{width}s}  skipped: the reference binary refuses these options")
                skipped += 1
                continue
            row = []
            for spec in a.binaries[1:]:
                other = run_case(spec, extra, os.path.join(tmp, "other.h5"), a.threads, a.observables)
                worst, identical, notes = 0.0, True, []
                for key, expected in reference.items():
                    got = other.get(key)
                    if got is None or got.shape != expected.shape:
                        notes.append(f"{key}: shape {'missing' if got is None else got.shape}")
                        failed = True
                        continue
                    same = got.tobytes() == expected.tobytes()
                    both_nan = np.isnan(got) & np.isnan(expected)
                    diff = float(np.max(np.where(both_nan, 0.0, np.abs(got - expected)), initial=0.0))
                    if not same and key != "position":
                        notes.append(f"{key.split('/')[-1]} {diff:.1e}")
                    identical = identical and same
                    worst = max(worst, diff)
                    failed = failed or (not same if a.bitwise else not diff <= a.tolerance)
                row.append(("identical" if identical else f"{worst:.2e}") +
                           (" (" + ", ".join(notes) + ")" if notes else ""))
            print(f"{name:{width}s}  " + "  ".join(row))
    if skipped == len(CASES):
        print("no case ran: the reference binary refused every one")
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
