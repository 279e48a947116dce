"""The peer of the reference code of arXiv:2312.10794 (tests/peers/reference_peer.py) and
mfattn against it.

1. The peer alone: its step against a loop over tokens written from the formulas, NumPy
   against PyTorch, the reference's checkpoint bookkeeping against a literal transcription of
   its loop, the matrix laws (moments of many draws), noanneal and regen_period.
2. mfattn's trajectories against the peer's from the same initial states and matrices, to
   1e-12 over 40 steps: the projected `--integrator euler` (what every binary has) with identity
   and with file matrices; the reference step `--integrator euler-unprojected` with identity
   and with per-replica random matrices (skipped, with the reason, by a binary whose
   `mfattn run --help` lacks the option, or a file that does not store the matrices).
3. The statistic: the peer's batch-mean clustered-pair fraction against mfattn's
   clustered_pair_fraction at the reference's checkpoints (n = 32, d = 2, 128 systems, 3 betas;
   SA to T = 10 and USA to T = 2 with the capped step, identity and per-replica matrices),
   cell by cell within the standard error of both batch means (reference_peer.agreement: no
   |z| > 4.5, and no more cells beyond 3 SE than chance allows, the bound taken from a
   permutation null that keeps each system's time series whole, as the checkpoints are
   correlated); and the same comparison against a peer at other betas, and between the
   projected and the unprojected step, which must disagree (the test has power).
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
for sub in ("tests/peers", "experiments/reference"):
    if str(REPO_ROOT / sub) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / sub))

import reference_peer as rp  # noqa: E402
import mfattn_reference as mr  # noqa: E402

PYTHON = "/usr/bin/python3"


# ---------------------------------------------------------------------------------------------
# 1. The peer alone.

def loop_step(x, beta, eta, kernel, bf, v, project=False):
    """One reference step of one system, token by token (no matrix products over tokens)."""
    n, d = x.shape
    bf = np.eye(d) if bf is None else bf
    v = np.eye(d) if v is None else v
    y = np.empty_like(x)
    for i in range(n):
        s = np.array([beta * (x[i] @ bf @ x[j]) for j in range(n)])
        if kernel == "sa":
            w = np.exp(s - s.max())
            w /= w.sum()
        else:
            w = np.exp(s) / n
        u = sum(w[j] * x[j] for j in range(n)) * eta
        u = u @ v
        if project:
            u = u - (u @ x[i]) * x[i]
        y[i] = x[i] + u
        y[i] /= math.sqrt(y[i] @ y[i])
    return y


@pytest.mark.parametrize("kernel", ["sa", "usa"])
@pytest.mark.parametrize("random_kq,random_v", [(0, 0), (1, 1), (2, 2), (3, 3), (0, 2)])
@pytest.mark.parametrize("project", [False, True])
def test_peer_step_is_the_formula(kernel, random_kq, random_v, project):
    x0 = rp.random_unit_rows(3, 7, 3, seed=4)
    bf, v = rp.draw_matrices(rp._ops("numpy", 5, None), random_kq, random_v, 3, 3)
    eta = rp.reference_eta(kernel, 1.3)
    got = rp.simulate(x0, 1.3, 2, eta, kernel, bf, v, project=project, keep="all")
    for b in range(3):
        want = x0[b]
        for s in range(2):
            want = loop_step(want, 1.3, eta, kernel, None if bf is None else bf[b % len(bf)],
                             None if v is None else v[b % len(v)], project)
            assert np.abs(got[s + 1, b] - want).max() < 1e-14


def test_numpy_and_torch_peers_agree():
    pytest.importorskip("torch", reason="python3-torch is not installed (tests/install_deps.sh installs it)")
    x0 = rp.random_unit_rows(16, 12, 3, seed=1)
    bf, v = rp.draw_matrices(rp._ops("numpy", 2, None), 1, 1, 16, 3)
    for kernel in ("sa", "usa"):
        a = rp.simulate(x0, 1.0, 30, 0.05, kernel, bf, v, backend="numpy", keep="last")
        b = rp.simulate(x0, 1.0, 30, 0.05, kernel, bf, v, backend="torch", threads=1, keep="last")
        assert np.abs(a - b).max() < 1e-12
    # The whole phase diagram: the same draws cannot be had from two generators, so compare
    # the statistic with given states, and each backend's own draws statistically.
    x = rp.random_unit_rows(64, 32, 2, seed=3)
    pa = rp.phase_diagram([1.0, 6.0], batch=64, kernel="sa", maxtime=3, backend="numpy", x0=x)
    pb = rp.phase_diagram([1.0, 6.0], batch=64, kernel="sa", maxtime=3, backend="torch", x0=x, threads=1)
    assert np.array_equal(pa.per_system, pb.per_system)
    # The states: the phase diagram's last state is simulate's after as many steps.
    pc = rp.phase_diagram([6.0], batch=64, kernel="sa", maxtime=3, backend="numpy", x0=x, keep_states=True)
    last = rp.simulate(x, 6.0, int(pc.steps[0, -1]), 0.1, "sa", keep="last")
    assert np.array_equal(pc.states[0], last)
    assert np.array_equal(rp.pair_fraction(last), pc.per_system[0, -1])


def literal_reference_loop(eta, maxtime, checkpoints):
    """phase-diagrams.py's do_single_beta bookkeeping, transcribed: which step (count) fills
    each checkpoint, and how many steps it takes in all."""
    filled = [None] * len(checkpoints)
    cur_ckpt, cur_time, steps = 0, 0.0, 0
    while True:
        cur_time = cur_time + eta
        steps += 1
        if cur_time >= checkpoints[cur_ckpt]:
            while cur_time >= checkpoints[cur_ckpt]:
                filled[cur_ckpt] = steps
                cur_ckpt += 1
                if cur_ckpt >= len(checkpoints):
                    break
        if cur_time >= maxtime:
            break
    return filled, steps


@pytest.mark.parametrize("kernel,beta,maxtime", [("sa", 1.0, 30.0), ("sa", 5.0, 10.0),
                                                 ("usa", 0.1, 1.0), ("usa", 4.0, 1.0),
                                                 ("usa", 9.0, 0.05)])
def test_checkpoints_are_the_references(kernel, beta, maxtime):
    eta = rp.reference_eta(kernel, beta)
    if kernel == "usa":
        assert eta == pytest.approx(0.1 / max(math.sqrt(beta) * math.exp(beta - 0.5), 1.0), rel=1e-15)
    ckpts = rp.reference_checkpoints(maxtime)
    assert ckpts.shape == (200,) and ckpts[0] == 0.0 and ckpts[-1] == maxtime
    filled, total = literal_reference_loop(eta, maxtime, ckpts)
    steps = rp.checkpoint_steps(eta, maxtime, ckpts)
    assert steps.tolist() == filled
    assert steps[-1] == total and steps[0] == 1
    times = rp.step_times(eta, total)
    assert times[steps - 1].min() >= 0 and np.all(times[steps - 1] >= ckpts)
    assert np.all(steps == 1) or np.all(times[steps[steps > 1] - 2] < ckpts[steps > 1])
    plan = mr.checkpoint_plan(kernel, beta, maxtime=maxtime)
    assert plan.horizon == plan.save_times[-1] == total * eta


def test_sa_30_takes_300_steps():
    # 300 additions of 0.1 give 30.000000000000156 >= 30: the last checkpoint is step 300.
    steps = rp.checkpoint_steps(0.1, 30.0, rp.reference_checkpoints(30.0))
    assert steps[-1] == 300 and np.unique(steps).size == 200


def test_matrix_laws():
    ops = rp._ops("numpy", 11, None)
    N, d = 40000, 3
    bf, v = rp.draw_matrices(ops, 1, 1, N, d)
    assert bf.var(axis=0) == pytest.approx(np.ones((d, d)), abs=0.05)   # (G1 G2)/sqrt(d)
    assert np.abs(bf.mean(axis=0)).max() < 0.03
    assert v.mean(axis=0) == pytest.approx(np.eye(d) * math.sqrt(d), abs=0.05)  # G G^T / sqrt(d)
    assert np.abs(v - np.swapaxes(v, 1, 2)).max() == 0
    bf, v = rp.draw_matrices(ops, 2, 2, N, d)                   # unit variance everywhere
    assert np.abs(bf - np.swapaxes(bf, 1, 2)).max() == 0
    assert bf.var(axis=0) == pytest.approx(np.ones((d, d)), abs=0.05)
    assert np.abs(v - bf / math.sqrt(d)).max() == 0
    bf, v = rp.draw_matrices(ops, 3, 3, N, d)                   # GOE: 2 on the diagonal
    assert bf.var(axis=0) == pytest.approx(np.ones((d, d)) + np.eye(d), abs=0.07)
    assert np.abs(v + bf / math.sqrt(d + 1)).max() == 0
    bf, v = rp.draw_matrices(ops, 0, 3, 1, d)
    assert bf is None and np.array_equal(v, -np.eye(d)[np.newaxis])
    assert rp.draw_matrices(ops, 0, 0, 5, d) == (None, None)


def test_noanneal_and_regen():
    # With a long regen period nothing is redrawn; with a short one the states differ; with
    # noanneal 2 the matrices of the whole run stay (regen does nothing): equal to noanneal 2
    # without regen. noanneal 1 shares one matrix set by all systems: identical initial states
    # then stay identical.
    common = dict(batch=16, n=8, d=2, kernel="sa", maxtime=2.0, checkpoints=20, random_kq=1,
                  random_v=1, backend="numpy", seed=7)
    base = rp.phase_diagram([2.0], **common)
    assert np.array_equal(base.per_system, rp.phase_diagram([2.0], regen_period=50.0, **common).per_system)
    regen = rp.phase_diagram([2.0], regen_period=0.5, **common)
    assert not np.array_equal(base.per_system, regen.per_system)
    na2 = dict(common, noanneal=2)
    assert np.array_equal(rp.phase_diagram([2.0], **na2).per_system,
                          rp.phase_diagram([2.0], regen_period=0.5, **na2).per_system)
    x = np.repeat(rp.random_unit_rows(1, 8, 2, seed=1), 16, axis=0)
    shared = rp.phase_diagram([3.0], x0=x, **dict(common, noanneal=1))
    assert np.all(shared.per_system == shared.per_system[..., :1])
    own = rp.phase_diagram([3.0], x0=x, **common)
    assert not np.all(own.per_system == own.per_system[..., :1])


def test_from_mfattn_matrices():
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((3, 4, 4))
    bf, v = rp.from_mfattn_matrices(Q, K, V)
    x = rng.standard_normal((2, 4))
    # mfattn: score <Q x_i, K x_j>, value V x_j; the peer: x_i bf x_j, x_j (row) @ v.
    assert x[0] @ bf[0] @ x[1] == pytest.approx((Q @ x[0]) @ (K @ x[1]), rel=1e-13)
    assert np.allclose(x[1] @ v[0], V @ x[1], rtol=1e-13, atol=0)
    assert rp.from_mfattn_matrices() == (None, None)


def test_sphere_run_shape_and_script():
    z = rp.sphere_run(n=10, T=1.5, seed=2)
    assert z.shape == (16, 10, 3)
    assert np.abs(np.linalg.norm(z, axis=2) - 1).max() < 1e-15
    assert np.abs(z[1] - loop_step(z[0], 1.0, 0.1, "sa", None, None)).max() < 1e-14
    done = subprocess.run([PYTHON, str(REPO_ROOT / "tests/peers/reference_peer.py"), "sphere",
                           "--n", "8", "--T", "0.5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"frames": 6' in done.stdout


# ---------------------------------------------------------------------------------------------
# 2. mfattn's trajectories against the peer's.

@pytest.fixture(scope="module")
def feats(mfattn_binary):
    return mr.features(mfattn_binary)


def compare_trajectory(run_mfattn, kernel, integrator, extra=(), matrices=None, replicas=3,
                       beta=1.0, dt=0.05, steps=40, project=False):
    """mfattn from its own random states against the peer from mfattn's frame 0, at every frame."""
    every = 10
    path = run_mfattn("--n", 12, "--d", 3, "--kernel", kernel, "--beta", beta, "--integrator",
                      integrator, "--dt", dt, "--horizon", dt * steps, "--save-every", dt * every,
                      "--replicas", replicas, "--seed", 3, *extra)
    from mfattn.io import load
    tr = load(path, replica="all")
    x0 = tr.positions[0]
    mats = matrices if matrices is not None else rp.mfattn_matrices(path)
    bf, v = rp.from_mfattn_matrices(mats["Q"], mats["K"], mats["V"])
    peer = rp.simulate(x0, beta, steps, dt, kernel, bf, v, project=project, keep="all")
    assert tr.frames == steps // every + 1
    assert np.allclose(tr.times, np.arange(tr.frames) * dt * every, rtol=1e-12, atol=1e-14)
    err = np.abs(tr.positions - peer[::every]).max()
    assert err < 1e-12, f"max |x_mfattn - x_peer| = {err:.3e}"
    return err


