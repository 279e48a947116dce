"""One evaluation of the field on the circle (d = 2, USA, beta = 4, uniform tokens): the cpu
backend's direct pair loop against `--evaluation fourier` (docs/model.md section 2f), by
`mfattn bench`, and the dense NumPy step a researcher would write (exp of the n x n score
matrix) as the peer, each at the n it can take. Prints the table of docs/performance.md,
"Fast summation on the circle".

    MFATTN_BINARY=build/mfattn /usr/bin/python3 experiments/fast/evaluation_speed.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np

BINARY = Path(os.environ.get("MFATTN_BINARY", Path(__file__).resolve().parents[2] / "build" / "mfattn"))


def bench(n: int, evaluation: str, seconds: float) -> float:
    """Seconds per evaluation measured by mfattn bench."""
    out = subprocess.run([str(BINARY), "bench", "--n", str(n), "--d", "2", "--beta", "4", "--evaluation", evaluation,
                          "--min-time", str(seconds)], capture_output=True, text=True, check=True).stdout
    return float(re.search(r"seconds_per_evaluation (\S+)", out).group(1))


def numpy_step(n: int) -> float:
    """Seconds of the dense NumPy USA field at n (natural time, Q = K = V = I)."""
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 2 * np.pi, n)
    x = np.stack([np.cos(t), np.sin(t)], axis=1)
    start = time.perf_counter()
    w = np.exp(4.0 * (x @ x.T))
    u = w @ x / n
    v = u - np.sum(u * x, axis=1, keepdims=True) * x
    elapsed = time.perf_counter() - start
    assert np.isfinite(v).all()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n up to 10^5 (seconds)")
    args = parser.parse_args()
    sizes = [1000, 2000, 4000, 10**4, 10**5] + ([] if args.quick else [10**6, 10**7])
    print("| n | direct (s) | fourier (s) | NumPy dense (s) |")
    print("| --- | --- | --- | --- |")
    for n in sizes:
        direct = f"{bench(n, 'direct', 1.0):.3g}" if n <= 10**5 else "-"
        fourier = f"{bench(n, 'fourier', 1.0):.3g}"
        peer = f"{numpy_step(n):.3g}" if n <= 10**4 else "-"
        print(f"| {n:g} | {direct} | {fourier} | {peer} |", flush=True)


if __name__ == "__main__":
    main()
