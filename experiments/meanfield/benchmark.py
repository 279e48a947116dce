#!/usr/bin/python3
"""Benchmark: the density solver against particle runs, for the same accuracy target.

Model: circle d = 2, USA, beta = 1, Q = K = V = I, no noise, start rho_0 ~ exp(<x, e_1>)
(--init-density vmf --init-kappa 1), horizon t = 20.

- reference: mfattn meanfield --grid --reference-grid (65536) --rtol --reference-rtol (1e-8), the
  "converged" density (about 2 minutes; docs/performance.md has the table of this script's defaults);
- density:   mfattn meanfield --grid --grid (4096; the table in docs/performance.md adds --grid 1024 and 2048);
- particles: n in --sizes (4096, 65536; those above --max-n are left out) samples of the
  density's frame 0 (analysis/sample_density.py), mfattn run --integrator rk4
  --dt --particles-dt (0.25: dt = 0.05 gives the same W1 to 3 digits) to t = 20,
  --save-positions ends.

Per method: the wall time (the file's /run attribute wall_time_s: the solve or the run
alone, no start-up or sampling) and the error: the exact circle W1 at t = 20 against the
reference density (and at t = 0: for particles the sampling error). Prints a Markdown table,
writes data/meanfield/benchmark.csv and data/figures/meanfield_benchmark.png (error against
wall time).

Cost (2 cores): a density solve costs ~ M log M per step and its steps do not grow with M
(the semi-Lagrangian step has no CFL bound): M = 4096 takes ~0.5 s, the reference ~2-3 min;
particles cost ~ 4 (T/dt) n^2 / 2e9 s on one core (AVX-512; the symmetric pair loop counts a
pair once): n = 4096 about 2 s, n = 65536 about 12 min. The estimate is printed before anything runs; --max-n 16384 or --sizes trims it.

    PYTHONPATH=analysis /usr/bin/python3 experiments/meanfield/benchmark.py [--quick] [--max-n 16384] [--particles-dt 0.25]
"""
from __future__ import annotations

import os

import numpy as np

import mfcommon as mf  # this folder's, beside the script (sys.path[0])

PAIRS_PER_SECOND = 2e9  # measured here: n = 65536 to t = 20 in 697 s, d = 2 USA, one core, AVX-512