def write_matrix(path, m):
    np.savetxt(path, m, fmt="%.17g")
    return str(path)


@pytest.mark.parametrize("kernel", ["sa", "usa"])
def test_projected_euler_matches_peer_identity(run_mfattn, kernel):
    compare_trajectory(run_mfattn, kernel, "euler", project=True)


@pytest.mark.parametrize("kernel", ["sa", "usa"])
def test_projected_euler_matches_peer_file_matrices(run_mfattn, tmp_path, kernel):
    rng = np.random.default_rng(8)
    Q, K, V = rng.standard_normal((3, 3, 3)) / math.sqrt(3)
    extra = ("--q", write_matrix(tmp_path / "q.txt", Q), "--k", write_matrix(tmp_path / "k.txt", K),
             "--v", write_matrix(tmp_path / "v.txt", V))
    compare_trajectory(run_mfattn, kernel, "euler", extra, project=True)
    # The file names its matrices in /parameters, and the peer's reader finds them there.
    path = next(tmp_path.glob("*.h5"))
    mats = rp.mfattn_matrices(path)
    assert np.array_equal(mats["K"], K) and np.array_equal(mats["V"], V)


def require_unprojected(feats):
    if not feats.unprojected:
        pytest.skip("`mfattn run --help` lists no --integrator euler-unprojected (the reference "
                    "step is not in this binary)")


