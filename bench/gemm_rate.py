#!/usr/bin/python3
"""Dense float64 GEMM rate of this machine through NumPy (OpenBLAS), in GFLOP/s.

Shapes (flops = 2 m n k):
  scores   (4096 x 64) @ (64 x 4096)    the Gram/score product of one d = 64 step
  wsum     (4096 x 4096) @ (4096 x 64)  the weighted sum W @ X of one d = 64 step
  square   (2048 x 2048) @ (2048 x 2048)
Both operands are distinct contiguous arrays (a plain dgemm; no syrk), the output is
preallocated, the result is checked (Freivalds: C v == A (B v)), best of --repeats after one
warm-up. `pair` is the two d = 64 products back to back: 2 * 2 n^2 d flops over the sum of
the best times, the dense-GEMM rate of one attention evaluation at n = 4096, d = 64.

The parent process runs one child per thread count, with OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS set before NumPy is imported, and OPENBLAS_VERBOSE=2 so that OpenBLAS
names the core (kernel set) it picked. By default the parent unsets OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE for the children (--keep-env keeps them). Prints one JSON object.
"""

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = {"scores": (4096, 64, 4096), "wsum": (4096, 4096, 64), "square": (2048, 2048, 2048)}


def child(repeats):
    import numpy as np

    rng = np.random.default_rng(1)
    res = {}
    best_t = {}
    for name, (m, k, n) in SHAPES.items():
        A = rng.standard_normal((m, k))
        B = rng.standard_normal((k, n))
        C = np.empty((m, n))
        np.matmul(A, B, out=C)  # warm-up (and first touch of C)
        v = rng.standard_normal(n)
        err = np.abs(C @ v - A @ (B @ v)).max() / (np.abs(A).max() * np.abs(B).max() * k * np.sqrt(n))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.matmul(A, B, out=C)
            times.append(time.perf_counter() - t0)
        best = min(times)
        best_t[name] = best
        res[name] = {"m": m, "k": k, "n": n, "best_seconds": best,
                     "gflops": 2.0 * m * n * k / best / 1e9,
                     "median_gflops": 2.0 * m * n * k / sorted(times)[len(times) // 2] / 1e9,
                     "check_rel_err": float(err), "check_ok": bool(err < 1e-12)}
    flops_pair = 2 * 2.0 * 4096 * 4096 * 64
    res["pair"] = {"gflops": flops_pair / (best_t["scores"] + best_t["wsum"]) / 1e9}
    print(json.dumps(res))


def run_children(threads_list, repeats, keep_env):
    out = {"threads": {}}
    for t in threads_list:
        env = dict(os.environ)
        if not keep_env:
            env.pop("OPENBLAS_CORETYPE", None)
            env.pop("OPENBLAS_L2_SIZE", None)
        env["OPENBLAS_NUM_THREADS"] = str(t)
        env["OMP_NUM_THREADS"] = str(t)
        env["OPENBLAS_VERBOSE"] = "2"
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                            "--repeats", str(repeats)], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"gemm_rate: child with {t} threads failed (rc {p.returncode}):\n{p.stderr}")
        core = [ln.split(":", 1)[1].strip() for ln in p.stderr.splitlines() if ln.startswith("Core:")]
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["openblas_core"] = core[0] if core else "unknown"
        out["threads"][str(t)] = r
    out["env_kept"] = keep_env
    out["openblas_coretype_env"] = os.environ.get("OPENBLAS_CORETYPE") if keep_env else None
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (1,2)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--keep-env", action="store_true",
                   help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for the children")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.repeats)
    else:
        run_children([int(x) for x in a.threads.split(",")], a.repeats, a.keep_env)


if __name__ == "__main__":
    main()
