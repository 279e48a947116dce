#!/usr/bin/python3
"""Benchmark: one velocity evaluation of a whole multi-head layer against PyTorch.

Model: a random bias-free torch.nn.MultiheadAttention (float64) of d = 64, H = 8 heads of
r = 8, exported with mfattn.export_torch (the file's low-rank form: values summed in the
r-dimensional head space), SA, plain values, beta = 1 / sqrt(r), n = 1024 tokens on the sphere.

- mfattn: `mfattn bench` (median seconds per evaluation over at least --min-time seconds, the
  velocity with its tangent projection), --threads 2, the default CPU kernels and
  MFATTN_CPU_KERNELS=avx2; the same for one head of the same r (the first head's
  Q, K, A and its d x r block of the output, H = 1) to see what the H heads cost against H
  single heads; the peak resident memory of the whole `mfattn bench` process (/usr/bin/time).
- PyTorch peer: the code a researcher writes, mha(x, x, x) on the token matrix and the tangent
  projection, float64, torch.set_num_threads(2), median of --repeats calls after a warm-up;
  its peak memory is the process's growth over the call (ru_maxrss), which holds H n^2 weights.
- Memory: the same layer at --memory-n = 16384 tokens, the peak RSS of `mfattn bench`, against
  the H n^2 doubles of PyTorch's attention weights there (not run).
- Roofline: `mfattn bench --roofline` prints the exp rate of the CPU kernels (exps per second,
  measured apart from any pair loop); H n^2 exps per evaluation then bound the time from below.

Prints a Markdown table (the one in README.md's "Performance" and docs/performance.md) and
writes data/heads/benchmark.json.

    PYTHONPATH=analysis /usr/bin/python3 experiments/heads/benchmark.py [--n 1024] [--repeats 20] [--min-time 2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
try:
    from mfattn import io as mfattn_io
except ModuleNotFoundError as missing:  # the package is analysis/mfattn: PYTHONPATH=analysis
    raise SystemExit(f"{Path(sys.argv[0]).name}: {missing}: run it from the repository root with PYTHONPATH=analysis "
                     "(the package mfattn; docs/python.md)") from None


def bench(binary: str, args: list[str], env_extra: dict[str, str] | None = None) -> dict:
    env = dict(os.environ, **(env_extra or {}))
    command = ["/usr/bin/time", "-f", "maxrss_kib %M", binary, "bench", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"benchmark: {' '.join(command)} failed:\n{done.stderr}")
    text = done.stdout + done.stderr
    out = {"seconds": float(re.search(r"seconds_per_evaluation ([0-9.e+-]+)", text).group(1)),
           "kernels": re.search(r"cpu_kernels (\S+)", text).group(1),
           "maxrss_mib": int(re.search(r"maxrss_kib (\d+)", text).group(1)) / 1024}
    rate = re.search(r"exp_per_second ([0-9.e+-]+)", text)
    if rate:  # --roofline: the exp rate of the same threads, apart from any pair loop
        out["exps_per_second"] = float(rate.group(1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20, help="PyTorch calls timed (median)")
    parser.add_argument("--min-time", type=float, default=2.0, help="mfattn bench --min-time")
    parser.add_argument("--memory-n", type=int, default=16384, help="tokens of the memory measurement")
    parser.add_argument("--binary", default=os.environ.get("MFATTN_BINARY", str(ROOT / "build" / "mfattn")))
    parser.add_argument("--out", default=str(ROOT / "data" / "heads" / "benchmark.json"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    d, heads, n = args.d, args.heads, args.n
    r = d // heads
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(d, heads, bias=False, dtype=torch.float64)
    work = Path(tempfile.mkdtemp(prefix="mfattn-heads-bench-"))
    options = mfattn_io.export_torch(mha, work / "layer.h5")
    # One head of the same r: head 0's matrices and its block of the output projection.
    with h5py.File(work / "layer.h5") as f, h5py.File(work / "one.h5", "w") as g:
        for name in ("query", "key", "value"):
            g[f"attention/{name}"] = f[f"attention/{name}"][:1]
        g["attention/output"] = f["attention/output"][:, :r]

    x = np.random.default_rng(1).standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.savetxt(work / "x.txt", x)
    t = torch.from_numpy(x)[:, None, :]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def peer() -> np.ndarray:
        with torch.no_grad():
            y = mha(t, t, t, need_weights=False)[0][:, 0, :].numpy()
        return y - np.sum(x * y, axis=1, keepdims=True) * x

    peer()
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        peer()
        seconds.append(time.perf_counter() - start)
    torch_seconds = float(np.median(seconds))
    torch_growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024

    common = ["--n", str(n), "--d", str(d), "--kernel", "sa", "--values", "plain", "--beta", repr(options["beta"]),
              "--threads", "2", "--min-time", str(args.min_time), "--init", "file", "--init-file", str(work / "x.txt"),
              "--out", str(work / "unused.h5")]
    layer = [*common, "--heads", str(heads), "--head-dim", str(r), "--weights", str(work / "layer.h5")]
    one = [*common, "--heads", "1", "--head-dim", str(r), "--weights", str(work / "one.h5")]
    rows = []
    for kernels in (None, "avx2"):
        env = {"MFATTN_CPU_KERNELS": kernels} if kernels else None
        full = bench(args.binary, [*layer, "--roofline"], env)
        single = bench(args.binary, one, env)
        rows.append({"kernels": full["kernels"], "mfattn_s": full["seconds"], "one_head_s": single["seconds"],
                     "heads_over_one": full["seconds"] / (heads * single["seconds"]),
                     "speedup": torch_seconds / full["seconds"], "mfattn_maxrss_mib": full["maxrss_mib"],
                     "exps_per_second": full.get("exps_per_second"),
                     "roofline_s": heads * n * n / full["exps_per_second"] if full.get("exps_per_second") else None})
    # O(n) memory: the same layer at --memory-n tokens (one evaluation or so), peak RSS; PyTorch
    # would hold H n^2 attention weights there.
    big = bench(args.binary, ["--n", str(args.memory_n), "--d", str(d), "--kernel", "sa", "--values", "plain",
                              "--beta", repr(options["beta"]), "--threads", "2", "--min-time", "0.01",
                              "--heads", str(heads), "--head-dim", str(r), "--weights", str(work / "layer.h5"),
                              "--out", str(work / "unused.h5")])
    result_memory = {"n": args.memory_n, "mfattn_maxrss_mib": big["maxrss_mib"], "seconds": big["seconds"],
                     "torch_weights_mib": heads * args.memory_n ** 2 * 8 / 2 ** 20}
    result = {"n": n, "d": d, "heads": heads, "head_dim": r, "torch_seconds": torch_seconds, "memory": result_memory,
              "torch_threads": 2, "torch_peak_growth_mib": torch_growth_mib, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"n = {n}, d = {d}, H = {heads}, r = {r}, SA, plain values (the file's low-rank form), 2 threads")
    print(f"PyTorch nn.MultiheadAttention float64: {1e3 * torch_seconds:.2f} ms per evaluation, "
          f"peak memory growth {torch_growth_mib:.0f} MiB")
    print("| CPU kernels | mfattn, H = 8 | one head of r = 8 | H heads / (H x one head) | PyTorch / mfattn | exp roofline | mfattn peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        roof = f"{1e3 * row['roofline_s']:.2f} ms" if row["roofline_s"] else "-"
        print(f"| {row['kernels']} | {1e3 * row['mfattn_s']:.2f} ms | {1e3 * row['one_head_s']:.3f} ms | "
              f"{row['heads_over_one']:.2f} | {row['speedup']:.1f}x | {roof} | {row['mfattn_maxrss_mib']:.0f} MiB |")
    m = result_memory
    print(f"\nAt n = {m['n']}: mfattn peak RSS {m['mfattn_maxrss_mib']:.0f} MiB ({m['seconds']:.2f} s per evaluation, "
          f"default kernels); PyTorch's H n^2 attention weights alone would take {m['torch_weights_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
