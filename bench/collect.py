#!/usr/bin/python3
"""Runs the mfattn-vs-NumPy benchmark and writes bench/results.md (called by run_bench.sh).

Every measured command is recorded verbatim in the report. Wall clocks are taken here
(time.perf_counter around subprocess.run, so a mfattn row includes process start-up, the
initial state, HDF5 output and the observables of its two frames). Each command also gets
a contamination check: the CPU time the whole machine spent during the command (from
/proc/stat) minus the CPU time of the command itself (from getrusage of children); more
than 10 % of the machine's capacity used by others marks the row "noisy".
"""

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"
NCPU = os.cpu_count() or 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
DT = 0.01
THREADS = 2

COMMANDS = []  # (label, command string) for the report
RUNS = [0]  # commands run
NOISY = []  # labels of commands run while other processes used the CPUs


def proc_stat_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return (sum(v[:8]) - idle) / CLK_TCK


def machine_busy_fraction(interval=1.0):
    b0, t0 = proc_stat_busy(), time.perf_counter()
    time.sleep(interval)
    return (proc_stat_busy() - b0) / ((time.perf_counter() - t0) * NCPU)


WAIT_LEFT = [0.0]  # seconds of waiting for an idle machine left to the whole run


def wait_idle(max_wait, threshold=0.10):
    """Wait until the machine is (nearly) idle, within the run's waiting budget; returns the
    last busy fraction seen."""
    max_wait = min(max_wait, WAIT_LEFT[0])
    start = time.perf_counter()
    deadline = start + max_wait
    busy = machine_busy_fraction()
    while busy > threshold and time.perf_counter() < deadline:
        print(f"  machine {100 * busy:.0f}% busy with other work; waiting", file=sys.stderr)
        busy = machine_busy_fraction(2.0)
    WAIT_LEFT[0] = max(0.0, WAIT_LEFT[0] - (time.perf_counter() - start))
    return busy


def measured(label, cmd, argvs, env=None, record=True):
    """Starts every argv at once and waits for all; records cmd (the shell form) under label,
    and notes when other processes used the CPUs meanwhile. Returns (wall seconds, [(stdout,
    stderr)], foreign busy fraction)."""
    if record and all(c != cmd for _, c in COMMANDS):
        COMMANDS.append((label, cmd))
    RUNS[0] += 1
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0 = proc_stat_busy()
    t0 = time.perf_counter()
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    outputs = [p.communicate() for p in procs]
    wall = time.perf_counter() - t0
    b1 = proc_stat_busy()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for p, (out, err) in zip(procs, outputs):
        if p.returncode != 0:
            sys.exit(f"collect: command failed (rc {p.returncode}): {cmd}\n{out}\n{err}")
    own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    foreign = max(0.0, (b1 - b0) - own) / (wall * NCPU)
    if foreign > 0.10:
        NOISY.append(f"{label}: {100 * foreign:.0f}% of the CPUs used by other processes")
    return wall, outputs, foreign


def run(label, argv, env=None, record=True):
    """Runs argv; returns (wall seconds, stdout, stderr, foreign busy fraction)."""
    cmd = " ".join(shlex.quote(a) for a in argv)
    if env is not None:
        changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
        removed = [k for k in os.environ if k not in env]
        prefix = "env " + "".join(f"-u {k} " for k in sorted(removed))
        prefix += "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(changed.items()))
        if prefix != "env ":
            cmd = prefix + cmd
    wall, [(out, err)], foreign = measured(label, cmd, [argv], env, record)
    return wall, out, err, foreign


RETRIED = []  # groups measured again because the first attempt was noisy


def group(name, fn, wait, retries):
    """Runs fn() after waiting for an idle machine; repeats it (up to `retries` times) when
    other processes used the CPUs meanwhile, keeping the last attempt."""
    for attempt in range(retries + 1):
        print(name, file=sys.stderr)
        wait_idle(wait)
        mark = len(NOISY)
        result = fn()
        if len(NOISY) == mark or attempt == retries or WAIT_LEFT[0] <= 0:
            return result
        RETRIED.append(f"{name}: attempt {attempt + 1} was noisy ({'; '.join(NOISY[mark:])})")
        del NOISY[mark:]
    return result


