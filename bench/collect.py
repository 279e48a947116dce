#!/usr/bin/python3
"""Runs the mfattn-vs-NumPy benchmark and writes bench/results.md (called by run_bench.sh).

Every measured command is recorded verbatim in the report. Wall clocks are taken here
(time.perf_counter around subprocess.run, so a mfattn row includes process start-up, the
initial state, HDF5 output and the observables of its two frames). Each command also gets
a contamination check: the CPU time the whole machine spent during the command (from
/proc/stat) minus the CPU time of the command itself (from getrusage of children); more
than 10 % of the machine's capacity used by others marks the row "noisy".

mfattn is measured on its default kernels (the run-time choice) and, for the n = 4096 d = 3 and
d = 64, the n = 256 2000-step and the roofline cases, once more on the AVX2 kernels of the same
binary (MFATTN_CPU_KERNELS=avx2) against an AVX2 NumPy peer (OPENBLAS_CORETYPE=Haswell, NumPy's
AVX-512 loops off through NPY_DISABLE_CPU_FEATURES) and the Haswell dgemm rate. The --exp-peers
programs (bench/exp_peers.cpp) time mfattn's exponential against Eigen's, SLEEF's and libmvec's
built for the same ISA, and the FMA peak, on one core (taskset -c 0).
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


def numpy_env(avx2=False):
    """NumPy's default threading (no *_NUM_THREADS), without the OpenBLAS core overrides.
    avx2: the peer an AVX2+FMA machine gets: OpenBLAS's Haswell kernels and NumPy's AVX-512
    loops switched off (NPY_DISABLE_CPU_FEATURES; NumPy 1.24 honours it at import)."""
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
              "OPENBLAS_VERBOSE", "NPY_DISABLE_CPU_FEATURES"):
        env.pop(k, None)
    if avx2:
        env["OPENBLAS_CORETYPE"] = "Haswell"
        env["NPY_DISABLE_CPU_FEATURES"] = NPY_NO_AVX512
    elif DEFAULT_CORE[0]:
        env["OPENBLAS_CORETYPE"] = DEFAULT_CORE[0]
    return env


# OpenBLAS cores without AVX: when OpenBLAS 0.3.21 does not know a newer CPU it falls back to
# one of these, and the default peer would then be slower than the CPU allows. The default
# peer is then given the best core the CPU's flags support (said in the report).
OPENBLAS_FALLBACK_CORES = {"Prescott", "Core2", "Nehalem", "Katmai", "Coppermine", "Northwood",
                           "Atom", "unknown"}
DEFAULT_CORE = [None]


def choose_default_core():
    detected = numpy_features(numpy_env()).get("openblas_core", "unknown")
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo")
                  if ln.startswith("flags")), [])
    if detected in OPENBLAS_FALLBACK_CORES:
        if "avx512f" in flags:
            DEFAULT_CORE[0] = "SkylakeX"
        elif "avx2" in flags:
            DEFAULT_CORE[0] = "Haswell"
    return detected


# NumPy 1.24's dispatch targets above AVX2 (numpy.core._multiarray_umath.__cpu_dispatch__).
NPY_NO_AVX512 = "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"

# The kernel sets of mfattn measured: None = the default (run-time choice, the best this CPU
# runs), "avx2" = MFATTN_CPU_KERNELS=avx2, the AVX2+FMA kernels of the same binary.
AVX2_LABEL = "AVX2 kernels (x86-64-v3)"


def mf_env(kernels):
    env = dict(os.environ)
    env.pop("MFATTN_CPU_KERNELS", None)
    if kernels:
        env["MFATTN_CPU_KERNELS"] = kernels
    return env


def numpy_features(env):
    """What the NumPy/OpenBLAS environment really did: NumPy's AVX-512 features as seen after
    import, the float64 exp rate of np.exp, and the core OpenBLAS names (OPENBLAS_VERBOSE=2)."""
    code = ("import json, time, numpy as np, numpy.core._multiarray_umath as m\n"
            "f = m.__cpu_features__\n"
            "a = -25 * np.random.default_rng(0).random(1 << 20); o = np.empty_like(a)\n"
            "np.exp(a, out=o); best = 1e9\n"
            "for _ in range(5):\n"
            "    t0 = time.perf_counter(); np.exp(a, out=o); best = min(best, time.perf_counter() - t0)\n"
            "print(json.dumps({'numpy_avx512f': f.get('AVX512F'), 'numpy_avx512_skx': f.get('AVX512_SKX'), "
            "'numpy_avx2': f.get('AVX2'), 'np_exp_per_second': a.size / best}))\n")
    e = dict(env)
    e["OPENBLAS_VERBOSE"] = "2"
    p = subprocess.run(["taskset", "-c", "0", PY, "-c", code], env=e, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-300:]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    core = [ln.split(":", 1)[1].strip() for ln in p.stderr.splitlines() if ln.startswith("Core:")]
    r["openblas_core"] = core[0] if core else "unknown"
    r["warnings"] = [ln for ln in p.stderr.splitlines() if not ln.startswith("Core:")][:3]
    return r


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
    m = re.search(r"cpu_kernels (\S+)", text)
    r["cpu_kernels"] = m.group(1) if m else "?"
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


def mfattn_bench(mf, n, d, kernel, min_time, roofline=False, threads=THREADS, cpu=None, kernels=None):
    argv = bench_argv(mf, n, d, kernel, min_time, roofline, threads, cpu)
    where = f" on cpu {cpu}" if cpu is not None else ""
    tag = f", {kernels} kernels" if kernels else ""
    _, out, _, _ = run(f"mfattn bench n={n} d={d} {kernel} threads={threads}{where}{tag}", argv, env=mf_env(kernels))
    return parse_bench(out)


def concurrent_bench(mf, n, d, kernel, min_time, roofline, cpus):
    """One single-thread `mfattn bench` per cpu, all started together: how much each core
    slows down while the others work (the processes share nothing but the machine)."""
    argvs = [bench_argv(mf, n, d, kernel, min_time, roofline, 1, c) for c in cpus]
    cmd = " & ".join(" ".join(shlex.quote(x) for x in argv) for argv in argvs) + "; wait"
    label = f"mfattn bench n={n} d={d} {kernel} threads=1 on cpus {','.join(map(str, cpus))} at once"
    _, outputs, _ = measured(label, cmd, argvs)
    return [parse_bench(out) for out, _ in outputs]


def mfattn_wall(mf, n, d, kernel, steps, tmp, repeats, every_step=False, kernels=None):
    out = os.path.join(tmp, f"mf_{n}_{d}_{kernel}_{steps}{'_frames' if every_step else ''}"
                            f"{'_' + kernels if kernels else ''}.h5")
    argv = mfattn_run_argv(mf, n, d, kernel, steps, out)
    if every_step:  # a frame (and its observables) after every step
        argv[argv.index("--save-every") + 1] = f"{DT:g}"
    walls = []
    for i in range(repeats):
        w, _, _, _ = run(f"mfattn run n={n} d={d} {kernel} {steps} steps"
                         f"{', a frame every step' if every_step else ''}{', ' + kernels + ' kernels' if kernels else ''}",
                         argv, env=mf_env(kernels), record=(i == 0))
        walls.append(w)
    got = h5_last_step(out)
    if got != steps:
        sys.exit(f"collect: {out} ends at step {got}, expected {steps}")
    return {"best": min(walls), "median": statistics.median(walls), "all": walls, "h5": out}


def numpy_peer(n, d, kernel, steps, repeats, init_h5=None, gram="gemm", avx2=False):
    argv = [PY, os.path.join(HERE, "numpy_peer.py"), "--n", str(n), "--d", str(d), "--kernel", kernel,
            "--steps", str(steps), "--beta", "1", "--dt", f"{DT:g}", "--seed", "0", "--gram", gram]
    if init_h5:
        argv += ["--init-h5", init_h5, "--compare"]
    res = []
    for i in range(repeats):
        _, out, _, _ = run(f"numpy n={n} d={d} {kernel} {steps} steps ({gram}"
                           f"{', AVX2 peer' if avx2 else ''})", argv, env=numpy_env(avx2), record=(i == 0))
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
    ap.add_argument("--exp-peers", action="append", default=[],
                    help="a build of bench/exp_peers.cpp (one per instruction set; run_bench.sh passes "
                         "build/bench-exp-peers-v3 and build/bench-exp-peers-native)")
    ap.add_argument("--avx2-repeats", type=int, default=None,
                    help="repeats of each timed command for the AVX2-kernel rows (default: min(repeats, 2))")
    a = ap.parse_args()
    mf = a.mfattn
    R = a.repeats
    R2 = a.avx2_repeats if a.avx2_repeats is not None else min(R, 2)
    t_all = time.perf_counter()

    WAIT_LEFT[0] = a.wait_budget
    busy_before = wait_idle(a.idle_wait)
    # --version is several lines (the build, the kernel sets): one line of the report.
    version = "; ".join(ln.strip() for ln in subprocess.run([mf, "--version"], capture_output=True,
                                                             text=True).stdout.strip().splitlines())
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

    detected_core = choose_default_core()
    gemm = group("GEMM rate", lambda: json.loads(run("gemm_rate", [PY, os.path.join(HERE, "gemm_rate.py"),
                 "--threads", "1,2", "--keep-env"], env=numpy_env())[1].strip().splitlines()[-1]),
                 a.group_wait, a.retries)
    # The dgemm an AVX2+FMA machine gets: OpenBLAS's Haswell kernels (kept by --keep-env).
    gemm_avx2 = group("GEMM rate, OpenBLAS Haswell kernels", lambda: json.loads(run(
        "gemm_rate (OpenBLAS Haswell kernels)", [PY, os.path.join(HERE, "gemm_rate.py"), "--threads", "1,2",
                                                  "--repeats", "5", "--keep-env"],
        env=numpy_env(avx2=True))[1].strip().splitlines()[-1]), a.group_wait, a.retries)
    np_feat = {"default": numpy_features(numpy_env()), "avx2": numpy_features(numpy_env(avx2=True))}

    def exp_peers():
        # One thread pinned to cpu 0, each build in turn (each interleaves its methods).
        out = []
        for path in a.exp_peers:
            _, text, _, _ = run(f"exp peers {os.path.basename(path)} on cpu 0", ["taskset", "-c", "0", path])
            r = json.loads(text)
            r["binary"] = os.path.relpath(path, ROOT)
            out.append(r)
        return out
    peers = group("exp and FMA rooflines, one core", exp_peers, a.group_wait, a.retries) if a.exp_peers else []

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

        # The same binary on its AVX2 kernels against the AVX2 peer (Haswell OpenBLAS, NumPy
        # without its AVX-512 loops), R2 repeats, no syrk variant.
        rows_avx2 = {}
        for (n, d, kernel, target) in [(4096, 3, "usa", 10.0), (4096, 64, "usa", 3.0)]:
            def g4096_avx2(n=n, d=d, kernel=kernel, target=target):
                steps = 20
                w20 = mfattn_wall(mf, n, d, kernel, steps, tmp, R2, kernels="avx2")
                w1 = mfattn_wall(mf, n, d, kernel, 1, tmp, R2, kernels="avx2")
                wf = mfattn_wall(mf, n, d, kernel, steps, tmp, 1, every_step=True, kernels="avx2")
                b = mfattn_bench(mf, n, d, kernel, 2.0 if d == 64 else 1.0, kernels="avx2")
                npg = numpy_peer(n, d, kernel, steps, R2, init_h5=w20["h5"], avx2=True)
                return dict(steps=steps, w20=w20, w1=w1, wf=wf, bench=b, np=npg, np_syrk=None, target=target)
            rows_avx2[(n, d, kernel)] = group(f"n={n} d={d} {kernel}, {AVX2_LABEL}", g4096_avx2,
                                              a.group_wait, a.retries)

        def g256(kernels=None, reps=R):
            w2000 = mfattn_wall(mf, 256, 3, "usa", 2000, tmp, reps, kernels=kernels)
            w1s = mfattn_wall(mf, 256, 3, "usa", 1, tmp, reps, kernels=kernels)
            b256 = mfattn_bench(mf, 256, 3, "usa", 1.0, kernels=kernels)
            np256 = numpy_peer(256, 3, "usa", 2000, reps, init_h5=w2000["h5"], avx2=bool(kernels))
            return w2000, w1s, b256, np256
        w2000, w1s, b256, np256 = group("n=256 d=3 usa 2000 steps", g256, a.group_wait, a.retries)
        r256_avx2 = group(f"n=256 d=3 usa 2000 steps, {AVX2_LABEL}", lambda: g256("avx2", R2),
                          a.group_wait, a.retries)

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

        def roofline_avx2():
            runs = [mfattn_bench(mf, 4096, 3, "usa", 1.0, roofline=True, kernels="avx2") for _ in range(R2)]
            best = dict(max(runs, key=lambda r: r["pairs_per_second"]))
            best["exp_per_second"] = max(r["exp_per_second"] for r in runs)
            best["all"] = [(r["pairs_per_second"], r["exp_per_second"]) for r in runs]
            # One thread on cpu 0, where the exp peers ran: the pair rate per core.
            one = [mfattn_bench(mf, 4096, 3, "usa", 1.0, roofline=True, threads=1, cpu=0, kernels="avx2")
                   for _ in range(R2)]
            best["cpu0"] = dict(pairs=max(r["pairs_per_second"] for r in one),
                                exps=max(r["exp_per_second"] for r in one))
            return best
        roof3_avx2 = group(f"roofline, {AVX2_LABEL}", roofline_avx2, a.group_wait, a.retries)

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
             f"are unset for the NumPy and GEMM commands only"
             + (f", except that OpenBLAS detected core {detected_core} (no AVX: it does not know this CPU), "
                f"so the default peer and GEMM run with `OPENBLAS_CORETYPE={DEFAULT_CORE[0]}`, the best "
                f"core the CPU's flags support." if DEFAULT_CORE[0] else "."))
    L.append("- NumPy peer (`bench/numpy_peer.py`): the dense float64 Euler step, n x n work in place, "
             "G formed by dgemm (`X @ ascontiguousarray(X.T)`); timed loop only (no imports, no set-up). "
             "Its final state is compared with mfattn's from the same initial state (column max |ΔX|).")
    L.append(f"- mfattn wall = whole process (start-up, init, HDF5 output, observables of 2 frames "
             f"incl. the O(n² d) min inner product), best of {R}; "
             f"marginal = (wall(20 steps) − wall(1 step)) / 19, the per-step cost without fixed costs; "
             f"eval = `mfattn bench` seconds per velocity evaluation; observables / frame = (wall(20 steps, "
             f"21 frames) − wall(20 steps, 2 frames)) / 19, one run.")
    kset = rows[(4096, 3, "usa")]["bench"]["cpu_kernels"]
    np_avx2 = rows_avx2[(4096, 3, "usa")]["np"]["openblas"]
    L.append(f"- mfattn kernel sets: the default rows run the binary's own run-time choice (`cpu_kernels "
             f"{kset}` in its bench lines); the rows marked **{AVX2_LABEL}** run the same binary with "
             f"`MFATTN_CPU_KERNELS=avx2`, best of {R2} (fewer repeats than the default rows), against the "
             f"AVX2 peer: NumPy with `OPENBLAS_CORETYPE=Haswell` (OpenBLAS core **{np_avx2['core']}**) and "
             f"`NPY_DISABLE_CPU_FEATURES=\"{NPY_NO_AVX512}\"` (NumPy's AVX-512 loops off).")
    fd, fa = np_feat["default"], np_feat["avx2"]
    if "error" in fd or "error" in fa:
        L.append(f"- NumPy feature check failed: {fd.get('error') or fa.get('error')}")
    else:
        took = (fa["numpy_avx512f"] is False and fa["numpy_avx512_skx"] is False)
        L.append(f"- What the peers' settings did (checked in this run, one thread on cpu 0): default NumPy "
                 f"AVX512F={fd['numpy_avx512f']}, np.exp float64 {fd['np_exp_per_second']:.3e}/s, OpenBLAS "
                 f"core {fd['openblas_core']}; AVX2 peer AVX512F={fa['numpy_avx512f']}, AVX512_SKX="
                 f"{fa['numpy_avx512_skx']}, np.exp float64 {fa['np_exp_per_second']:.3e}/s, OpenBLAS core "
                 f"{fa['openblas_core']}: `NPY_DISABLE_CPU_FEATURES` "
                 f"{'took effect' if took else 'did NOT take effect'} (NumPy 1.24 has no AVX2 float64 exp "
                 f"loop, so np.exp falls back to its scalar path), `OPENBLAS_CORETYPE=Haswell` "
                 f"{'took effect' if fa['openblas_core'].lower() == 'haswell' else 'did NOT take effect'}."
                 + (f" Warnings: {'; '.join(fa['warnings'])}" if fa["warnings"] else ""))
    if np_core["core"].lower() in ("prescott", "core2", "penryn", "nehalem", "unknown"):
        L.append(f"- **Warning: OpenBLAS did not recognise this CPU and runs its {np_core['core']} kernels "
                 f"(SSE) for the default NumPy and GEMM rows: the default peer and the default dgemm rate "
                 f"are weaker than this CPU allows.** The AVX2 rows force Haswell and are not affected.")
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
    def step_row(n, d, kernel, r, label=""):
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
        syrk = (f"{fmt_s(r['np_syrk']['seconds_per_step'])} ({r['np_syrk']['seconds_per_step'] / mw:.1f}x)"
                if r["np_syrk"] else "(not run)")
        L.append(f"| n={n} d={d} {kernel.upper()}{label} | {r['bench']['loop']} | {fmt_s(mw)} | {fmt_s(marg)} | "
                 f"{fmt_s(ev)} | {fmt_s(frame)} | {fmt_s(nps)} | **{like:.1f}x** | {ratio:.1f}x | {nps / ev:.1f}x | "
                 f"{syrk} | {r['np']['max_abs_diff_vs_mfattn']:.1e} | {tgt_s} |")
    for (n, d, kernel), r in rows.items():
        step_row(n, d, kernel, r)
    for (n, d, kernel), r in rows_avx2.items():
        step_row(n, d, kernel, r, f", **{AVX2_LABEL}** vs NumPy on OpenBLAS {r['np']['openblas']['core']}, "
                                  f"no AVX-512 loops")
    L.append("")

    L.append("## Whole run, n = 256, d = 3, USA, 2000 Euler steps\n")
    L.append("| kernels | mfattn wall, one process (2 thr) | mfattn wall, 1 step (fixed cost) | mfattn 2000 steps without "
             "fixed cost (x 2000/1999) | mfattn eval (bench) x 2000 | NumPy 2000-step loop | ratio NumPy / mfattn "
             "without fixed cost | ratio NumPy / mfattn wall | max \\|ΔX\\| after 2000 steps | target |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for label, (w2000_, w1s_, b256_, np256_), tgt in [
            (f"default ({b256['cpu_kernels']})", (w2000, w1s, b256, np256), 10.0),
            (f"**{AVX2_LABEL}** vs NumPy on OpenBLAS {r256_avx2[3]['openblas']['core']}, no AVX-512 loops",
             r256_avx2, 8.0)]:
        r256 = np256_["seconds_total"] / w2000_["best"]
        loop256 = (w2000_["best"] - w1s_["best"]) * 2000 / 1999
        like256 = np256_["seconds_total"] / loop256
        L.append(f"| {label} | {fmt_s(w2000_['best'])} (median {fmt_s(w2000_['median'])}) | {fmt_s(w1s_['best'])} | "
                 f"{fmt_s(loop256)} | {fmt_s(2000 * b256_['seconds_per_evaluation'])} | "
                 f"{fmt_s(np256_['seconds_total'])} | **{like256:.2f}x** | {r256:.2f}x | "
                 f"{np256_['max_abs_diff_vs_mfattn']:.1e} | >= {tgt:g}x: {verdict(like256 >= tgt)} |")
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
    # The AVX2 kernels of the same binary, against their own exp rate and the Haswell dgemm.
    ra = roof3_avx2
    pa3 = ra["pairs_per_second"] / ra["exp_per_second"]
    L.append(f"| d=3 USA, **{AVX2_LABEL}**: pairs/s vs exp/s (`--roofline`, best of {R2}), {ra['loop']} loop | "
             f"{ra['pairs_per_second']:.3e} pairs/s | {ra['exp_per_second']:.3e} exp/s | **{100 * pa3:.0f}%** | "
             f">= 80%: {verdict(pa3 >= 0.8)} |")
    roof64a = rows_avx2[(4096, 64, "usa")]["bench"]
    fpp64a = (3 if roof64a["loop"] == "symmetric" else 4) * 64
    fl64a = roof64a["pairs_per_second"] * fpp64a
    g2a = gemm_avx2["threads"]["2"]
    ref64a = max(g2a[k]["gflops"] for k in ("scores", "wsum", "square")) * 1e9
    p64a = fl64a / ref64a
    L.append(f"| d=64 USA, **{AVX2_LABEL}**: pairs/s x {fpp64a // 64}d flops ({roof64a['loop']} loop) vs the best "
             f"2-thread NumPy dgemm rate of this run on OpenBLAS {g2a['openblas_core']} (any shape) | "
             f"{fl64a / 1e9:.1f} GFLOP/s | {ref64a / 1e9:.1f} GFLOP/s | **{100 * p64a:.0f}%** | "
             f">= 80%: {verdict(p64a >= 0.8)} |")

    def peer_for(isa):
        return next((p for p in peers if p["isa"] == isa), None)

    # The pair rate per core against the external exps built for the same ISA, on the same core.
    for label, isa, pairs in [(f"default kernels ({kset})", kset, alone.get(0, {}).get("pairs")),
                              (AVX2_LABEL, "avx2", ra["cpu0"]["pairs"])]:
        pe = peer_for(isa)
        if pe is None or pairs is None:
            L.append(f"| d=3 USA, 1 thread on cpu 0, {label}: pairs/s vs an external exp for {isa} | "
                     f"{pairs or 0:.3e} pairs/s | (no exp peer built for {isa}) | - | (info) |")
            continue
        ee, es = pe["exps_per_second"]["eigen"], pe["exps_per_second"]["sleef"]
        L.append(f"| d=3 USA, 1 thread on cpu 0, {label}: pairs/s vs Eigen's vectorised exp (SLEEF beside it), "
                 f"same ISA ({pe['isa']}, `-march={pe['march']}` peers), same core | {pairs:.3e} pairs/s | "
                 f"Eigen {ee:.3e} exp/s (SLEEF {es:.3e}) | {100 * pairs / ee:.0f}% of Eigen ({100 * pairs / es:.0f}% "
                 f"of SLEEF) | (info: a loop taking one external exp per pair could not pass 100%; the symmetric "
                 f"loop takes 0.5) |")
    L.append("")

    if peers:
        L.append("## Exponential and FMA rooflines (one core)\n")
        L.append("`bench/exp_peers.cpp`, one thread pinned to cpu 0 (`taskset -c 0`), built twice by "
                 "`run_bench.sh` with `g++ -O3`: `-march=x86-64-v3` (AVX2+FMA, what most laptops have) and "
                 "`-march=native` (this CPU's best). Every method runs the instruction set of its build over an "
                 "L1-resident array of 2048 doubles: mfattn's own exp2 exactly as `--roofline` times it "
                 "(`simd::exp2_nonpositive<4, false>`, four Lanes in lockstep, t in [-36, 0]); Eigen 3.4's "
                 "`ArrayXd::exp()`; SLEEF 3.5's 1-ulp exp for that ISA; glibc's libmvec vector exp (called "
                 "directly); x in [-25, 0] for the external ones. Each rate is timed for >= 0.3 s, the methods "
                 "interleaved, best of 3 rounds. FMA peak: independent FMA chains on registers of the ISA's "
                 "width, an FMA counted as 2 flops. max rel err: against a long-double exp over the same "
                 "array (std::exp's own: ~1e-16).\n")
        L.append("| build | ISA (mfattn / Eigen / SLEEF / libmvec) | mfattn exp/s | Eigen exp/s | SLEEF exp/s | "
                 "libmvec exp/s | ratio mfattn / Eigen | ratio mfattn / SLEEF | `mfattn bench --roofline` exp/s, "
                 "1 thread on cpu 0, same ISA | FMA peak GFLOP/s | lane-FMAs per mfattn exp at peak | "
                 "max rel err (mfattn, Eigen, SLEEF, libmvec) | target |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for pe in peers:
            x = pe["exps_per_second"]
            e = pe["max_rel_error"]
            ratio = x["mfattn"] / x["eigen"]
            lib = None
            if pe["isa"] == "avx2":
                lib = ra["cpu0"]["exps"]
            elif pe["isa"] == kset:
                lib = alone.get(0, {}).get("exps")
            fmas = pe["fma_peak_gflops"] * 1e9 / 2 / x["mfattn"]
            eig = "Eigen " + ("AVX-512" if pe["eigen_avx512"] else "AVX2+FMA" if pe["eigen_avx2"] and pe["eigen_fma"]
                              else pe["eigen_simd"].split(",")[0])
            bad = "" if pe["accuracy_ok"] else " **ACCURACY CHECK FAILED: a rate above is not of a working exp**"
            L.append(f"| `-march={pe['march']}` (`{pe['binary']}`) | {pe['mfattn_isa']} / {eig} "
                     f"({pe['eigen_packet_doubles']} doubles a packet) / `{pe['sleef_function']}` / "
                     f"`{pe['libmvec_function']}` | {x['mfattn']:.3e} | {x['eigen']:.3e} | {x['sleef']:.3e} | "
                     f"{x['libmvec']:.3e} | **{ratio:.2f}x** | {x['mfattn'] / x['sleef']:.2f}x | "
                     f"{f'{lib:.3e}' if lib else '-'} | {pe['fma_peak_gflops']:.1f} | {fmas:.1f} | "
                     f"{e['mfattn']:.1e}, {e['eigen']:.1e}, {e['sleef']:.1e}, {e['libmvec']:.1e}{bad} | "
                     f">= 1.5x Eigen: {verdict(ratio >= 1.5 and pe['accuracy_ok'])} |")
        L.append("")
        L.append("Eigen's exp on four packets in lockstep (`internal::pexp`, to rule out its loop as the "
                 "bottleneck): " + "; ".join(f"`-march={pe['march']}` {pe['exps_per_second']['eigen_pexp_x4']:.3e}"
                                              f" exp/s" for pe in peers) + ".\n")

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
    for gm, note in ((gemm, ""), (gemm_avx2, " (`OPENBLAS_CORETYPE=Haswell`, best of 5; the AVX2 rows)")):
        for t in ("1", "2"):
            g = gm["threads"][t]
            L.append(f"| {t} | {g['openblas_core']}{note} | {g['scores']['gflops']:.1f} | {g['wsum']['gflops']:.1f} | "
                     f"{g['pair']['gflops']:.1f} | {g['square']['gflops']:.1f} |")
    L.append("")

    L.append("## mfattn bench lines\n")
    L.append("```")
    for (n, d, kernel), r in rows.items():
        L.append(r["bench"]["line"])
    L.append(b256["line"])
    L.append(roof3["line"])
    L.append(f"# {AVX2_LABEL} (MFATTN_CPU_KERNELS=avx2)")
    for (n, d, kernel), r in rows_avx2.items():
        L.append(r["bench"]["line"])
    L.append(r256_avx2[2]["line"])
    L.append(roof3_avx2["line"])
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
    for (n, d, kernel), r in rows_avx2.items():
        L.append(f"n={n} d={d} {kernel}, {AVX2_LABEL}: mfattn 20 steps {['%.3f' % x for x in r['w20']['all']]}, "
                 f"1 step {['%.3f' % x for x in r['w1']['all']]}, numpy 20 steps {['%.3f' % x for x in r['np']['all_totals']]}")
    L.append("roofline d=3 usa (pairs/s, exp/s): " + ", ".join(f"({p:.3e}, {e:.3e})" for p, e in roof3["all"]))
    L.append(f"roofline d=3 usa, {AVX2_LABEL} (pairs/s, exp/s): "
             + ", ".join(f"({p:.3e}, {e:.3e})" for p, e in roof3_avx2["all"]))
    for pe in peers:
        L.append(f"exp peers -march={pe['march']}, every round: " + "; ".join(
            f"{k} {', '.join('%.3e' % v for v in vs)}" for k, vs in pe["all"].items()))
    L.append(f"n=256 d=3 usa: mfattn 2000 steps {['%.3f' % x for x in w2000['all']]}, "
             f"1 step {['%.3f' % x for x in w1s['all']]}, numpy 2000 steps {['%.3f' % x for x in np256['all_totals']]}")
    L.append(f"n=256 d=3 usa, {AVX2_LABEL}: mfattn 2000 steps {['%.3f' % x for x in r256_avx2[0]['all']]}, "
             f"1 step {['%.3f' % x for x in r256_avx2[1]['all']]}, "
             f"numpy 2000 steps {['%.3f' % x for x in r256_avx2[3]['all_totals']]}")
    L.append("```\n")

    L.append("## Exact commands\n")
    L.append("Run from any directory; each was run as shown (repeats not listed twice). "
             "`$TMP` stands for the temporary output directory and `$ROOT` for the repository's "
             "root.\n")
    L.append("```sh")
    for label, cmd in COMMANDS:
        L.append(f"# {label}")
        L.append(cmd.replace(tmp, "$TMP"))
    L.append("```")

    text = "\n".join(L) + "\n"
    # The report names the checkout by its role, not by where it happened to be cloned.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = text.replace(root + "/", "$ROOT/")
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