@pytest.mark.parametrize("kernel", ["sa", "usa"])
def test_reference_step_matches_peer_identity(run_mfattn, feats, kernel):
    require_unprojected(feats)
    compare_trajectory(run_mfattn, kernel, "euler-unprojected")


@pytest.mark.parametrize("kernel", ["sa", "usa"])
@pytest.mark.parametrize("random_kq,random_v", [(1, 1), (3, 2), (2, 3)])
def test_reference_step_matches_peer_per_replica_matrices(run_mfattn, feats, tmp_path, kernel,
                                                          random_kq, random_v):
    require_unprojected(feats)
    if not feats.random_matrices(random_kq, random_v):
        pytest.skip(f"`mfattn run --help` lacks --matrices or the presets --k "
                    f"{mr.PRESET_K[random_kq]} / --v {mr.PRESET_V[random_v]}")
    extra = ("--q", "identity", "--k", mr.PRESET_K[random_kq], "--v", mr.PRESET_V[random_v],
             "--matrices", "per-replica")
    path = run_mfattn("--n", 4, "--d", 3, "--horizon", 0.1, "--dt", 0.1, "--replicas", 2,
                      "--integrator", "euler-unprojected", *extra, out="probe.h5")
    try:
        mats = rp.mfattn_matrices(path)
    except LookupError as why:
        pytest.skip(f"the file does not store the per-replica matrices: {why}")
    assert mats["K"].shape == (2, 3, 3) and not np.array_equal(mats["K"][0], mats["K"][1])
    compare_trajectory(run_mfattn, kernel, "euler-unprojected", extra)


