#!/usr/bin/python3
"""Gradients through whole runs against the runs themselves (docs/performance.md, "Gradients
through whole runs"): rk4 with Gaussian Q, K, V (the one-sided loop), at n = 4096, d = 3 and
n = 1024, d = 64, H = 8 (r = 8, the preset's plain values), everything on `--threads` threads:

1. the forward run (mfattn.run, one frame at the end: the steps of dt alone) against
   mfattn._core.gradient of the same run (its forward pass and the adjoint; no trajectory
   written) with the default checkpoints, with every state stored, and with `--few`
   checkpoints;
2. the peak memory (VmHWM of a fresh process) of each;
3. PyTorch float64 autograd through the same rk4 steps at n = 1024, d = 64, H = 8, each step
   under torch.utils.checkpoint, per step against mfattn's gradient per step.

    /usr/bin/python3 bench/run_gradient.py [--threads 2] [--steps 50] [--wide-steps S] [--few 4]
        [--wide-few K] [--torch-steps 4]

(--wide-steps and --wide-few: the steps and few checkpoints at n = 1024, d = 64, H = 8; default
--steps and --few.)

Prints a Markdown table and the command. MFATTN_PYTHON_MODULE_DIR names the folder holding the
package mfattn/ (default build/python); MFATTN_CPU_KERNELS picks the kernel set.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = os.environ.get("MFATTN_PYTHON_MODULE_DIR", str(ROOT / "build" / "python"))


def options_of(n: int, d: int, heads: int, steps: int, threads: int) -> dict:
    dt = 0.01
    options = dict(n=n, d=d, kernel="sa", q="gaussian", k="gaussian", v="gaussian", threads=threads,
                   integrator="rk4", dt=dt, horizon=steps * dt, save_every=steps * dt, seed=1)
    if heads > 1:
        options.update(heads=heads, head_dim=d // heads, values="plain", beta=(d // heads) ** -0.5)
    return options


def measured(kind: str, options: dict, checkpoints) -> dict:
    """Seconds and peak MB of one call in a fresh process: the run, or the gradient."""
    code = f"""
import json, sys, time, tempfile, numpy as np
sys.path.insert(0, {MODULE!r})
import mfattn
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) / 1024
options = {options!r}
x = mfattn.Model(**options).initial_state()
c = np.random.default_rng(0).standard_normal(x.shape)
before = peak()
start = time.perf_counter()
if {kind!r} == "run":
    with tempfile.TemporaryDirectory() as folder:
        mfattn.run(out=folder + "/run.h5", **options)
    plan = None
else:
    plan = {{k: v for k, v in mfattn._core.gradient(c, checkpoints={checkpoints!r}, **options)[3].items()
            if k != "step_sizes"}}
seconds = time.perf_counter() - start
print(json.dumps(dict(seconds=seconds, peak=peak(), before=before, plan=plan)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.split("\n")[-2])


def torch_seconds_per_step(options: dict, steps: int) -> float:
    """Seconds per step of PyTorch float64 autograd through the same rk4 steps of the same field
    (bench/derivatives.py's, written from docs/model.md), each step under
    torch.utils.checkpoint (so that only the steps' states are kept), forward and backward of
    <c, x(T)>, in a process of its own after one warm-up step."""
    code = f"""
import sys, time, numpy as np, torch
from torch.utils.checkpoint import checkpoint
sys.path.insert(0, {MODULE!r}); sys.path.insert(0, {str(ROOT / "bench")!r})
import mfattn
from derivatives import torch_field_function
options = {options!r}
model = mfattn.Model(**options)
f = torch_field_function(model.weights(), model.beta, options["threads"])
h = options["dt"]
def step(x):
    k1 = f(x); k2 = f(x + h / 2 * k1); k3 = f(x + h / 2 * k2); k4 = f(x + h * k3)
    y = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y / y.norm(dim=1, keepdim=True)
x0 = torch.tensor(model.initial_state(), requires_grad=True)
c = torch.tensor(np.random.default_rng(0).standard_normal(tuple(x0.shape)))
def gradient(count):
    x = x0
    for _ in range(count):
        x = checkpoint(step, x, use_reentrant=False)
    torch.autograd.grad((c * x).sum(), [x0])
gradient(1)
start = time.perf_counter()
gradient({steps})
print((time.perf_counter() - start) / {steps})
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    kernels = os.environ.get("MFATTN_CPU_KERNELS", "default")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for option, default in (("--threads", 2), ("--steps", 50), ("--few", 4), ("--torch-steps", 4),
                            ("--wide-steps", 0), ("--wide-few", 0)):
        parser.add_argument(option, type=int, default=default)
    args = parser.parse_args()
    wide_steps, wide_few = args.wide_steps or args.steps, args.wide_few or args.few
    columns = ["n", "d", "H", "run", "gradient, checkpoints", "stored states", "recomputed steps", "gradient / run",
               "peak memory (run: gradient)"]
    print(f"kernel set: {kernels}; threads {args.threads}; rk4, {args.steps} steps (d = 64: {wide_steps})\n")
    print("| " + " | ".join(columns) + " |\n" + "| --- " * len(columns) + "|")
    per_step = {}
    for n, d, heads in ((4096, 3, 1), (1024, 64, 8)):
        steps, few = (args.steps, args.few) if d == 3 else (wide_steps, wide_few)
        options = options_of(n, d, heads, steps, args.threads)
        run = measured("run", options, None)
        for checkpoints in (None, steps, few):
            grad = measured("gradient", options, checkpoints)
            plan = grad["plan"]
            label = "default" if checkpoints is None else str(checkpoints)
            print(f"| {n} | {d} | {heads} | {run['seconds']:.3g} s | {grad['seconds']:.3g} s ({label}) | "
                  f"{plan['stored_states']} | {plan['recomputed_steps']} | {grad['seconds'] / run['seconds']:.2f} | "
                  f"{run['peak']:.0f} MB : {grad['peak']:.0f} MB |")
            if checkpoints is None:
                per_step[(n, d, heads)] = grad["seconds"] / steps
    options = options_of(1024, 64, 8, wide_steps, args.threads)
    torch_step = torch_seconds_per_step(options, args.torch_steps)
    ours = per_step[(1024, 64, 8)]
    print(f"\nn = 1024, d = 64, H = 8, a step's gradient: mfattn {ours:.3g} s (default checkpoints), PyTorch "
          f"autograd with torch.utils.checkpoint per step {torch_step:.3g} s ({args.torch_steps} steps): "
          f"{torch_step / ours:.1f} times mfattn's")
    print(f"\ncommand: MFATTN_CPU_KERNELS={kernels} /usr/bin/python3 bench/run_gradient.py --threads {args.threads} "
          f"--steps {args.steps} --wide-steps {wide_steps} --few {args.few} --wide-few {wide_few} "
          f"--torch-steps {args.torch_steps}")


if __name__ == "__main__":
    main()