def numpy_env():
    """NumPy's default threading (no *_NUM_THREADS), without the OpenBLAS core overrides."""
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
              "OPENBLAS_VERBOSE"):
        env.pop(k, None)
    return env


def mfattn_run_argv(mf, n, d, kernel, steps, out):
    horizon = f"{steps * DT:.10g}"
    return [mf, "run", "--n", str(n), "--d", str(d), "--beta", "1", "--kernel", kernel,
            "--integrator", "euler", "--dt", f"{DT:g}", "--horizon", horizon, "--save-every", horizon,
            "--init", "uniform", "--seed", "0", "--threads", str(THREADS), "--quiet", "--overwrite",
            "--out", out]


def h5_last_step(path):
    import h5py
    with h5py.File(path, "r") as f:
        return int(f["observables/energy/step"][-1])


def parse_bench(text):
    m = re.search(r"seconds_per_evaluation (\S+) pairs_per_second (\S+)", text)
    r = {"seconds_per_evaluation": float(m.group(1)), "pairs_per_second": float(m.group(2))}
    m = re.search(r" loop (\S+)", text)
    r["loop"] = m.group(1) if m else "one-sided"
    m = re.search(r"exp_per_second (\S+)", text)
    if m:
        r["exp_per_second"] = float(m.group(1))
    r["line"] = " ".join(text.split())
    return r


# Masks and auxiliary factors timed by the benchmark (n = 4096, d = 3, USA).
PAIR_TERM_CASES = [
    ("window 64", ["--mask", "window", "--window", "64"]),
    ("window 1000", ["--mask", "window", "--window", "1000"]),
    ("Gaussian factor, sigma 100", ["--aux-factor", "gaussian", "--aux-sigma", "100"]),
    ("distance factor, lambda 0.01", ["--aux-factor", "distance", "--aux-lambda", "0.01"]),
    ("causal mask + distance factor", ["--mask", "causal", "--aux-factor", "distance",
                                       "--aux-lambda", "0.01"]),
    ("causal mask", ["--mask", "causal"]),
]


def bench_argv(mf, n, d, kernel, min_time, roofline=False, threads=THREADS, cpu=None):
    argv = [mf, "bench", "--n", str(n), "--d", str(d), "--kernel", kernel, "--threads", str(threads),
            "--min-time", f"{min_time:g}"] + (["--roofline"] if roofline else [])
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + argv


def mfattn_bench(mf, n, d, kernel, min_time, roofline=False, threads=THREADS, cpu=None):
    argv = bench_argv(mf, n, d, kernel, min_time, roofline, threads, cpu)
    where = f" on cpu {cpu}" if cpu is not None else ""
    _, out, _, _ = run(f"mfattn bench n={n} d={d} {kernel} threads={threads}{where}", argv)
    return parse_bench(out)


def concurrent_bench(mf, n, d, kernel, min_time, roofline, cpus):
    """One single-thread `mfattn bench` per cpu, all started together: how much each core
    slows down while the others work (the processes share nothing but the machine)."""
    argvs = [bench_argv(mf, n, d, kernel, min_time, roofline, 1, c) for c in cpus]
    cmd = " & ".join(" ".join(shlex.quote(x) for x in argv) for argv in argvs) + "; wait"
    label = f"mfattn bench n={n} d={d} {kernel} threads=1 on cpus {','.join(map(str, cpus))} at once"
    _, outputs, _ = measured(label, cmd, argvs)
    return [parse_bench(out) for out, _ in outputs]


def mfattn_wall(mf, n, d, kernel, steps, tmp, repeats, every_step=False):
    out = os.path.join(tmp, f"mf_{n}_{d}_{kernel}_{steps}{'_frames' if every_step else ''}.h5")
    argv = mfattn_run_argv(mf, n, d, kernel, steps, out)
    if every_step:  # a frame (and its observables) after every step
        argv[argv.index("--save-every") + 1] = f"{DT:g}"
    walls = []
    for i in range(repeats):
        w, _, _, _ = run(f"mfattn run n={n} d={d} {kernel} {steps} steps"
                         f"{', a frame every step' if every_step else ''}", argv, record=(i == 0))
        walls.append(w)
    got = h5_last_step(out)
    if got != steps:
        sys.exit(f"collect: {out} ends at step {got}, expected {steps}")
    return {"best": min(walls), "median": statistics.median(walls), "all": walls, "h5": out}


