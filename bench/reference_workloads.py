#!/usr/bin/python3
"""mfattn against the peer of the reference code of arXiv:2312.10794 (repository
borjanG/2023-transformers-rotf) on that code's two workloads.

(a) phase: phase-diagrams.py's workload. SA, d = 2, n = 32, 512 systems, 10 betas
    linspace(0.1, 9, 10), T = 30, 200 checkpoints, step 0.1, the reference step; once with
    identity matrices and once with random matrices per system (randomKQ 1 = --k
    gaussian-product, randomV 1 = --v wishart, --matrices per-replica; --random-kq/--random-v
    choose others). Peer: tests/peers/reference_peer.py's PyTorch backend with 2 threads (its
    loop timed in-process, imports excluded). mfattn: one `mfattn run` per beta with 512
    replicas, `--jobs` runs at once with cores / jobs threads each, frames only at the steps
    the reference checks, --save-positions none (timed as the wall time of all runs:
    process start and file writing included). Agreement: the batch-mean clustered-pair
    fraction, cell by cell over the 10 x 200 cells, z = difference / combined standard error;
    it prints the cells beyond 3 SE (and how many chance allows: reference_peer.agreement,
    a permutation null that keeps each system's time series whole) and the largest |z|.
(b) sphere: sphere.py's loop at n = 256 (d = 3, beta = 1, dt = 0.1, SA, every frame kept)
    for 2000 steps (T = 200, 2001 frames: the run the speed target names), and sphere-short
    with sphere.py's own T = 15 (150 steps, where mfattn's fixed cost of about 10 ms, process
    start and file layout, is a third of its time). Peer: the NumPy backend, every state kept in memory. mfattn: `mfattn run
    --integrator euler-unprojected --save-every 0.1 --threads 1` writing every frame. Agreement: the
    peer from mfattn's frame 0 against every frame of mfattn's file (max |dx|).

Peer and mfattn alternate (peer, mfattn, peer, mfattn, ...; --repeats of each, at least 3);
the table gives min and median seconds and the ratio peer / mfattn of the medians (above 1:
mfattn is faster). Where the binary lacks a feature the script says so and falls back: the
projected `euler` for the reference step (the peer then takes the projected step too), the
positions of every frame written without --save-positions; the random-matrix workload is left
out without per-replica presets. Prints a markdown table and one JSON line.

    /usr/bin/python3 bench/reference_workloads.py [--mfattn build/mfattn] [--repeats 3] [--jobs 2]
    /usr/bin/python3 bench/reference_workloads.py --quick      # a small version, seconds
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")  # the NumPy peer's BLAS: before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "peers"))
sys.path.insert(0, str(ROOT / "experiments" / "reference"))
import reference_peer as rp  # noqa: E402
import mfattn_reference as mr  # noqa: E402


def stats(times):
    return {"min": min(times), "median": statistics.median(times), "all": times}


def phase_workload(a, feats, random, notes, workdir):
    betas = np.linspace(a.beta_min, a.beta_max, a.betas)
    kq, v = (a.random_kq, a.random_v) if random else (0, 0)
    name = (f"phase SA d=2 n={a.n} B={a.batch} {a.betas} betas T={a.maxtime:g}, "
            + (f"random per system (KQ {kq}, V {v})" if random else "identity"))
    if random and not feats.random_matrices(kq, v):
        notes.append(f"{name}: left out (this binary has no --matrices per-replica with --k "
                     f"{mr.PRESET_K[kq]} / --v {mr.PRESET_V[v]})")
        return None
    project = not feats.unprojected
    common = dict(batch=a.batch, n=a.n, d=2, kernel="sa", step=0.1, maxtime=a.maxtime,
                  checkpoints=200, random_kq=kq, random_v=v, noanneal=0)
    backend = a.peer_backend
    if backend == "torch" and not rp.torch_available():
        backend = "numpy"
        notes.append("python3-torch is not installed: the phase peer runs on NumPy")
    peer_times, mf_times, repeats, peers, mfs = [], [], [], [], []
    for r in range(a.repeats):
        peer = rp.phase_diagram(betas, seed=r, backend=backend, threads=a.peer_threads,
                                project=project, **common)
        peer_times.append(peer.seconds)
        runs = mr.run_phase_diagram(a.mfattn, workdir, betas, seed=1000 + 100 * r,
                                    jobs=a.jobs, feats=feats, keep_files=False, **common)
        mf_times.append(runs.seconds)
        for w in runs.notes:
            if w not in notes:
                notes.append(w)
        # Each repeat is an independent pair of ensembles (other seeds on both sides): its
        # agreement is one more draw of the statistic.
        repeats.append(rp.agreement(peer.per_system, runs.diagram.per_system, mask=peer.unique))
        peers.append(peer)
        mfs.append(runs.diagram)
    res = repeats[0]
    # The same statistic between two runs of one side (other seeds): what chance alone gives
    # for these correlated cells, next to the cross comparisons above.
    self_text, self_rows = "", []
    if len(peers) > 1:
        for side, first, second in (("peer", peers[0], peers[1]), ("mfattn", mfs[0], mfs[1])):
            q = rp.agreement(first.per_system, second.per_system, mask=peers[0].unique)
            self_rows.append({"side": side, "beyond_3se": q.beyond3, "max_abs_z": q.max_abs_z})
        self_text = "; run against run of one side: " + ", ".join(
            f"{r['side']} {r['beyond_3se']} beyond 3 SE (max |z| {r['max_abs_z']:.2f})" for r in self_rows)
    every = "; every repeat: " + ", ".join(f"{q.beyond3} beyond 3 SE (max |z| {q.max_abs_z:.2f})"
                                           for q in repeats) if len(repeats) > 1 else ""
    return {"workload": name, "peer": f"{backend} peer, {a.peer_threads} threads"
            + (" (projected step)" if project else ""),
            "mfattn": f"{a.betas} runs, --jobs {a.jobs}"
            + (" (projected euler)" if project else " (euler-unprojected)"),
            "peer_s": stats(peer_times), "mfattn_s": stats(mf_times),
            "agreement": {"cells": res.cells, "beyond_3se": res.beyond3,
                          "allowed_3se": res.allowed3, "binomial_3se": res.binomial3,
                          "permutation_3se": res.permutation3, "max_abs_z": res.max_abs_z,
                          "ok": all(q.ok for q in repeats),
                          "repeats": [{"beyond_3se": q.beyond3, "allowed_3se": q.allowed3,
                                       "max_abs_z": q.max_abs_z, "ok": q.ok} for q in repeats],
                          "same_side": self_rows},
            "agreement_text": f"{res.beyond3}/{res.cells} cells beyond 3 SE (chance allows "
                              f"{res.allowed3}; binomial {res.binomial3}), max abs z "
                              f"{res.max_abs_z:.2f}" + every + self_text
                              + ("" if all(q.ok for q in repeats) else " DISAGREE")}


def sphere_workload(a, feats, notes, workdir, T=None):
    n, dt = a.sphere_n, 0.1
    T = a.sphere_T if T is None else T
    integrator = "euler-unprojected" if feats.unprojected else "euler"
    if not feats.unprojected:
        notes.append("sphere: no euler-unprojected in this binary: projected euler on both sides")
    out = Path(workdir) / "sphere.h5"
    cmd = [str(a.mfattn), "run", "--n", str(n), "--d", "3", "--beta", "1", "--kernel", "sa",
           "--integrator", integrator, "--dt", repr(dt), "--horizon", repr(T), "--save-every",
           repr(dt), "--seed", "0", "--threads", str(a.mfattn_threads), "--quiet", "--overwrite",
           "--out", str(out)]
    if feats.save_positions:
        cmd[-3:-3] = ["--save-positions", "all"]
    peer_times, mf_times = [], []
    for r in range(a.repeats):
        t0 = time.perf_counter()
        z = rp.sphere_run(n=n, d=3, beta=1.0, T=T, dt=dt, seed=r, project=not feats.unprojected)
        peer_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        mf_times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"mfattn failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")
    import h5py
    with h5py.File(out, "r") as f:  # every frame's positions, [T, n, d], of the file just written
        positions = f["particles/tokens/position/value"][()]
    frames = positions.shape[0]
    z = rp.sphere_run(n=n, d=3, beta=1.0, T=T, dt=dt, x0=positions[0], project=not feats.unprojected)
    frames_ok = frames == z.shape[0]
    err = float(np.abs(positions - z).max()) if frames_ok else float("inf")
    return {"workload": f"sphere SA d=3 n={n} beta=1 T={T:g} dt=0.1, every frame",
            "peer": "numpy peer" + (" (projected step)" if not feats.unprojected else ""),
            "mfattn": f"mfattn run --integrator {integrator} --threads {a.mfattn_threads}",
            "peer_s": stats(peer_times), "mfattn_s": stats(mf_times),
            "agreement": {"frames": int(frames), "peer_frames": int(z.shape[0]),
                          "max_abs_dx": err, "ok": bool(frames_ok and err < 1e-10)},
            "agreement_text": f"max abs dx {err:.1e} over {frames} frames"
                              + ("" if frames_ok and err < 1e-10 else " DISAGREE")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mfattn", type=Path, default=ROOT / "build" / "mfattn")
    p.add_argument("--repeats", type=int, default=3, help="runs of each side (alternating), >= 1")
    p.add_argument("--jobs", type=int, default=2, help="mfattn runs at once (phase workload)")
    p.add_argument("--peer-threads", type=int, default=2)
    p.add_argument("--peer-backend", choices=["torch", "numpy"], default="torch",
                   help="the phase workload's peer (numpy: OPENBLAS_NUM_THREADS threads, default 2)")
    p.add_argument("--mfattn-threads", type=int, default=1,
                   help="threads of the sphere run (default 1: 65 536 pairs a step are too few "
                        "for a second thread to pay on a shared machine)")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--betas", type=int, default=10)
    p.add_argument("--beta-min", type=float, default=0.1)
    p.add_argument("--beta-max", type=float, default=9.0)
    p.add_argument("--maxtime", type=float, default=30.0)
    p.add_argument("--random-kq", type=int, default=1, choices=[1, 2, 3])
    p.add_argument("--random-v", type=int, default=1, choices=[0, 1, 2, 3])
    p.add_argument("--sphere-n", type=int, default=256)
    p.add_argument("--sphere-T", type=float, default=200.0,
                   help="horizon of the sphere workload (default 200: 2000 steps and 2001 "
                        "frames, the run the speed target names; sphere-short takes sphere.py's "
                        "own T = 15)")
    p.add_argument("--workloads", default="phase,phase-random,sphere,sphere-short",
                   help="comma separated: phase, phase-random, sphere, sphere-short")
    p.add_argument("--quick", action="store_true",
                   help="small: 64 systems, 3 betas, T = 3, sphere n = 32 T = 3, one repeat")
    p.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    if a.quick:
        a.batch, a.betas, a.maxtime, a.sphere_n, a.sphere_T = 64, 3, 3.0, 32, 3.0
        a.repeats = 1
    if not a.mfattn.is_file():
        raise SystemExit(f"reference_workloads: no mfattn binary at {a.mfattn}")
    feats = mr.features(a.mfattn)
    notes: list[str] = []
    rows = []
    wanted = [w.strip() for w in a.workloads.split(",") if w.strip()]
    with tempfile.TemporaryDirectory(prefix="mfattn-ref-") as workdir:
        for w in wanted:
            if w == "phase":
                rows.append(phase_workload(a, feats, False, notes, workdir))
            elif w == "phase-random":
                rows.append(phase_workload(a, feats, True, notes, workdir))
            elif w == "sphere":
                rows.append(sphere_workload(a, feats, notes, workdir))
            elif w == "sphere-short":
                rows.append(sphere_workload(a, feats, notes, workdir, T=min(a.sphere_T, 15.0)))
            else:
                raise SystemExit(f"reference_workloads: unknown workload {w!r}")
    rows = [r for r in rows if r is not None]
    for r in rows:
        r["ratio"] = r["peer_s"]["median"] / r["mfattn_s"]["median"]
    load = os.getloadavg()
    print(f"mfattn vs the reference peer ({platform.node()}, {os.cpu_count()} cores, load "
          f"average {load[0]:.2f} at the end; {a.repeats} alternating runs of each)\n")
    print("| workload | peer | peer s (min / median) | mfattn | mfattn s (min / median) | "
          "ratio peer/mfattn | agreement |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['peer']} | {r['peer_s']['min']:.3f} / "
              f"{r['peer_s']['median']:.3f} | {r['mfattn']} | {r['mfattn_s']['min']:.3f} / "
              f"{r['mfattn_s']['median']:.3f} | {r['ratio']:.2f} | {r['agreement_text']} |")
    for w in notes:
        print(f"\nnote: {w}")
    record = {"bench": "reference_workloads", "repeats": a.repeats, "loadavg_end": load,
              "features": {"euler_unprojected": feats.unprojected, "matrices": feats.matrices,
                           "save_positions": feats.save_positions},
              "notes": notes, "rows": rows}
    line = json.dumps(record)
    print("\n" + line)
    if a.json_out:
        a.json_out.write_text(line + "\n")
    return 0 if all(r["agreement"]["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
