#!/usr/bin/env python3
"""Interleaved A/B of the pair loops: two mfattn binaries run `mfattn bench` on the same
cases in turn, for --rounds rounds, and the median time per evaluation of each is printed
with their ratio B / A (below 1: B is faster).

    /usr/bin/python3 bench/kernel_ab.py --a OLD/mfattn --b build/mfattn [--rounds 5]

The cases are the three of docs/performance.md's first table (n = 256 at d = 3 on one
thread, n = 4096 at d = 3 and d = 64 on two: the symmetric loop) and two that take the
one-sided loop or a log-term factor in the symmetric one (a causal mask, a Gaussian factor),
each with the default kernels and with MFATTN_CPU_KERNELS=avx2. A case is run A then B in
one round and B then A in the next, so that a drift of the machine weighs on both alike."""
from __future__ import annotations

import os
import re
import statistics
import subprocess

from ab_common import ab_parser, round_order

CASES = {
    "n 256 d 3 (1 thread)": ["--n", "256", "--d", "3", "--threads", "1"],
    "n 4096 d 3": ["--n", "4096", "--d", "3", "--threads", "2"],
    "n 4096 d 64": ["--n", "4096", "--d", "64", "--threads", "2"],
    "n 4096 d 3 causal (one-sided)": ["--n", "4096", "--d", "3", "--threads", "2", "--mask", "causal",
                                      "--kernel", "sa"],
    "n 4096 d 3 gaussian (symmetric)": ["--n", "4096", "--d", "3", "--threads", "2", "--aux-factor",
                                        "gaussian", "--aux-sigma", "400"],
}
SECONDS = re.compile(r"seconds_per_evaluation (\S+)")


def seconds_per_evaluation(binary: str, case: list[str], kernels: str | None, min_time: float) -> float:
    env = dict(os.environ)
    if kernels:
        env["MFATTN_CPU_KERNELS"] = kernels
    output = subprocess.run([binary, "bench", *case, "--min-time", str(min_time)], check=True, env=env,
                            capture_output=True, text=True).stdout
    found = SECONDS.search(output)
    if not found:
        raise SystemExit(f"{binary} bench {' '.join(case)}: no seconds_per_evaluation in {output!r}")
    return float(found.group(1))


def main() -> None:
    parser = ab_parser(__doc__, rounds=5)
    parser.add_argument("--min-time", type=float, default=0.5, help="mfattn bench --min-time of each run")
    args = parser.parse_args()
    print(f"median seconds per evaluation over {args.rounds} interleaved rounds (bench --min-time {args.min_time})")
    print(f"{'kernels':8s} {'case':34s} {'A':>10s} {'B':>10s} {'B / A':>7s}")
    for kernels in (None, "avx2"):
        for name, case in CASES.items():
            times: dict[str, list[float]] = {"a": [], "b": []}
            for round_index in range(args.rounds):
                for which in round_order(round_index):
                    times[which].append(seconds_per_evaluation(getattr(args, which), case, kernels, args.min_time))
            a, b = statistics.median(times["a"]), statistics.median(times["b"])
            print(f"{kernels or 'default':8s} {name:34s} {a:10.4g} {b:10.4g} {b / a:7.3f}", flush=True)


if __name__ == "__main__":
    main()