def numpy_peer(n, d, kernel, steps, repeats, init_h5=None, gram="gemm"):
    argv = [PY, os.path.join(HERE, "numpy_peer.py"), "--n", str(n), "--d", str(d), "--kernel", kernel,
            "--steps", str(steps), "--beta", "1", "--dt", f"{DT:g}", "--seed", "0", "--gram", gram]
    if init_h5:
        argv += ["--init-h5", init_h5, "--compare"]
    res = []
    for i in range(repeats):
        _, out, _, _ = run(f"numpy n={n} d={d} {kernel} {steps} steps ({gram})", argv, env=numpy_env(),
                           record=(i == 0))
        res.append(json.loads(out.strip().splitlines()[-1]))
    best = min(res, key=lambda r: r["seconds_total"])
    best["all_totals"] = [r["seconds_total"] for r in res]
    return best


def peak_rss(mf, n, d, tmp):
    out = os.path.join(tmp, f"mf_rss_{n}.h5")
    argv = ["/usr/bin/time", "-v"] + mfattn_run_argv(mf, n, d, "usa", 1, out)
    wall, _, err, _ = run(f"mfattn run n={n} d={d} 1 step (peak RSS)", argv)
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
    if h5_last_step(out) != 1:
        sys.exit("collect: the n = 50000 run did not take exactly one step")
    return {"kbytes": kb, "wall": wall}


def fmt_s(x):
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} µs"


