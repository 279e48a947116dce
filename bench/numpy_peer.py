#!/usr/bin/python3
"""Dense NumPy peer of `mfattn run --integrator euler` (USA / SA kernels, identity Q, K, V).

One explicit Euler step on the sphere, X an n x d array of unit rows:

    G = X @ X.T;  W = exp(beta * G)
    USA: U = (W @ X) / n ;  SA: U = (W @ X) / W.sum(axis=1, keepdims=True)
    V = U - sum(U * X, axis=1, keepdims=True) * X
    X = X + dt * V;  X /= norm(X, axis=1, keepdims=True)

The n x n work is done in place (one n x n buffer per step: G is overwritten by W), which
is what a careful NumPy user would write; it is the fair, not the naive, peer.

--gram gemm (default) forms G as X @ XT with XT = ascontiguousarray(X.T), a plain dgemm.
--gram syrk writes the literal `X @ X.T`: NumPy 1.24 then calls dsyrk and mirrors the
triangle with a strided copy, which on this machine costs ~0.1 s at n = 4096 (8x the gemm);
the default avoids that pitfall so that the peer is not artificially slow.

Prints one JSON line: seconds per step (mean, median, min), total seconds of the timed
loop (setup, imports and the optional comparison are excluded), the n x n bytes per buffer.

--init-h5 FILE takes the initial state from frame 0 of an mfattn H5MD file instead of a
seeded uniform draw; --compare then reports the largest |X_numpy - X_mfattn| against that
file's last frame (which must lie `steps` Euler steps after frame 0).

Thread counts: set OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the environment before
starting this script; the element-wise NumPy work (exp, sums, norms) is single-threaded.
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def openblas_info():
    """Thread count, core name and build config of the OpenBLAS that NumPy loaded."""
    import ctypes
    try:
        libs = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "openblas" in ln})
        for path in libs:
            try:
                lib = ctypes.CDLL(path)
                lib.openblas_get_corename.restype = ctypes.c_char_p
                lib.openblas_get_config.restype = ctypes.c_char_p
                return {"threads": lib.openblas_get_num_threads(),
                        "core": lib.openblas_get_corename().decode(),
                        "config": lib.openblas_get_config().decode()}
            except (OSError, AttributeError):
                continue
    except OSError:
        pass
    return {"threads": None, "core": "unknown", "config": "unknown"}


def euler_step(X, beta, dt, kernel, buf, gram="gemm"):
    n = X.shape[0]
    if gram == "gemm":
        np.matmul(X, np.ascontiguousarray(X.T), out=buf)  # G = X X^T as a dgemm
    else:
        np.matmul(X, X.T, out=buf)  # literal X @ X.T: dsyrk plus NumPy's triangle mirror
    if beta != 1.0:
        buf *= beta
    np.exp(buf, out=buf)  # W = exp(beta G), in place
    U = buf @ X  # W X
    if kernel == "usa":
        U /= n
    else:
        U /= buf.sum(axis=1, keepdims=True)
    V = U - np.sum(U * X, axis=1, keepdims=True) * X
    X = X + dt * V
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--d", type=int, required=True)
    p.add_argument("--kernel", choices=["usa", "sa"], default="usa")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--dt", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gram", choices=["gemm", "syrk"], default="gemm",
                   help="how G = X X^T is formed (see the module docstring)")
    p.add_argument("--init-h5", default=None, help="initial state: frame 0 of this mfattn file")
    p.add_argument("--compare", action="store_true",
                   help="with --init-h5: compare the final state with the file's last frame")
    a = p.parse_args(argv)

    if a.init_h5:
        import h5py
        with h5py.File(a.init_h5, "r") as f:
            pos = f["particles/tokens/position/value"]
            X0 = np.array(pos[0], dtype=np.float64)
            Xref = np.array(pos[-1], dtype=np.float64) if a.compare else None
        if X0.shape != (a.n, a.d):
            sys.exit(f"numpy_peer: {a.init_h5} frame 0 has shape {X0.shape}, not ({a.n}, {a.d})")
    else:
        rng = np.random.default_rng(a.seed)
        X0 = rng.standard_normal((a.n, a.d))
        Xref = None
    X = X0 / np.linalg.norm(X0, axis=1, keepdims=True)
    buf = np.empty((a.n, a.n), dtype=np.float64)
    buf.fill(0.0)  # first-touch page faults belong to setup, not to step 1

    step_times = []
    t_start = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        X = euler_step(X, a.beta, a.dt, a.kernel, buf, a.gram)
        step_times.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_start

    out = {
        "impl": "numpy",
        "n": a.n, "d": a.d, "kernel": a.kernel, "steps": a.steps, "beta": a.beta, "dt": a.dt,
        "gram": a.gram,
        "seconds_total": total,
        "seconds_per_step": total / max(a.steps, 1),
        "seconds_per_step_median": float(np.median(step_times)) if step_times else None,
        "seconds_per_step_min": min(step_times) if step_times else None,
        "nxn_buffer_bytes": a.n * a.n * 8,
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
        "openblas": openblas_info(),
        "numpy": np.__version__,
        "max_unit_norm_error": float(np.abs(np.linalg.norm(X, axis=1) - 1).max()),
    }
    if Xref is not None:
        out["max_abs_diff_vs_mfattn"] = float(np.abs(X - Xref).max())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
