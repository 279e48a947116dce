#!/usr/bin/python3
"""The Python module's cost over the engine it wraps (docs/python.md, "Speed"):

1. Model.velocity at n = 4096, d = 3 (USA) per evaluation, against `mfattn bench` per
   evaluation (the same backend, kernel set and threads), interleaved over --repeats rounds;
2. a Python loop of 2000 projected Euler steps at n = 256 that calls Model.velocity and
   normalises with NumPy, against `mfattn run` of the same run (whole process: start, file,
   two frames), and the NumPy step alone (the same loop with a zero field);
3. the per-call overhead: Model.velocity at n = 2 (a pair), median of many calls.

    /usr/bin/python3 bench/python_module.py [--threads 2] [--repeats 5]

Prints a Markdown table with medians and the commands. MFATTN_BINARY and
MFATTN_PYTHON_MODULE_DIR name the binary and the folder holding the package mfattn/ (default
build/mfattn and build/python, the build's package folder).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("MFATTN_PYTHON_MODULE_DIR", str(ROOT / "build" / "python")))
import mfattn  # noqa: E402

BINARY = os.environ.get("MFATTN_BINARY", str(ROOT / "build" / "mfattn"))


def bench_cli(n: int, d: int, threads: int) -> float:
    words = [BINARY, "bench", "--n", str(n), "--d", str(d), "--threads", str(threads), "--min-time", "1"]
    text = subprocess.run(words, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"seconds_per_evaluation (\S+)", text).group(1))


def module_velocity(n: int, d: int, threads: int, min_seconds: float = 1.0) -> float:
    model = mfattn.Model(n=n, d=d, threads=threads)
    x = model.initial_state()
    model.velocity(x)
    calls, start = 0, time.perf_counter()
    while True:
        model.velocity(x)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def euler_loop(model, x: np.ndarray, steps: int, dt: float, field: bool) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        v = model.velocity(x) if field else np.zeros_like(x)
        x = x + dt * v
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return time.perf_counter() - start


def cli_run(n: int, steps: int, dt: float, threads: int, folder: str) -> float:
    words = [BINARY, "run", "--n", str(n), "--d", "3", "--integrator", "euler", "--dt", repr(dt),
             "--horizon", repr(steps * dt), "--save-every", repr(steps * dt), "--threads", str(threads),
             "--quiet", "--overwrite", "--out", os.path.join(folder, "cli.h5")]
    start = time.perf_counter()
    subprocess.run(words, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    a = parser.parse_args()

    bench, module, loop, cli, numpy_only, overhead = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as folder:
        model256 = mfattn.Model(n=256, d=3, threads=a.threads)
        x256 = model256.initial_state()
        pair = mfattn.Model(n=2, d=3, threads=1)
        x2 = pair.initial_state()
        for _ in range(a.repeats):
            bench.append(bench_cli(4096, 3, a.threads))
            module.append(module_velocity(4096, 3, a.threads))
            loop.append(euler_loop(model256, x256, 2000, 0.01, True))
            numpy_only.append(euler_loop(model256, x256, 2000, 0.01, False))
            cli.append(cli_run(256, 2000, 0.01, a.threads, folder))
            start = time.perf_counter()
            for _ in range(20000):
                pair.velocity(x2)
            overhead.append((time.perf_counter() - start) / 20000)
    med = statistics.median
    kernels = subprocess.run([BINARY, "--version"], capture_output=True, text=True).stdout
    chosen = re.search(r"cpu kernels: (\S+)", kernels)
    print(f"mfattn {mfattn.__version__}, {a.threads} threads, cpu kernels "
          f"{chosen.group(1) if chosen else '?'} (MFATTN_CPU_KERNELS={os.environ.get('MFATTN_CPU_KERNELS', 'unset')}),"
          f" medians of {a.repeats} interleaved rounds\n")
    print("| measure | module | command line | ratio |")
    print("|---|---|---|---|")
    print(f"| velocity, n = 4096, d = 3, USA, per evaluation | {med(module) * 1e3:.3f} ms | "
          f"{med(bench) * 1e3:.3f} ms (`mfattn bench --n 4096 --d 3 --threads {a.threads}`) | "
          f"{med(module) / med(bench):.3f} |")
    print(f"| 2000 Euler steps at n = 256 (Python loop of Model.velocity + NumPy normalisation) | "
          f"{med(loop):.3f} s | {med(cli):.3f} s (`mfattn run --n 256 --integrator euler --dt 0.01 "
          f"--horizon 20`, whole process) | {med(loop) / med(cli):.2f} |")
    print(f"| the loop's NumPy step alone (zero field) | {med(numpy_only):.3f} s | | |")
    print(f"| one call of Model.velocity at n = 2 (the per-call overhead) | {med(overhead) * 1e6:.2f} us | | |")


if __name__ == "__main__":
    main()