def test_reference_step_matches_peer_across_layers(run_mfattn, feats):
    """--regen-period 1 at dt = 0.05: layer l drives steps 20 l + 1 .. 20 (l + 1); the peer
    takes them segment by segment with the layers the file records."""
    require_unprojected(feats)
    if not (feats.regen_period and feats.random_matrices(1, 1)):
        pytest.skip("`mfattn run --help` lacks --regen-period or the per-replica presets")
    path = run_mfattn("--n", 10, "--d", 3, "--kernel", "sa", "--beta", 1, "--integrator",
                      "euler-unprojected", "--dt", 0.05, "--horizon", 2, "--save-every", 0.5,
                      "--replicas", 2, "--seed", 9, "--q", "identity", "--k", "gaussian-product",
                      "--v", "wishart", "--matrices", "per-replica", "--regen-period", 1)
    layers = rp.mfattn_layers(path)
    # Layer 2 starts at the horizon: it drives no step, only the final frame's observables.
    assert layers is not None and layers["layer_start"].tolist() == [0.0, 1.0, 2.0]
    from mfattn.io import load
    tr = load(path, replica="all")
    x = tr.positions[0]
    for layer in range(2):
        bf, v = rp.from_mfattn_matrices(layers["Q"][:, layer], layers["K"][:, layer], layers["V"][:, layer])
        x = rp.simulate(x, 1.0, 20, 0.05, "sa", bf, v, keep="last")
        err = np.abs(tr.positions[2 * (layer + 1)] - x).max()
        assert err < 1e-12, f"layer {layer}: max |dx| = {err:.3e}"


# ---------------------------------------------------------------------------------------------
# 3. The statistic.

PHASE_CASES = {
    # name: (kernel, betas, maxtime, random_kq, random_v)
    "sa-identity": ("sa", [1.0, 4.0, 8.0], 10.0, 0, 0),
    "sa-random": ("sa", [1.0, 4.0, 8.0], 10.0, 1, 1),
    "usa-identity": ("usa", [1.0, 2.0, 3.0], 2.0, 0, 0),
    "usa-goe-minus": ("usa", [1.0, 2.0, 3.0], 2.0, 3, 3),
}


