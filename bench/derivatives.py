#!/usr/bin/python3
"""The derivatives of the field against the field and against PyTorch (docs/performance.md,
"Derivatives of the field"), with Gaussian Q, K, V (the one-sided loop):

1. one Model.vjp and one Model.jvp against one Model.velocity of the same model and state, at
   n = 4096, d = 3 (one head) and at n = 1024, d = 64, H = 8 (r = 8), all on `--threads`
   threads;
2. PyTorch float64 autograd of the same field (the layer that mfattn.export_torch's weights
   define: plain values, no gauge, SA, the velocity's tangent projection) at n = 1024, d = 64,
   H = 8: forward and backward of <w, v(x)>, torch on `--threads` threads;
3. the peak memory (VmHWM of a fresh process) of one VJP at n = 8000 and n = 50000, d = 3,
   and of PyTorch's autograd of the same field at n = 8000 (n = 50000 would need 20 GB per
   n x n matrix).

    /usr/bin/python3 bench/derivatives.py [--threads 2] [--repeats 3]

Prints a Markdown table of medians and the command. MFATTN_PYTHON_MODULE_DIR names the folder
holding the package mfattn/ (default build/python). MFATTN_CPU_KERNELS picks the kernel set of
the velocity and of the derivatives' lanes, as everywhere.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("MFATTN_PYTHON_MODULE_DIR", str(ROOT / "build" / "python")))
if os.environ.get("MFATTN_BENCH_NO_MODULE") != "1":  # PyTorch's own process (torch_seconds)
    import mfattn  # noqa: E402


def interleaved_seconds(calls: dict, repeats: int) -> dict:
    """The median time of each call, the calls taken in turn in each repeat, so that a change in
    the machine's speed during the run (a shared machine's) weighs on all of them alike."""
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(each) for name, each in times.items()}


def model_of(n: int, d: int, heads: int, threads: int, value_rows: str = "d"):
    """The preset: Gaussian Q, K, V; heads of r = d / H with plain values, whose value matrices
    keep d rows (rv = d, the preset's). value_rows="r": the same queries and keys, r value rows
    per head and a Gaussian output map [d, H r] (the layer of a PyTorch multi-head attention)."""
    options = dict(n=n, d=d, kernel="sa", q="gaussian", k="gaussian", v="gaussian", threads=threads)
    if heads > 1:
        options.update(heads=heads, head_dim=d // heads, values="plain", beta=1 / np.sqrt(d // heads))
    model = mfattn.Model(**options)
    if value_rows == "r":
        r = d // heads
        weights = model.weights()
        weights["attention/value"] = weights["attention/value"][:, :r, :].copy()
        weights["attention/output"] = np.random.default_rng(2).standard_normal((d, heads * r)) / np.sqrt(heads * r)
        del options["q"], options["k"], options["v"], options["values"]
        model = mfattn.Model(**options, weights=weights)
    return model


def torch_field(model, x: np.ndarray, threads: int):
    """PyTorch float64 of the same field, written from docs/model.md sections 2 and 2b: SA heads
    with plain values, V_h = O_h A_h, and the tangent projection; returns (x, v)."""
    return torch_field_of(model.weights(), model.beta, x, threads)


def torch_field_function(weights: dict, beta: float, threads: int):
    """The field of a model's weights() and beta as a function of a float64 tensor x (n, d)."""
    import torch
    torch.set_num_threads(threads)
    w = {k: torch.tensor(v) for k, v in weights.items()}
    query, key, value, output = w["attention/query"], w["attention/key"], w["attention/value"], w["attention/output"]
    H, rv = query.shape[0], value.shape[1]

    def field_of(xt):
        field = torch.zeros_like(xt)
        for h in range(H):
            scores = beta * (xt @ query[h].T) @ (xt @ key[h].T).T
            attention = torch.softmax(scores, dim=1)
            field = field + (attention @ (xt @ value[h].T)) @ output[:, h * rv:(h + 1) * rv].T
        return field - (xt * field).sum(dim=1, keepdim=True) * xt
    return field_of


def torch_field_of(weights: dict, beta: float, x: np.ndarray, threads: int):
    """torch_field of a model's weights() and beta."""
    import torch
    xt = torch.tensor(x, requires_grad=True)
    return xt, torch_field_function(weights, beta, threads)(xt)


def timing_rows(threads: int, repeats: int):
    rows = []
    for n, d, heads, value_rows in ((4096, 3, 1, "d"), (1024, 64, 8, "d"), (1024, 64, 8, "r")):
        model = model_of(n, d, heads, threads, value_rows)
        x = model.initial_state()
        w = np.random.default_rng(0).standard_normal(x.shape)
        t = np.random.default_rng(1).standard_normal(x.shape)
        calls = {"velocity_s": lambda: model.velocity(x), "vjp_s": lambda: model.vjp(x, w),
                 "jvp_s": lambda: model.jvp(x, t)}
        row = {"n": n, "d": d, "H": heads, "rv": d // heads if value_rows == "r" else d}
        row.update(interleaved_seconds(calls, max(repeats, 5)))
        if heads > 1:
            row["torch_autograd_s"] = torch_seconds(model, x, w, threads, repeats)
        rows.append(row)
    return rows


def torch_seconds(model, x: np.ndarray, w: np.ndarray, threads: int, repeats: int) -> float:
    """The median time of PyTorch's forward and backward of <w, v(x)> (torch_field), in a process
    of its own, after 3 calls that warm it up: beside mfattn's OpenMP threads (one runtime,
    libgomp, for both) it took from 100 to 800 ms, by what ran before it."""
    with tempfile.TemporaryDirectory() as folder:
        inputs = Path(folder) / "inputs.npz"
        np.savez(inputs, x=x, w=w, beta=model.beta, **{k.replace("/", "."): v for k, v in model.weights().items()})
        code = f"""
import statistics, sys, time, numpy as np, torch
sys.path.insert(0, {str(ROOT / "bench")!r})
from derivatives import torch_field_of
data = np.load({str(inputs)!r})
weights = {{k.replace(".", "/"): data[k] for k in data.files if "." in k}}
def autograd():
    xt, v = torch_field_of(weights, float(data["beta"]), data["x"], {threads})
    torch.autograd.grad((v * torch.tensor(data["w"])).sum(), [xt])
for _ in range(3):  # the first calls took up to 3 times as long (PyTorch's allocator, its threads)
    autograd()
times = []
for _ in range({max(repeats, 3)}):
    start = time.perf_counter()
    autograd()
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""
        env = dict(os.environ, MFATTN_BENCH_NO_MODULE="1")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        return float(out.stdout.split()[-1])


def peak_memory(kind: str, n: int) -> float:
    """MB of ru_maxrss of a fresh process that runs one VJP (mfattn or torch) at n, d = 3."""
    # VmHWM, the high-water mark of this process's memory (ru_maxrss would count the parent's
    # at the fork).
    code = f"""
import sys, numpy as np
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return float(line.split()[1])
sys.path.insert(0, {str(os.environ.get("MFATTN_PYTHON_MODULE_DIR", str(ROOT / "build" / "python")))!r})
sys.path.insert(0, {str(ROOT / "bench")!r})
import derivatives as bench
model = bench.model_of({n}, 3, 1, 1)
x = model.initial_state()
w = np.random.default_rng(0).standard_normal(x.shape)
before = peak()
if {kind!r} == "mfattn":
    model.vjp(x, w)
else:
    import torch
    xt, v = bench.torch_field(model, x, 1)
    torch.autograd.grad((v * torch.tensor(w)).sum(), [xt])
print(peak() / 1024, before / 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    kernels = os.environ.get("MFATTN_CPU_KERNELS", "default")
    print(f"kernel set: {kernels}; threads {args.threads}; medians of {args.repeats}\n")
    print("| n | d | H | rv | velocity | VJP | VJP / velocity | JVP | JVP / velocity | PyTorch autograd | autograd / VJP |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in timing_rows(args.threads, args.repeats):
        torch_s = row.get("torch_autograd_s")
        print(f"| {row['n']} | {row['d']} | {row['H']} | {row['rv']} | {row['velocity_s'] * 1e3:.3g} ms | {row['vjp_s'] * 1e3:.4g} ms | "
              f"{row['vjp_s'] / row['velocity_s']:.3g} | {row['jvp_s'] * 1e3:.4g} ms | "
              f"{row['jvp_s'] / row['velocity_s']:.3g} | "
              + (f"{torch_s * 1e3:.4g} ms | {torch_s / row['vjp_s']:.3g} |" if torch_s else "- | - |"))
    print("\n| n (d = 3) | mfattn VJP peak memory | PyTorch autograd peak memory |")
    print("| --- | --- | --- |")
    for n in (8000, 50000):
        ours, ours_base = peak_memory("mfattn", n)
        line = f"| {n} | {ours:.0f} MB ({ours - ours_base:+.0f} MB over the set-up) | "
        if n <= 8000:
            theirs, theirs_base = peak_memory("torch", n)
            line += f"{theirs:.0f} MB ({theirs - theirs_base:+.0f} MB) |"
        else:
            line += "- |"
        print(line)
    print(f"\ncommand: MFATTN_CPU_KERNELS={kernels} /usr/bin/python3 bench/derivatives.py --threads {args.threads} "
          f"--repeats {args.repeats}")


if __name__ == "__main__":
    main()
