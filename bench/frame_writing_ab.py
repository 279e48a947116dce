#!/usr/bin/env python3
"""Interleaved A/B of a run's frame writing: two mfattn binaries run the same n = 256 run
with a frame every step (so the writer's per-frame work is a large share of the run), in
turn for --rounds rounds, and the median wall time of each is printed with their ratio.

    /usr/bin/python3 bench/frame_writing_ab.py --a OLD/mfattn --b build/mfattn [--rounds 9]

Each configuration runs with the default kernels and with MFATTN_CPU_KERNELS=avx2, with the
default --flush-interval (1 s) and with 0 (a flush after every frame)."""
from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from ab_common import ab_parser, round_order


def one_run(binary: str, out: Path, flush: str, kernels: str | None, steps: int) -> float:
    env = dict(os.environ)
    if kernels:
        env["MFATTN_CPU_KERNELS"] = kernels
    command = [binary, "run", "--n", "256", "--d", "3", "--dt", "0.01", "--horizon", str(steps / 100),
               "--save-every", "0.01", "--threads", "1", "--quiet", "--overwrite",
               "--flush-interval", flush, "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = ab_parser(__doc__, rounds=9)
    parser.add_argument("--steps", type=int, default=2000, help="steps = frames of each run")
    args = parser.parse_args()
    print(f"n = 256, d = 3, euler, {args.steps} steps with a frame each, 1 thread; "
          f"median of {args.rounds} interleaved rounds (A = {args.a}, B = {args.b})")
    print("| kernels | --flush-interval | A (s) | B (s) | B / A |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "ab.h5"
        for kernels in (None, "avx2"):
            for flush in ("1", "0"):
                times = {"a": [], "b": []}
                for round_index in range(args.rounds):
                    for which in round_order(round_index):
                        times[which].append(one_run(getattr(args, which), out, flush, kernels, args.steps))
                a, b = statistics.median(times["a"]), statistics.median(times["b"])
                print(f"| {kernels or 'default'} | {flush} | {a:.3f} | {b:.3f} | {b / a:.3f} |", flush=True)


if __name__ == "__main__":
    main()
