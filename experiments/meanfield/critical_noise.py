#!/usr/bin/python3
"""Critical noise of the circle: order parameter at long times against kappa.

mfattn meanfield on the circle (d = 2, beta = 2, USA and SA) with noise dx += sqrt(2/kappa) dW,
for kappa in [0.5, 2] kappa_c (12 values), from uniform + 0.01 cos(theta)
(--perturbation 1,0.01); the order parameter r = |int x dmu| (observable order_parameter) is
averaged over t in [40, 80]. Linear theory: the uniform state is unstable iff
gamma_1 = I_1(beta)/beta - 1/kappa > 0 (USA), I_1/(beta I_0) - 1/kappa (SA), so

    kappa_c = beta / I_1(beta)          (USA)     kappa_c = beta I_0(beta) / I_1(beta)   (SA)

(large kappa = weak noise = clustering). Beside the solver: the stationary states'
self-consistency (zero flux), solved here by a damped fixed-point iteration started from a
concentrated density,

    USA: rho = exp((kappa/beta) K*rho) / Z       SA: rho = (K*rho)^(kappa/beta) / Z,
    K*rho(theta) = int exp(beta cos(theta - phi)) rho(phi) d phi

and, with --both-starts (default on), a second solver branch started from a concentrated
density (--init-density vmf --init-kappa 10): where the two branches differ below kappa_c the
transition is discontinuous (a clustered state coexists with the stable uniform one).

Prints the table, writes data/meanfield/critical_noise.csv and
data/figures/meanfield_critical_noise.png (r against kappa/kappa_c, vertical line at 1).

    PYTHONPATH=analysis /usr/bin/python3 experiments/meanfield/critical_noise.py [--quick] [--grid 256] [--jobs 2]
"""
from __future__ import annotations

import numpy as np

import mfcommon as mf  # this folder's, beside the script (sys.path[0])


def self_consistent(beta: float, kappa: float, kernel: str, M: int = 512, iterations: int = 20000,
                    damping: float = 0.3, tol: float = 1e-13) -> float:
    """order parameter of the stationary state reached by the damped fixed-point iteration
    from a concentrated start (0 when it falls back to uniform)."""
    theta = mf.TWO_PI * np.arange(M) / M
    h = mf.TWO_PI / M
    kernel_hat = np.fft.rfft(np.exp(beta * np.cos(theta)))  # K*rho by FFT (circular convolution)
    rho = np.exp(10.0 * (np.cos(theta) - 1.0))
    rho /= rho.sum() * h
    for _ in range(iterations):
        conv = np.fft.irfft(kernel_hat * np.fft.rfft(rho), M) * h
        if kernel == "usa":
            log_new = (kappa / beta) * conv
        else:
            log_new = (kappa / beta) * np.log(conv)
        new = np.exp(log_new - log_new.max())
        new /= new.sum() * h
        change = np.max(np.abs(new - rho))
        rho = (1 - damping) * rho + damping * new
        if change < tol:
            break
    return float(abs(np.sum(rho * np.exp(1j * theta)) * h))


