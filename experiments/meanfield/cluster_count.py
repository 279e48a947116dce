#!/usr/bin/python3
"""Metastable cluster counts on the circle: density, particles and argmax_k k^2 I_k(beta).

For each beta (full: 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30), USA in rescaled time
(--time-scale rescaled: kernel exp(beta (<x, y> - 1)), as experiments/metastability.ini):

- density: mfattn meanfield --d 2 --grid M (512) from uniform + 1e-6 smooth random noise
  (--init-density FILE: 1 + 1e-6 n(theta_a), n a random trigonometric polynomial of degrees
  1..32 with N(0, 1) coefficients, fixed seed, scaled to max |n| = 1), frames log-spaced up to
  the horizon H = --horizon-factor (10) x t_lin, t_lin = log(1e6) / max_k gamma_k (the time the
  fastest mode needs to grow from 1e-6 to 1). Clusters of a frame: the connected (cyclic) runs
  of cells with rho > --threshold (5) x 1/(2 pi).
- particles: mfattn run --d 2 --n N --beta B (uniform random start, dopri5, rtol 1e-8,
  --save-log frames, --save-positions ends) for N in --sizes (256, 512, 1024) and --seeds
  (0); clusters: the observable /observables/n_clusters (components of <x_i, x_j> > 1 - 1e-4).

From each time series of counts: the first plateau (first count, after the start, that lasts
at least --min-decades (0.15) decades of time; for particles only counts <= n/8, as
analysis/metastability_table.py), the longest plateau (in decades) and the final count. The
prediction is k* = argmax_k k^2 I_k(beta), the fastest-growing mode (arXiv:2410.23228).

Prints the table, writes data/meanfield/cluster_count.csv and
data/figures/meanfield_cluster_count.png. The particle runs dominate the cost (about
n^2: about 9 s for n = 1024 at beta = 10 with one thread on one busy core here), so the
script prints the estimate first; --sizes 256,512 or fewer betas make it shorter.

    PYTHONPATH=analysis /usr/bin/python3 experiments/meanfield/cluster_count.py [--quick] [--sizes 256,512,1024] [--jobs 2]
"""
from __future__ import annotations

import numpy as np

import mfcommon as mf  # this folder's, beside the script (sys.path[0])

NOISE = 1e-6