def verdict(ok):
    return "**met**" if ok else "**missed**"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mfattn", default=os.path.join(ROOT, "build", "mfattn"))
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each timed command")
    ap.add_argument("--idle-wait", type=float, default=60.0,
                    help="seconds to wait for other work to finish before starting")
    ap.add_argument("--wait-budget", type=float, default=90.0,
                    help="total seconds the run may spend waiting for an idle machine (waits and "
                         "retries stop when it is spent)")
    ap.add_argument("--group-wait", type=float, default=20.0,
                    help="seconds to wait for other work to finish before each group of commands")
    ap.add_argument("--retries", type=int, default=1,
                    help="times a group is measured again when other processes disturbed it")
    ap.add_argument("--note", action="append", default=[], help="line added to the report")
    a = ap.parse_args()
    mf = a.mfattn
    R = a.repeats
    t_all = time.perf_counter()

    WAIT_LEFT[0] = a.wait_budget
    busy_before = wait_idle(a.idle_wait)
    version = subprocess.run([mf, "--version"], capture_output=True, text=True).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               "?")
    import hashlib
    bin_time = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(mf)))
    bin_sha = hashlib.sha256(open(mf, "rb").read()).hexdigest()
    git_rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    # The report itself does not count as a change to the tree it measures.
    git_dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":!bench/results.md"],
                               capture_output=True, text=True).stdout.strip() != ""

    gemm = group("GEMM rate", lambda: json.loads(run("gemm_rate", [PY, os.path.join(HERE, "gemm_rate.py"),
                 "--threads", "1,2"])[1].strip().splitlines()[-1]), a.group_wait, a.retries)

    rows = {}
    with tempfile.TemporaryDirectory(prefix="mfattn_bench_") as tmp:
        for (n, d, kernel, target) in [(4096, 3, "usa", 8.0), (4096, 64, "usa", 3.0), (4096, 3, "sa", None)]:
            def g4096(n=n, d=d, kernel=kernel, target=target):
                steps = 20
                w20 = mfattn_wall(mf, n, d, kernel, steps, tmp, R)
                w1 = mfattn_wall(mf, n, d, kernel, 1, tmp, R)
                wf = mfattn_wall(mf, n, d, kernel, steps, tmp, 1, every_step=True)
                b = mfattn_bench(mf, n, d, kernel, 2.0 if d == 64 else 1.0)
                npg = numpy_peer(n, d, kernel, steps, R, init_h5=w20["h5"])
                nps = numpy_peer(n, d, kernel, steps, 1, init_h5=w20["h5"], gram="syrk")
                return dict(steps=steps, w20=w20, w1=w1, wf=wf, bench=b, np=npg, np_syrk=nps, target=target)
            rows[(n, d, kernel)] = group(f"n={n} d={d} {kernel}", g4096, a.group_wait, a.retries)

        def g256():
            w2000 = mfattn_wall(mf, 256, 3, "usa", 2000, tmp, R)
            w1s = mfattn_wall(mf, 256, 3, "usa", 1, tmp, R)
            b256 = mfattn_bench(mf, 256, 3, "usa", 1.0)
            np256 = numpy_peer(256, 3, "usa", 2000, R, init_h5=w2000["h5"])
            return w2000, w1s, b256, np256
        w2000, w1s, b256, np256 = group("n=256 d=3 usa 2000 steps", g256, a.group_wait, a.retries)

        rss = group("n=50000 d=3 one step, peak RSS", lambda: peak_rss(mf, 50000, 3, tmp),
                    a.group_wait, a.retries)
        def roofline():
            # Best of R for the pair rate and for the exp rate, as for every other time here:
            # on this shared machine one slow second of either would decide the ratio.
            runs = [mfattn_bench(mf, 4096, 3, "usa", 1.0, roofline=True) for _ in range(R)]
            best = dict(max(runs, key=lambda r: r["pairs_per_second"]))
            best["exp_per_second"] = max(r["exp_per_second"] for r in runs)
            best["all"] = [(r["pairs_per_second"], r["exp_per_second"]) for r in runs]
            return best
        roof3 = group("roofline", roofline, a.group_wait, a.retries)

        def per_core():
            # The same roofline on one thread pinned to each core alone, then on every core at
            # once (independent processes): the loop's own efficiency per core, and how much a
            # core slows down while the other one works.
            alone = {}
            for c in range(NCPU):
                runs = [mfattn_bench(mf, 4096, 3, "usa", 1.0, roofline=True, threads=1, cpu=c)
                        for _ in range(R)]
                alone[c] = dict(pairs=max(r["pairs_per_second"] for r in runs),
                                exps=max(r["exp_per_second"] for r in runs))
            together = {c: dict(pairs=0.0, exps=0.0) for c in range(NCPU)}
            for _ in range(R):
                for c, r in enumerate(concurrent_bench(mf, 4096, 3, "usa", 1.0, True, list(range(NCPU)))):
                    together[c]["pairs"] = max(together[c]["pairs"], r["pairs_per_second"])
                    together[c]["exps"] = max(together[c]["exps"], r["exp_per_second"])
            return alone, together
        cores = group("roofline per core", per_core, a.group_wait, a.retries)

        def pair_terms():
            # Masks and auxiliary factors at n = 4096, d = 3, USA: which loop takes them and
            # its time per evaluation (best of R).
            out = []
            for label, extra in PAIR_TERM_CASES:
                runs = []
                for _ in range(R):
                    argv = bench_argv(mf, 4096, 3, "usa", 1.0) + extra
                    _, text, _, _ = run(f"mfattn bench n=4096 d=3 usa {label}", argv)
                    runs.append(parse_bench(text))
                best = min(runs, key=lambda r: r["seconds_per_evaluation"])
                out.append((label, " ".join(extra), best))
            return out
        terms = group("pair terms", pair_terms, a.group_wait, a.retries)
    roof64 = rows[(4096, 64, "usa")]["bench"]
    elapsed = time.perf_counter() - t_all

    # ---------------------------------------------------------------- report
    g2, g1 = gemm["threads"]["2"], gemm["threads"]["1"]
    np_core = rows[(4096, 3, "usa")]["np"]["openblas"]
    L = []
    L.append("# mfattn vs dense NumPy: benchmark results\n")
    L.append(f"Generated by `bench/run_bench.sh` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')} "
             f"in {elapsed:.0f} s.\n")
    if NOISY:
        L.append(f"**Warning: {len(NOISY)} of the {RUNS[0]} commands ran while other processes used "
                 f"the CPUs (see Measurement quality); their times are inflated.**\n")
    L.append(f"- Machine: {cpu}, {NCPU} CPUs; machine busy before start: {100 * busy_before:.0f}%.")
    L.append(f"- mfattn: `{version}` (the revision in `--version` is the one at CMake configure time), "
             f"binary `{os.path.relpath(mf, ROOT)}` built {bin_time}, sha256 {bin_sha[:12]}; tree at {git_rev}"
             f"{' with uncommitted changes' if git_dirty else ''}; Release build, `--threads {THREADS}`.")
    L.append(f"- NumPy {rows[(4096, 3, 'usa')]['np']['numpy']} with {np_core['config']}; "
             f"OpenBLAS core **{np_core['core']}**, {np_core['threads']} OpenBLAS threads (its default; "
             f"element-wise NumPy work is single-threaded). `OPENBLAS_CORETYPE` and `OPENBLAS_L2_SIZE` "
             f"are unset for the NumPy and GEMM commands only.")
    L.append("- NumPy peer (`bench/numpy_peer.py`): the dense float64 Euler step, n x n work in place, "
             "G formed by dgemm (`X @ ascontiguousarray(X.T)`); timed loop only (no imports, no set-up). "
             "Its final state is compared with mfattn's from the same initial state (column max |ΔX|).")
    L.append(f"- mfattn wall = whole process (start-up, init, HDF5 output, observables of 2 frames "
             f"incl. the O(n² d) min inner product), best of {R}; "
             f"marginal = (wall(20 steps) − wall(1 step)) / 19, the per-step cost without fixed costs; "
             f"eval = `mfattn bench` seconds per velocity evaluation; observables / frame = (wall(20 steps, "
             f"21 frames) − wall(20 steps, 2 frames)) / 19, one run.")
    for note in a.note:
        L.append(f"- {note}")
    L.append("")

    L.append("## Per-step time, n = 4096 (20 Euler steps, dt = 0.01, beta = 1)\n")
    L.append("Targets are judged like for like: NumPy's timed loop (no interpreter start-up, no imports) "
             "against mfattn's marginal cost per step (no process start-up, no file creation); the "
             "whole-process ratio is shown next to it.\n")
    L.append("| case | pair loop | mfattn wall / step (2 thr) | mfattn marginal / step | mfattn eval (bench) | "
             "mfattn observables / frame | NumPy / step (OpenBLAS 2 thr) | ratio NumPy / mfattn marginal | "
             "ratio NumPy / mfattn wall | ratio vs eval | NumPy literal `X @ X.T` / step | max \\|ΔX\\| | target |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (n, d, kernel), r in rows.items():
        s = r["steps"]
        mw = r["w20"]["best"] / s
        marg = (r["w20"]["best"] - r["w1"]["best"]) / (s - 1)
        ev = r["bench"]["seconds_per_evaluation"]
        frame = (r["wf"]["best"] - r["w20"]["best"]) / (s - 1)
        nps = r["np"]["seconds_per_step"]
        ratio = nps / mw
        like = nps / marg
        tgt = r["target"]
        tgt_s = f">= {tgt:g}x: {verdict(like >= tgt)}" if tgt else "(none given)"
        L.append(f"| n={n} d={d} {kernel.upper()} | {r['bench']['loop']} | {fmt_s(mw)} | {fmt_s(marg)} | {fmt_s(ev)} | "
                 f"{fmt_s(frame)} | {fmt_s(nps)} | **{like:.1f}x** | {ratio:.1f}x | {nps / ev:.1f}x | "
                 f"{fmt_s(r['np_syrk']['seconds_per_step'])} "
                 f"({r['np_syrk']['seconds_per_step'] / mw:.1f}x) | {r['np']['max_abs_diff_vs_mfattn']:.1e} | "
                 f"{tgt_s} |")
    L.append("")

    L.append("## Whole run, n = 256, d = 3, USA, 2000 Euler steps\n")
    L.append("| mfattn wall, one process (2 thr) | mfattn wall, 1 step (fixed cost) | mfattn 2000 steps without "
             "fixed cost (x 2000/1999) | mfattn eval (bench) x 2000 | NumPy 2000-step loop | ratio NumPy / mfattn "
             "without fixed cost | ratio NumPy / mfattn wall | max \\|ΔX\\| after 2000 steps | target |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    r256 = np256["seconds_total"] / w2000["best"]
    loop256 = (w2000["best"] - w1s["best"]) * 2000 / 1999
    like256 = np256["seconds_total"] / loop256
    L.append(f"| {fmt_s(w2000['best'])} (median {fmt_s(w2000['median'])}) | {fmt_s(w1s['best'])} | "
             f"{fmt_s(loop256)} | {fmt_s(2000 * b256['seconds_per_evaluation'])} | {fmt_s(np256['seconds_total'])} | "
             f"**{like256:.2f}x** | {r256:.2f}x | {np256['max_abs_diff_vs_mfattn']:.1e} | "
             f">= 10x: {verdict(like256 >= 10)} |")
    L.append("")

    L.append("## Memory, n = 50000, d = 3, one step\n")
    mb = rss["kbytes"] * 1024 / 1e6
    L.append("| mfattn peak RSS (`/usr/bin/time -v`) | mfattn wall | NumPy (not run) | target |")
    L.append("|---|---|---|---|")
    nn = 50000 ** 2 * 8 / 1e9
    L.append(f"| **{mb:.1f} MB** ({rss['kbytes']} KiB) | {fmt_s(rss['wall'])} | {nn:.0f} GB per n x n float64 "
             f"matrix (>= {nn:.0f} GB with the in-place peer, {2 * nn:.0f} GB for G and W separately) | "
             f"< 200 MB: {verdict(mb < 200)} |")
    L.append("")

    L.append("## Roofline (`mfattn bench`, n = 4096, 2 threads)\n")
    L.append(f"Best of {R} runs of `mfattn bench --roofline` for each rate (every run in Measurement quality). "
             f"The per-cpu rows pin one thread to each core (`taskset`), first alone, then with every core "
             f"running the same command at once as independent processes: they show the loop's efficiency "
             f"on one core and how much a core slows down while the other one works.\n")
    L.append("| case | achieved | roofline | percent | target |")
    L.append("|---|---|---|---|---|")
    p3 = roof3["pairs_per_second"] / roof3["exp_per_second"]
    # The symmetric loop takes one exp per unordered pair and 3 d flops per ordered pair (the
    # logit once, both sums); the one-sided loop one exp and 4 d flops per ordered pair.
    exps_per_pair3 = 0.5 if roof3["loop"] == "symmetric" else 1.0
    L.append(f"| d=3 USA: pairs/s vs exp/s (`--roofline`), {roof3['loop']} loop | "
             f"{roof3['pairs_per_second']:.3e} pairs/s | {roof3['exp_per_second']:.3e} exp/s | "
             f"**{100 * p3:.0f}%** | >= 80%: {verdict(p3 >= 0.8)} |")
    L.append(f"| d=3 USA: exps the loop takes per second vs exp/s ({exps_per_pair3:g} exp per pair) | "
             f"{exps_per_pair3 * roof3['pairs_per_second']:.3e} exp/s | {roof3['exp_per_second']:.3e} exp/s | "
             f"{100 * exps_per_pair3 * p3:.0f}% | (info: the loop's own efficiency) |")
    alone, together = cores
    for c in sorted(alone):
        pa, pt = alone[c], together[c]
        L.append(f"| d=3 USA, 1 thread on cpu {c} alone: pairs/s vs exp/s | {pa['pairs']:.3e} pairs/s | "
                 f"{pa['exps']:.3e} exp/s | {100 * pa['pairs'] / pa['exps']:.0f}% | (info: the loop on one core) |")
        L.append(f"| d=3 USA, 1 thread on cpu {c} while every cpu runs the same (independent processes) | "
                 f"{pt['pairs']:.3e} pairs/s ({100 * (pt['pairs'] / pa['pairs'] - 1):+.0f}% vs alone) | "
                 f"{pt['exps']:.3e} exp/s ({100 * (pt['exps'] / pa['exps'] - 1):+.0f}% vs alone) | "
                 f"{100 * pt['pairs'] / pt['exps']:.0f}% | (info: a core's speed while the other works) |")
    flops_per_pair64 = (3 if roof64["loop"] == "symmetric" else 4) * 64
    fl64 = roof64["pairs_per_second"] * flops_per_pair64
    ref64 = max(g2[k]["gflops"] for k in ("scores", "wsum", "square")) * 1e9
    p64 = fl64 / ref64
    L.append(f"| d=64 USA: pairs/s x {flops_per_pair64 // 64}d flops ({roof64['loop']} loop) vs the best 2-thread NumPy dgemm rate measured (any shape) | "
             f"{fl64 / 1e9:.1f} GFLOP/s | {ref64 / 1e9:.1f} GFLOP/s | **{100 * p64:.0f}%** | "
             f">= 80%: {verdict(p64 >= 0.8)} |")
    pair64 = g2["pair"]["gflops"] * 1e9
    L.append(f"| d=64 USA vs NumPy doing the two d=64 products of a step, 2 threads | {fl64 / 1e9:.1f} GFLOP/s | "
             f"{pair64 / 1e9:.1f} GFLOP/s | {100 * fl64 / pair64:.0f}% | (info: these thin shapes are "
             f"limited by the n x n output, not a roofline) |")
    L.append("")

    L.append("## Masks and auxiliary factors (`mfattn bench`, n = 4096, d = 3, USA, 2 threads)\n")
    L.append(f"Best of {R} runs each. Windows and the distance and Gaussian factors are symmetric in "
             f"the positions and take the symmetric loop (blocks beyond the window skipped); the causal "
             f"mask runs one-sided.\n")
    L.append("| case | options | pair loop | seconds per evaluation | pairs/s |")
    L.append("|---|---|---|---|---|")
    for label, options, r in terms:
        L.append(f"| {label} | `{options}` | {r['loop']} | {fmt_s(r['seconds_per_evaluation'])} | "
                 f"{r['pairs_per_second']:.3e} |")
    L.append("")

    L.append("## Dense GEMM rate (`bench/gemm_rate.py`, float64, best of 7, GFLOP/s)\n")
    L.append("| threads | OpenBLAS core | (4096x64)@(64x4096) | (4096x4096)@(4096x64) | both d=64 products | 2048³ |")
    L.append("|---|---|---|---|---|---|")
    for t in ("1", "2"):
        g = gemm["threads"][t]
        L.append(f"| {t} | {g['openblas_core']} | {g['scores']['gflops']:.1f} | {g['wsum']['gflops']:.1f} | "
                 f"{g['pair']['gflops']:.1f} | {g['square']['gflops']:.1f} |")
    L.append("")

    L.append("## mfattn bench lines\n")
    L.append("```")
    for (n, d, kernel), r in rows.items():
        L.append(r["bench"]["line"])
    L.append(b256["line"])
    L.append(roof3["line"])
    L.append("```\n")

    L.append("## Measurement quality\n")
    if NOISY:
        L.append("Commands that shared the CPUs with other processes (their times are inflated):\n")
        for x in NOISY:
            L.append(f"- {x}")
    else:
        L.append("No command shared the CPUs with other processes for more than 10% of the machine.")
    if RETRIED:
        L.append("\nGroups measured again (the table shows the later attempt):\n")
        for x in RETRIED:
            L.append(f"- {x}")
    L.append("")
    L.append("All wall times (seconds), every repeat:\n")
    L.append("```")
    for (n, d, kernel), r in rows.items():
        L.append(f"n={n} d={d} {kernel}: mfattn 20 steps {['%.3f' % x for x in r['w20']['all']]}, "
                 f"1 step {['%.3f' % x for x in r['w1']['all']]}, numpy 20 steps {['%.3f' % x for x in r['np']['all_totals']]}")
    L.append("roofline d=3 usa (pairs/s, exp/s): " + ", ".join(f"({p:.3e}, {e:.3e})" for p, e in roof3["all"]))
    L.append(f"n=256 d=3 usa: mfattn 2000 steps {['%.3f' % x for x in w2000['all']]}, "
             f"1 step {['%.3f' % x for x in w1s['all']]}, numpy 2000 steps {['%.3f' % x for x in np256['all_totals']]}")
    L.append("```\n")

    L.append("## Exact commands\n")
    L.append("Run from any directory; each was run as shown (repeats not listed twice). "
             "`$TMP` stands for the temporary output directory.\n")
    L.append("```sh")
    for label, cmd in COMMANDS:
        L.append(f"# {label}")
        L.append(cmd.replace(tmp, "$TMP"))
    L.append("```")

    text = "\n".join(L) + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
