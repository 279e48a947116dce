#!/usr/bin/python3
"""Benchmark: Sinkhorn attention (docs/model.md section 2d) against PyTorch's dense sweeps.

Model: n = 1024 tokens on S^2 (d = 3), Q = K = V = I, beta = 1, --kernel sinkhorn with exactly
--sweeps sweeps (--sinkhorn-tol 0), the velocity with its tangent projection.

- mfattn: `mfattn bench` (median seconds per evaluation over at least --min-time seconds),
  --threads 2, the default CPU kernels and MFATTN_CPU_KERNELS=avx2. An evaluation takes
  2 K + 3 passes over the n^2 pairs (the rows at g = 0, K sweeps of columns and rows, the
  column pass that measures the final plan, the output pass), each weight recomputed: O(n)
  memory.
- PyTorch peers (float64, torch.set_num_threads(2), median of --repeats calls after a warm-up),
  the code a researcher writes on the dense n x n matrix of log-weights L = beta X X^T:
  * log domain (as the Sinkformers code): K times g = -logsumexp(f + L, 0), f = -logsumexp(L + g, 1),
    then P = exp(f + L + g), u = P X and the projection;
  * linear domain: W = exp(L) once, then K times b = 1 / (W^T a), a = 1 / (W b), and u = a W b X
    (fewer exps, but W overflows for beta |x|^2 > 709).
- Roofline: `mfattn bench --roofline` prints the exp rate of the CPU kernels (exps per second,
  measured apart from any pair loop); (2 K + 3) n^2 exps per evaluation bound the time below.
- Memory: --memory-n = 50000 tokens, the same sweeps, peak RSS of `mfattn bench` (/usr/bin/time),
  against the n^2 doubles that one dense matrix takes there (PyTorch not run).

Prints the Markdown table of docs/performance.md and writes data/normalization/sinkhorn_benchmark.json.
The velocity is also evaluated by the Python package (mfattn.Model) of the build's package
folder, and compared with the log-domain peer's (max_velocity_difference; null without the
compiled module):

    MFATTN_BINARY=build/mfattn PYTHONPATH=build/python /usr/bin/python3 experiments/normalization/sinkhorn_benchmark.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# `mfattn bench` with its peak RSS, as the heads' benchmark runs it.
sys.path.insert(0, str(ROOT / "experiments" / "heads"))
from benchmark import bench  # noqa: E402


def median_seconds(call, repeats: int) -> float:
    call()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=10, help="PyTorch calls timed (median)")
    parser.add_argument("--min-time", type=float, default=2.0, help="mfattn bench --min-time")
    parser.add_argument("--memory-n", type=int, default=50000, help="tokens of the memory measurement")
    parser.add_argument("--binary", default=os.environ.get("MFATTN_BINARY", str(ROOT / "build" / "mfattn")))
    parser.add_argument("--out", default=str(ROOT / "data" / "normalization" / "sinkhorn_benchmark.json"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    n, d, sweeps, beta = args.n, 3, args.sweeps, args.beta
    work = Path(tempfile.mkdtemp(prefix="mfattn-sinkhorn-bench-"))
    x = np.random.default_rng(1).standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.savetxt(work / "x.txt", x)
    t = torch.from_numpy(x)

    def project(u: torch.Tensor) -> torch.Tensor:
        return u - (u * t).sum(1, keepdim=True) * t

    def log_domain() -> torch.Tensor:
        logits = beta * t @ t.T
        g = torch.zeros(n, dtype=torch.float64)
        f = -torch.logsumexp(logits + g[None, :], 1)
        for _ in range(sweeps):
            g = -torch.logsumexp(f[:, None] + logits, 0)
            f = -torch.logsumexp(logits + g[None, :], 1)
        return project(torch.exp(f[:, None] + logits + g[None, :]) @ t)

    def linear_domain() -> torch.Tensor:
        w = torch.exp(beta * t @ t.T)
        b = torch.ones(n, dtype=torch.float64)
        a = 1.0 / (w @ b)
        for _ in range(sweeps):
            b = 1.0 / (w.T @ a)
            a = 1.0 / (w @ b)
        return project(a[:, None] * (w @ (b[:, None] * t)))

    with torch.no_grad():
        log_seconds = median_seconds(log_domain, args.repeats)
        linear_seconds = median_seconds(linear_domain, args.repeats)
        peer_velocity = log_domain().numpy()

    common = ["--d", str(d), "--beta", repr(beta), "--kernel", "sinkhorn", "--sinkhorn-iterations", str(sweeps),
              "--sinkhorn-tol", "0", "--threads", "2", "--out", str(work / "unused.h5")]
    rows = []
    for kernels in (None, "avx2"):
        env = {"MFATTN_CPU_KERNELS": kernels} if kernels else None
        measured = bench(args.binary, [*common, "--n", str(n), "--min-time", str(args.min_time), "--init", "file",
                                       "--init-file", str(work / "x.txt"), "--roofline"], env)
        exps = (2 * sweeps + 3) * n * n
        rows.append({"kernels": measured["kernels"], "mfattn_s": measured["seconds"],
                     "log_domain_ratio": log_seconds / measured["seconds"],
                     "linear_domain_ratio": linear_seconds / measured["seconds"],
                     "pairs_per_second": exps / measured["seconds"],
                     "exps_per_second": measured.get("exps_per_second"),
                     "roofline_s": exps / measured["exps_per_second"] if measured.get("exps_per_second") else None,
                     "mfattn_maxrss_mib": measured["maxrss_mib"]})
    # The same field from the module (one evaluation), against the log-domain peer's.
    try:
        import mfattn

        ours = mfattn.Model(n=n, d=d, beta=beta, kernel="sinkhorn", sinkhorn_iterations=sweeps, sinkhorn_tol=0,
                            threads=2).velocity(x)
        agreement = float(np.abs(ours - peer_velocity).max())
    except ImportError:
        agreement = None
    big = bench(args.binary, [*common, "--n", str(args.memory_n), "--min-time", "0.01"])
    memory = {"n": args.memory_n, "mfattn_maxrss_mib": big["maxrss_mib"], "seconds": big["seconds"],
              "dense_matrix_mib": args.memory_n ** 2 * 8 / 2 ** 20}
    result = {"n": n, "d": d, "sweeps": sweeps, "beta": beta, "torch_threads": 2, "torch_log_domain_s": log_seconds,
              "torch_linear_domain_s": linear_seconds, "max_velocity_difference": agreement, "rows": rows,
              "memory": memory}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"n = {n}, d = 3, beta = {beta:g}, {sweeps} sweeps (tolerance 0), Q = K = V = I, 2 threads")
    print(f"PyTorch float64: log domain {1e3 * log_seconds:.1f} ms, linear domain {1e3 * linear_seconds:.1f} ms "
          f"per evaluation; mfattn's velocity against the log-domain peer's: {agreement:.1e}" if agreement is not None
          else "")
    print("| CPU kernels | mfattn | PyTorch log domain / mfattn | PyTorch linear domain / mfattn | pair-exps per second "
          "| exp roofline | mfattn peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        roof = f"{1e3 * row['roofline_s']:.1f} ms" if row["roofline_s"] else "-"
        print(f"| {row['kernels']} | {1e3 * row['mfattn_s']:.1f} ms | {row['log_domain_ratio']:.1f}x | "
              f"{row['linear_domain_ratio']:.1f}x | {row['pairs_per_second']:.2e} | {roof} | "
              f"{row['mfattn_maxrss_mib']:.0f} MiB |")
    m = memory
    print(f"\nAt n = {m['n']} ({sweeps} sweeps): mfattn peak RSS {m['mfattn_maxrss_mib']:.0f} MiB, "
          f"{m['seconds']:.1f} s per evaluation (default kernels); one dense n x n matrix of doubles would take "
          f"{m['dense_matrix_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
