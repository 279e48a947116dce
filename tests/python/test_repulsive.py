"""Repulsive attention, beta < 0 (docs/model.md section 2): the field against the circle's
formula of arXiv:2507.22857 written here in NumPy, the CPU backend's field and VJP against the
reference backend's (pair by pair), the energy negative and nondecreasing along a gradient
flow, the mirrored bounds refused with one line, and the synchronisation experiment's quick
run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def test_the_circle_field_is_the_papers_formula(mfattn):
    """USA, Q = K = V = I on S^1: d theta_i / dt = -(1/n) sum_j sin(theta_i - theta_j)
    exp(beta cos(theta_i - theta_j))."""
    for beta in (-0.6, -3.0):
        model = mfattn.Model(n=24, d=2, kernel="usa", beta=beta, seed=5)
        x = model.initial_state()
        theta = np.arctan2(x[:, 1], x[:, 0])
        difference = theta[:, None] - theta[None, :]
        expected = -(np.sin(difference) * np.exp(beta * np.cos(difference))).mean(axis=1)
        v = model.velocity(x)
        along = -v[:, 0] * np.sin(theta) + v[:, 1] * np.cos(theta)  # d theta / dt
        np.testing.assert_allclose(along, expected, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose((v * x).sum(axis=1), 0, atol=1e-15 * np.abs(v).max() * 24)


CASES = [dict(n=40, d=3, kernel="sa"), dict(n=40, d=3, kernel="usa"), dict(n=40, d=2, kernel="sa"),
         dict(n=40, d=4, kernel="sa", heads=2, head_dim=2, q="gaussian", k="gaussian", v="gaussian", mlp=3),
         dict(n=40, d=3, kernel="sa", mask="causal", aux_factor="distance", geometry="rope"),
         dict(n=40, d=3, kernel="usa", time_scale="rescaled"), dict(n=40, d=3, kernel="sinkhorn"),
         dict(n=40, d=3, kernel="sa", normalization="pre", prefix=2)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items() if k not in "nd"))
@pytest.mark.parametrize("beta", [-0.5, -8.0])
def test_the_cpu_backend_is_the_reference_at_negative_beta(mfattn, case, beta):
    cpu = mfattn.Model(beta=beta, backend="cpu", **case)
    reference = mfattn.Model(beta=beta, backend="reference", **case)
    x = cpu.initial_state()
    v = cpu.velocity(x)
    np.testing.assert_allclose(v, reference.velocity(x), rtol=1e-12, atol=1e-13 * np.abs(v).max())
    if case["kernel"] == "sinkhorn":
        return
    c = np.random.default_rng(1).standard_normal(x.shape)
    ours, theirs = cpu.vjp(x, c), reference.vjp(x, c)
    for key, value in theirs.items():
        scale = max(np.abs(np.asarray(value)).max(), 1e-300)
        np.testing.assert_allclose(np.asarray(ours[key]), np.asarray(value), rtol=1e-12, atol=1e-13 * scale,
                                   err_msg=key)


def test_the_energy_is_negative_and_rises_along_the_flow(mfattn, tmp_path):
    run = mfattn.run(n=16, d=3, kernel="usa", beta=-0.7, horizon=5, dt=0.01, save_every=0.1, seed=2,
                     out=str(tmp_path / "run.h5"))
    energy = run.observables["energy"]
    assert run.parameters["gradient_flow"] == 1
    assert (energy < 0).all() and np.all(np.diff(energy) >= -1e-12 * np.abs(energy[1:]))
    assert energy[-1] > energy[0]


@pytest.mark.parametrize("args, message", [
    (["run", "--kernel", "usa", "--beta", "-710"], "--beta -710: with --kernel usa and --time-scale natural"),
    (["run", "--kernel", "usa", "--beta", "-400", "--time-scale", "rescaled"],
     "--beta -400: with --kernel usa, --time-scale rescaled and beta < 0 the weights exp(beta (s - 1)) reach exp(2 |beta|)"),
    (["meanfield", "--d", "2", "--beta", "-1"], "--beta -1: mfattn meanfield takes beta >= 0"),
])
def test_the_mirrored_bounds_are_one_line_and_exit_2(mfattn_binary, tmp_path, args, message):
    done = subprocess.run([str(mfattn_binary), *args, "--out", str(tmp_path / "x.h5")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.h5").exists()


def test_the_synchronisation_experiment_runs_quick(mfattn_binary, tmp_path):
    import csv
    import os
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "experiments/repulsive/synchronisation.py"), "--quick",
                           "--data", str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, MFATTN_BINARY=str(mfattn_binary)))
    assert done.returncode == 0, done.stderr
    rows = {(int(r["n"]), float(r["beta"])): r
            for r in csv.DictReader(open(tmp_path / "repulsive" / "synchronisation_quick.csv"))}
    assert sorted(rows) == [(n, b) for n in (3, 32) for b in (-1, -0.5, 0, 0.5)]
    # Attraction synchronises every start; at beta = -1 < -2/3 three tokens can stay equally
    # spaced (a stable equilibrium), and some of the 16 starts do.
    assert int(rows[(3, 0.5)]["synchronised"]) == 16 and int(rows[(32, 0.5)]["synchronised"]) == 16, done.stdout
    assert int(rows[(3, -1)]["synchronised"]) < 16, done.stdout