def phase_pair(mfattn_binary, feats, out, case):
    """mfattn's and the peer's phase diagram: n = 32, d = 2, 128 systems, 3 betas (projected
    euler on both sides where the binary lacks the reference step)."""
    kernel, betas, maxtime, kq, v = PHASE_CASES[case]
    if (kq or v) and not feats.random_matrices(kq, v):
        pytest.skip(f"`mfattn run --help` lacks --matrices or the presets --k {mr.PRESET_K[kq]} "
                    f"/ --v {mr.PRESET_V[v]}")
    common = dict(batch=128, n=32, d=2, kernel=kernel, maxtime=maxtime, random_kq=kq, random_v=v)
    runs = mr.run_phase_diagram(mfattn_binary, out, betas, seed=100, feats=feats, **common)
    peer = rp.phase_diagram(betas, seed=1, backend="numpy", project=not feats.unprojected, **common)
    return runs, peer, common


@pytest.fixture(scope="module")
def sa_phase(mfattn_binary, feats, tmp_path_factory):
    return phase_pair(mfattn_binary, feats, tmp_path_factory.mktemp("phase"), "sa-identity")


@pytest.mark.parametrize("case", ["sa-identity", "sa-random", "usa-identity", "usa-goe-minus"])
def test_statistic_agrees_with_mfattn(mfattn_binary, feats, sa_phase, tmp_path, case):
    runs, peer, _ = sa_phase if case == "sa-identity" else phase_pair(mfattn_binary, feats, tmp_path, case)
    mf = runs.diagram
    assert np.array_equal(mf.steps, peer.steps) and np.array_equal(mf.unique, peer.unique)
    if case.startswith("sa"):
        # 200 checkpoints over 101 steps (100 additions of 0.1 stay below 10).
        assert peer.unique.sum() == 3 * 101 and peer.steps[0, -1] == 101
    res = rp.agreement(peer.per_system, mf.per_system, mask=peer.unique)
    # Later on many pairs are clustered: the cells are informative.
    assert mf.mean[:, -1].max() > 0.15 and peer.mean[:, -1].max() > 0.15
    assert res.ok, res.summary() + "; " + "; ".join(runs.notes)


def test_statistic_comparison_has_power(sa_phase):
    runs, peer, common = sa_phase
    other = rp.phase_diagram([1.5, 6.0, 12.0], seed=1, backend="numpy", **common)
    res = rp.agreement(other.per_system, runs.diagram.per_system, mask=other.unique)
    assert not res.ok, "a peer at other betas should not agree: " + res.summary()
    # The first-order difference between the projected and the unprojected step at h = 0.1.
    flipped = rp.phase_diagram([1.0, 4.0, 8.0], seed=1, backend="numpy",
                               project=not peer.settings["project"], **common)
    res = rp.agreement(flipped.per_system, runs.diagram.per_system, mask=flipped.unique)
    assert not res.ok, "the other Euler step should not agree: " + res.summary()


def test_agreement_permutation_bound():
    """Two samples of one law, a correlated time series each: the permutation bound is at least
    the binomial one and admits what chance gives; a shift of one cell's worth fails."""
    rng = np.random.default_rng(4)
    walk = np.cumsum(rng.standard_normal((2, 100, 300)), axis=1) / 10.0  # [groups, cells, B]
    a, b = walk[..., :150], walk[..., 150:]
    res = rp.agreement(a, b, permutations=400)
    assert res.ok and res.permutation3 >= 0 and res.allowed3 == max(res.binomial3, res.permutation3)
    assert res.allowed3 >= res.binomial3 >= 1
    shifted = rp.agreement(a + 0.6 * a.std(axis=-1, keepdims=True), b, permutations=400)
    assert not shifted.ok and shifted.max_abs_z > 4.5


def test_benchmark_script_runs_quick(mfattn_binary, tmp_path):
    """bench/reference_workloads.py --quick runs to completion with whatever the binary offers
    (falling back where a feature is missing) and reports agreement in its JSON line."""
    out = tmp_path / "bench.json"
    done = subprocess.run([PYTHON, str(REPO_ROOT / "bench/reference_workloads.py"), "--quick",
                           "--mfattn", str(mfattn_binary), "--peer-backend", "numpy",
                           "--jobs", "1", "--mfattn-threads", "1", "--json-out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    import json
    record = json.loads(out.read_text())
    names = [r["workload"] for r in record["rows"]]
    assert any(n.startswith("phase") for n in names) and any(n.startswith("sphere") for n in names)
    assert all(r["agreement"]["ok"] for r in record["rows"])
    assert "| workload |" in done.stdout