def main() -> None:
    parser = mf.standard_parser("critical_noise", __doc__)
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument("--grid", type=int, default=256, help="circle cells M (default 256)")
    parser.add_argument("--points", type=int, default=12, help="kappa values (default 12)")
    parser.add_argument("--horizon", type=float, default=80.0)
    parser.add_argument("--average-from", type=float, default=40.0)
    parser.add_argument("--kernels", default="usa,sa")
    parser.add_argument("--rtol", type=float, default=1e-6, help="solver rtol (default 1e-6)")
    parser.add_argument("--no-both-starts", action="store_true", help="only the near-uniform start")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--threads", type=int, default=None, help="--threads of each run (default 1, $MFATTN_THREADS)")
    args = parser.parse_args()
    if args.quick:
        args.points, args.horizon, args.average_from, args.grid = 5, 20.0, 10.0, 128
    paths = mf.Paths(args)
    clock = mf.Clock()
    beta = args.beta
    kernels = args.kernels.split(",")
    starts = ["uniform+0.01cos"] + ([] if args.no_both_starts or args.quick else ["vmf10"])

    tasks = []
    for kernel in kernels:
        kc = mf.kappa_critical(beta, kernel)
        for factor in np.linspace(0.5, 2.0, args.points):
            for start in starts:
                tasks.append((kernel, kc, float(factor), start))

    def one(task):
        kernel, kc, factor, start = task
        kappa = factor * kc
        init = (["--perturbation", "1,0.01"] if start.startswith("uniform")
                else ["--init-density", "vmf", "--init-kappa", "10"])
        out = paths.runs / f"{kernel}_f{factor:.4f}_{start}.h5"
        mf.mfattn(["meanfield", "--d", 2, "--beta", beta, "--kernel", kernel, "--grid", args.grid,
                   "--noise-kappa", f"{kappa:.10g}", *init, "--horizon", args.horizon,
                   "--save-every", args.horizon / 80, "--rtol", args.rtol], out, reuse=args.reuse,
                  threads=args.threads)
        den = mf.Density(out)
        window = den.time >= args.average_from - 1e-9
        r = den.obs["order_parameter"]
        return dict(kernel=kernel, beta=beta, kappa_c=kc, kappa=kappa, kappa_over_kc=factor, start=start,
                    r_initial=float(r[0]), r_mean=float(r[window].mean()), r_std=float(r[window].std()),
                    r_final=float(r[-1]),
                    gamma_1=float(mf.growth_rate(1, beta, 2, kernel, kappa)),
                    r_self_consistent=self_consistent(beta, kappa, kernel),
                    wall_s=den.wall_time)

    rows = mf.run_parallel(args.jobs, tasks, one)
    mf.write_csv(paths.csv, rows)
    columns = ["kernel", "kappa", "kappa_over_kc", "start", "gamma_1", "r_mean", "r_std", "r_final",
               "r_self_consistent", "wall_s"]
    print(f"beta = {beta:g}, M = {args.grid}, r averaged over t in [{args.average_from:g}, {args.horizon:g}]")
    for kernel in kernels:
        print(f"\n## {kernel}: kappa_c = {mf.kappa_critical(beta, kernel):.6g}")
        print(mf.markdown_table([r for r in rows if r["kernel"] == kernel], columns))
    # where the near-uniform branch switches on, per kernel: the run "clusters" when r grew
    # over the run (r_final > r(0) = pi * 0.01), else it went back towards uniform
    print()
    for kernel in kernels:
        branch = sorted((r for r in rows if r["kernel"] == kernel and r["start"].startswith("uniform")),
                        key=lambda r: r["kappa"])
        grew = [r["r_final"] > r["r_initial"] for r in branch]
        kc = mf.kappa_critical(beta, kernel)
        switches = [i for i in range(1, len(branch)) if grew[i] != grew[i - 1]]
        if len(switches) == 1 and not grew[0]:
            lo, hi = branch[switches[0] - 1]["kappa"], branch[switches[0]]["kappa"]
            verdict = "consistent" if lo < kc <= hi else "INCONSISTENT"
            print(f"{kernel}: from near-uniform, r decays for kappa <= {lo:.4g} and grows for kappa >= {hi:.4g}; "
                  f"kappa_c = {kc:.4g}: {verdict}")
        else:
            print(f"{kernel}: from near-uniform, grew = {grew} (kappa = {[round(r['kappa'], 4) for r in branch]}): "
                  f"no single switch; kappa_c = {kc:.4g}")
        worst = max((abs(r["r_final"] - r["r_self_consistent"]), r["kappa"]) for r in branch)
        print(f"{kernel}: largest |r(t_end) - r_self_consistent| = {worst[0]:.3g} at kappa = {worst[1]:.4g} "
              f"(near kappa_c the approach is slow: rate |gamma_1| -> 0)")

    plt = mf.pyplot()
    fig, axes = plt.subplots(1, len(kernels), figsize=(5.5 * len(kernels), 4.2), squeeze=False)
    for ax, kernel in zip(axes[0], kernels):
        for start, marker in zip(starts, ("o-", "s--")):
            part = sorted((r for r in rows if r["kernel"] == kernel and r["start"] == start), key=lambda r: r["kappa"])
            ax.errorbar([r["kappa_over_kc"] for r in part], [r["r_mean"] for r in part],
                        yerr=[r["r_std"] for r in part], fmt=marker, ms=4, label=f"solver, start {start}")
        part = sorted((r for r in rows if r["kernel"] == kernel and r["start"] == starts[0]), key=lambda r: r["kappa"])
        ax.plot([r["kappa_over_kc"] for r in part], [r["r_self_consistent"] for r in part], "k:", lw=1,
                label="self-consistent stationary state")
        ax.axvline(1.0, color="red", lw=1, label=f"kappa_c = {mf.kappa_critical(beta, kernel):.3g}")
        ax.set_xlabel("kappa / kappa_c  (kappa: inverse noise)")
        ax.set_ylabel(f"order parameter |int x dmu|, mean over t in [{args.average_from:g}, {args.horizon:g}]")
        ax.set_title(f"circle, {kernel.upper()}, beta = {beta:g}, M = {args.grid}")
        ax.legend(fontsize=7)
    mf.finish(fig, paths, clock, len(rows))


if __name__ == "__main__":
    main()