def main() -> None:
    parser = mf.standard_parser("benchmark", __doc__)
    mf.add_options(parser, {"--grid": 4096, "--reference-grid": 65536, "--reference-rtol": 1e-8, "--sizes": "4096,65536",
                            "--max-n": 65536, "--particles-dt": 0.25, "--horizon": 20.0, "--beta": 1.0,
                            "--init-kappa": 1.0, "--seed": 0})
    parser.add_argument("--threads", type=int, default=None, help="--threads of every run (default 1, $MFATTN_THREADS: the same for both methods)")
    parser.add_argument("--dry-run", action="store_true", help="print the estimate only")
    args = parser.parse_args()
    if args.quick:
        args.grid, args.reference_grid, args.sizes = 512, 4096, "256,1024"
    paths = mf.Paths(args)
    clock = mf.Clock()
    sizes = [n for n in (int(s) for s in args.sizes.split(",")) if n <= args.max_n]
    T = args.horizon

    steps = T / args.particles_dt
    particle_cost = {n: 4 * steps * n * n / PAIRS_PER_SECOND for n in sizes}
    # density: ~2000 steps for M = 4096 to t = 20 (~0.5 s) at the default tolerance; step cost ~ M log M,
    # steps ~ rtol^(-1/2)
    density_cost = {args.grid: 0.5 * (args.grid / 4096) * np.log(args.grid) / np.log(4096),
                    args.reference_grid: 0.5 * (args.reference_grid / 4096) * np.log(args.reference_grid) / np.log(4096)
                    * np.sqrt(1e-6 / args.reference_rtol)}
    print("estimated cost on one core: " + ", ".join(f"density M = {M}: ~{c / 60:.1f} min" for M, c in density_cost.items())
          + "; " + ", ".join(f"particles n = {n}: ~{c / 60:.1f} min" for n, c in particle_cost.items()), flush=True)
    if args.dry_run:
        return

    def density_options(grid: int, rtol: tuple = ()) -> list:
        return ["meanfield", "--d", 2, "--beta", args.beta, "--kernel", "usa", "--grid", grid,
                "--init-density", "vmf", "--init-kappa", args.init_kappa, "--horizon", T, "--save-every", T / 4,
                *rtol]

    reference_file = paths.runs / f"density_M{args.reference_grid}_rtol{args.reference_rtol:g}.h5"
    mf.mfattn(density_options(args.reference_grid, ("--rtol", args.reference_rtol)), reference_file, reuse=args.reuse, threads=args.threads)
    reference = mf.Density(reference_file)
    print(f"reference M = {args.reference_grid} done ({clock})", flush=True)
    ref0, ref_end = mf.density_measure(reference, 0), mf.density_measure(reference, reference.frame_at(T))

    rows = []
    density_file = paths.runs / f"density_M{args.grid}.h5"
    mf.mfattn(density_options(args.grid), density_file, reuse=args.reuse, threads=args.threads)
    density = mf.Density(density_file)
    rows.append(dict(method="density (semi-Lagrangian)", size=f"M = {args.grid}", wall_time_s=density.wall_time,
                     steps=int(density.run["steps"]),
                     w1_t0=mf.w1_circle(mf.density_measure(density, 0), ref0),
                     w1_end=mf.w1_circle(mf.density_measure(density, density.frame_at(T)), ref_end)))
    for n in sizes:
        x0 = mf.write_samples(density_file, n, args.seed, paths.runs / f"x0_n{n}.txt")
        out = paths.runs / f"particles_n{n}.h5"
        print(f"particles n = {n} (estimate ~{particle_cost[n] / 60:.1f} min on one core) ...", flush=True)
        mf.mfattn(["run", "--d", 2, "--n", n, "--beta", args.beta, "--kernel", "usa", "--init", "file",
                   "--init-file", x0, "--integrator", "rk4", "--dt", args.particles_dt, "--horizon", T,
                   "--save-every", T, "--save-positions", "ends", "--seed", args.seed],
                  out, reuse=args.reuse, threads=args.threads)
        run = mf.Particles(out)
        j_end = int(np.argmin(np.abs(run.time - T)))
        rows.append(dict(method=f"particles (rk4, dt = {args.particles_dt:g})", size=f"n = {n}",
                         wall_time_s=run.wall_time, steps=int(run.run.get("steps", -1)),
                         w1_t0=mf.w1_circle(mf.particle_measure(run, 0), ref0),
                         w1_end=mf.w1_circle(mf.particle_measure(run, j_end), ref_end)))
    rows.append(dict(method=f"reference density (rtol {args.reference_rtol:g})", size=f"M = {args.reference_grid}", wall_time_s=reference.wall_time,
                     steps=int(reference.run["steps"]), w1_t0=0.0, w1_end=0.0))
    mf.write_csv(paths.csv, rows)

    print(f"\ncircle USA beta = {args.beta:g}, vmf start kappa = {args.init_kappa:g}, t = {T:g}; "
          f"errors: W1 against the M = {args.reference_grid} density; threads: "
          f"{args.threads if args.threads is not None else os.environ.get('MFATTN_THREADS', '1')}")
    print(mf.markdown_table(rows, ["method", "size", "wall_time_s", "steps", "w1_t0", "w1_end"], spec=".3g"))

    plt = mf.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.3))
    for row in rows[:-1]:
        ax.loglog(row["wall_time_s"], row["w1_end"], "o" if row["method"].startswith("density") else "s", ms=7)
        ax.annotate(row["size"], (row["wall_time_s"], row["w1_end"]), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("wall time (s, /run wall_time_s)")
    ax.set_ylabel(f"W1 at t = {T:g} against M = {args.reference_grid}")
    ax.set_title("circle USA beta=1: density (o) vs particles (s)")
    mf.finish(fig, paths, clock, len(rows))


if __name__ == "__main__":
    main()