def smooth_noise(M: int, seed: int, degrees: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta = mf.TWO_PI * np.arange(M) / M
    k = np.arange(1, degrees + 1)[:, None]
    a, b = rng.standard_normal((2, degrees, 1))
    n = (a * np.cos(k * theta) + b * np.sin(k * theta)).sum(axis=0)
    return n / np.abs(n).max()


def count_density_clusters(values: np.ndarray, threshold: float) -> np.ndarray:
    """connected cyclic runs of cells above threshold, per frame."""
    above = values > threshold
    starts = above & ~np.roll(above, 1, axis=-1)
    count = starts.sum(axis=-1)
    count[above.all(axis=-1)] = 1
    return count


def plateaus(times: np.ndarray, counts: np.ndarray, max_count: float, min_decades: float):
    """(first, longest, final): the first count lasting >= min_decades decades, the count of the
    longest plateau (decades), and the last count; counts above max_count or 0 are skipped."""
    t = np.asarray(times, float)
    c = np.asarray(counts)
    runs = []  # (count, t_start, t_end)
    i = 0
    while i < len(c):
        j = i
        while j + 1 < len(c) and c[j + 1] == c[i]:
            j += 1
        end = t[j + 1] if j + 1 < len(t) else t[j]
        runs.append((int(c[i]), t[i], end))
        i = j + 1
    # skip the start: plateaus count only from the first frame whose count is at most
    # max_count and at most half the count of frame 0 (a random start of n tokens already has
    # ~n/10 components of <x_i, x_j> > 1 - 1e-4 when n = 1024)
    gathered = np.flatnonzero((c <= max_count) & (c <= 0.5 * c[0] if c[0] > 0 else c <= max_count))
    t_from = t[gathered[0]] if gathered.size else np.inf
    valid = [(k, a, b) for k, a, b in runs if 0 < k <= max_count and a > 0 and a >= t_from]
    decades = [(k, np.log10(b / a), a, b) for k, a, b in valid]
    first = next(((k, a) for k, dec, a, b in decades if dec >= min_decades), (np.nan, np.nan))
    longest = max(decades, key=lambda x: x[1], default=(np.nan, np.nan, np.nan, np.nan))
    return first, longest, int(c[-1])


def main() -> None:
    parser = mf.standard_parser("cluster_count", __doc__)
    parser.add_argument("--betas", default="1,2,3,4,5,6,8,10,12,15,20,25,30")
    parser.add_argument("--grid", type=int, default=512)
    parser.add_argument("--sizes", default="256,512,1024", help="particle counts ('' for none)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--horizon-factor", type=float, default=10.0)
    parser.add_argument("--threshold", type=float, default=5.0, help="x the uniform density 1/(2 pi)")
    parser.add_argument("--min-decades", type=float, default=0.15)
    parser.add_argument("--noise-seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--threads", type=int, default=None, help="--threads of each run (default 1, $MFATTN_THREADS)")
    args = parser.parse_args()
    if args.quick:
        args.betas, args.grid, args.sizes, args.horizon_factor = "2,5,10", 256, "128", 5.0
    paths = mf.Paths(args)
    clock = mf.Clock()
    betas = [float(b) for b in args.betas.split(",")]
    sizes = [int(n) for n in args.sizes.split(",") if n]
    seeds = [int(s) for s in args.seeds.split(",")]
    
    info = {}
    for beta in betas:
        k = np.arange(1, 200)
        gmax = float(np.max(mf.growth_rate(k, beta, 2, "usa", rescaled=True)))
        t_lin = np.log(1.0 / NOISE) / gmax
        info[beta] = dict(k_star=mf.metastable_clusters(beta), t_lin=t_lin, horizon=args.horizon_factor * t_lin)
    # cost estimate of the particle runs: ~ n^2 pair evaluations x dopri5 steps (measured:
    # n = 1024, beta = 10, horizon 1600: 8.6 s with --threads 1; 150-220 s with 2 threads on the busy 2-core machine)
    estimate = sum(9.0 * (n / 1024) ** 2 * info[b]["horizon"] / 1600 for b in betas for n in sizes) * len(seeds)
    print(f"estimated particle cost: ~{estimate / 60:.1f} min on one core ({len(betas)} betas x sizes {sizes} x "
          f"{len(seeds)} seeds); density runs: seconds", flush=True)

    noise = smooth_noise(args.grid, args.noise_seed)
    init = mf.write_density_file(paths.runs / f"init_M{args.grid}_seed{args.noise_seed}.txt", 1.0 + NOISE * noise)

    def density_task(beta):
        h = info[beta]["horizon"]
        times = np.unique(np.round(np.geomspace(info[beta]["t_lin"] / 100, h, 150), 6))
        out = paths.runs / f"density_b{beta:g}.h5"
        mf.mfattn(["meanfield", "--d", 2, "--beta", beta, "--time-scale", "rescaled", "--grid", args.grid,
                   "--init-density", init, "--horizon", f"{h:.6g}",
                   "--save-times", ",".join(f"{t:.6g}" for t in times if t <= h), "--rtol", "1e-6"],
                  out, reuse=args.reuse, threads=args.threads)
        den = mf.Density(out)
        counts = count_density_clusters(den.value, args.threshold / mf.TWO_PI)
        first, longest, final = plateaus(den.time, counts, np.inf, args.min_decades)
        return dict(method="density", beta=beta, n=f"M={args.grid}", seed="-", k_star=info[beta]["k_star"],
                    t_lin=info[beta]["t_lin"], first_plateau=first[0], first_at=first[1],
                    longest_plateau=longest[0], longest_decades=longest[1], final=final,
                    horizon=h, wall_s=den.wall_time)

    def particle_task(task):
        beta, n, seed = task
        h = info[beta]["horizon"]
        out = paths.runs / f"particles_b{beta:g}_n{n}_s{seed}.h5"
        mf.mfattn(["run", "--d", 2, "--n", n, "--beta", beta, "--time-scale", "rescaled", "--init", "uniform",
                   "--seed", seed, "--integrator", "dopri5", "--rtol", "1e-8", "--atol", "1e-10",
                   "--horizon", f"{h:.6g}", "--save-log", 80, "--save-positions", "ends"],
                  out, reuse=args.reuse, threads=args.threads)
        import h5py
        with h5py.File(out, "r") as f:
            g = f["observables/n_clusters"]
            t, c = g["time"][()], np.rint(g["value"][()]).astype(int)
            wall = float(f["run"].attrs["wall_time_s"])
        first, longest, final = plateaus(t, c, n / 8, args.min_decades)
        return dict(method="particles", beta=beta, n=n, seed=seed, k_star=info[beta]["k_star"],
                    t_lin=info[beta]["t_lin"], first_plateau=first[0], first_at=first[1],
                    longest_plateau=longest[0], longest_decades=longest[1], final=final,
                    horizon=h, wall_s=wall)

    rows = mf.run_parallel(args.jobs, betas, density_task)
    print(f"density runs done ({clock})", flush=True)
    tasks = [(b, n, s) for n in sizes for b in betas for s in seeds]
    rows += mf.run_parallel(args.jobs, tasks, particle_task)
    mf.write_csv(paths.csv, rows)
    print(mf.markdown_table(rows, ["method", "beta", "n", "seed", "k_star", "first_plateau", "first_at",
                                   "longest_plateau", "longest_decades", "final", "horizon", "wall_s"], spec=".4g"))
    dens = [r for r in rows if r["method"] == "density"]
    agree = sum(r["first_plateau"] == r["k_star"] for r in dens)
    print(f"\ndensity: first plateau = k* for {agree} of {len(dens)} betas")
    for n in sizes:
        part = [r for r in rows if r["n"] == n]
        agree = sum(r["first_plateau"] == r["k_star"] for r in part)
        within = sum(abs(r["first_plateau"] - r["k_star"]) <= 1 for r in part)
        print(f"particles n = {n}: first plateau = k* for {agree} of {len(part)} runs, within 1 for {within}")

    plt = mf.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    bb = np.linspace(min(betas), max(betas), 400)
    ax.plot(bb, [mf.metastable_clusters(b) for b in bb], "k-", lw=1, label="k* = argmax k^2 I_k(beta)")
    ax.plot([r["beta"] for r in dens], [r["first_plateau"] for r in dens], "o", ms=7, mfc="none",
            label=f"density M = {args.grid}, first plateau")
    for i, n in enumerate(sizes):
        part = [r for r in rows if r["n"] == n]
        shift = 0.08 * (i + 1) * (max(betas) - min(betas)) / 30
        ax.plot([r["beta"] + shift for r in part], [r["first_plateau"] for r in part], "x", ms=6,
                label=f"particles n = {n}, first plateau")
        ax.plot([r["beta"] + shift for r in part], [r["longest_plateau"] for r in part], "+", ms=6, alpha=0.6,
                label=f"particles n = {n}, longest plateau")
    ax.set_xlabel("beta (USA, rescaled time)")
    ax.set_ylabel("clusters")
    ax.set_title("metastable cluster count on the circle")
    ax.legend(fontsize=7)
    mf.finish(fig, paths, clock, len(rows))


if __name__ == "__main__":
    main()
