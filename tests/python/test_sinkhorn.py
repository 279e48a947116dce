"""Sinkhorn attention (docs/model.md section 2d) through the Python module and the command line.

With --normalization pre the velocity is the attention output of the directions itself,
u_i = sum_j P_ij N(x_j) (Q = K = V = I, plain values), so for n linearly independent tokens in
d >= n dimensions the plan is read back exactly, P = U N(X)^+: at every evaluation of a trajectory its rows sum to 1 and
its columns to their shares within the tolerance, and it equals a NumPy Sinkhorn written here
from section 2d (test_normalization.py's sinkhorn_plan) within 1e-12. Zero sweeps are SA; the
options without a scaling are refused (exit 2, one line, no file)."""
from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest

from test_normalization import direction, sinkhorn_plan

N, D, BETA = 12, 40, 2.0


def tokens(seed: int, n: int = N, d: int = D) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def plan_of(model, x: np.ndarray) -> np.ndarray:
    """P = U N(X)^+ from the velocity u_i = p_i sum_j P_ij N(x_j) of --normalization pre (rows of
    the present receivers; the others are 0)."""
    return model.velocity(x) @ np.linalg.pinv(direction(x))


def numpy_plan(x: np.ndarray, presence: np.ndarray, sweeps: int, tol: float) -> np.ndarray:
    with np.errstate(divide="ignore"):
        logits = BETA * x @ x.T + np.log(presence)[None, :]
    return sinkhorn_plan(logits, presence, presence > 0, sweeps, tol)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_rows_and_columns_at_every_evaluation_of_a_trajectory(mfattn, backend):
    model = mfattn.Model(n=N, d=D, beta=BETA, kernel="sinkhorn", normalization="pre", values="plain",
                         backend=backend, threads=2)
    x = tokens(1)
    errors = []
    for step in range(40):  # Euler steps of the flow, an evaluation each
        plan = plan_of(model, x)
        np.testing.assert_allclose(plan.sum(axis=1), 1.0, rtol=0, atol=1e-13)
        errors.append(np.abs(plan.sum(axis=0) - 1.0).max())
        x = x + 0.05 * model.velocity(x)
    assert max(errors) <= 1e-12 + 1e-13  # the tolerance, and the read-back's rounding
    assert np.abs(x - tokens(1)).max() > 0.05  # it moved


@pytest.mark.parametrize("sweeps", [1, 3, 30])
def test_plan_equals_a_numpy_sinkhorn(mfattn, sweeps):
    x = tokens(2)
    for backend in ["cpu", "reference"]:
        model = mfattn.Model(n=N, d=D, beta=BETA, kernel="sinkhorn", sinkhorn_iterations=sweeps,
                                    sinkhorn_tol=0, normalization="pre", values="plain", backend=backend)
        expected = numpy_plan(x, np.ones(N), sweeps, 0.0)
        np.testing.assert_allclose(plan_of(model, x), expected, rtol=0, atol=1e-12)
    assert np.abs(expected.sum(axis=0) - 1.0).max() > 1e-9 or sweeps == 30  # truncated scalings differ from the limit


def test_presences_and_null_tokens_set_the_column_shares(mfattn):
    """Amplitudes a_i give presences p_i = a^2 / (tau + a^2); column j sums to R p_j / M and a
    null token's row and column are empty."""
    amplitudes = np.linspace(0.4, 1.6, N - 2)
    model = mfattn.Model(n=N - 2, null_tokens=2, d=D, beta=BETA, kernel="sinkhorn", normalization="pre",
                                values="plain", amplitudes=list(amplitudes), tau=1.0)
    presence = np.concatenate([amplitudes**2 / (1 + amplitudes**2), [0.0, 0.0]])
    x = tokens(3)
    u = model.velocity(x)
    plan = (u / np.where(presence > 0, presence, 1.0)[:, None]) @ np.linalg.pinv(x)
    shares = (N - 2) * presence / presence.sum()
    np.testing.assert_allclose(plan.sum(axis=0), shares, rtol=0, atol=1e-12)
    np.testing.assert_allclose(plan[:N - 2].sum(axis=1), 1.0, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(u[N - 2:], 0.0)
    np.testing.assert_allclose(plan, numpy_plan(x, presence, 100, 1e-12), rtol=0, atol=1e-12)


def test_zero_sweeps_are_softmax_attention(mfattn):
    x = tokens(4, n=64, d=3)
    sa = mfattn.Model(n=64, d=3, beta=BETA, kernel="sa", geometry="rope").velocity(x)
    zero = mfattn.Model(n=64, d=3, beta=BETA, kernel="sinkhorn", sinkhorn_iterations=0,
                               geometry="rope").velocity(x)
    np.testing.assert_allclose(zero, sa, rtol=0, atol=1e-15)
    converged = mfattn.Model(n=64, d=3, beta=BETA, kernel="sinkhorn", geometry="rope").velocity(x)
    assert np.abs(converged - sa).max() > 1e-3  # the scaling changes the field


@pytest.mark.parametrize("sweeps, tol", [(3, 0.0), (100, 1e-12)])
def test_every_frame_records_how_far_its_scaling_got(run_mfattn, sweeps, tol):
    """sinkhorn_column_error and sinkhorn_sweeps of every frame: the plan the frame's velocity
    used, read back from that velocity (pre placement, d >= n) and measured here."""
    out = run_mfattn("--n", N, "--d", D, "--beta", BETA, "--kernel", "sinkhorn", "--sinkhorn-iterations", sweeps,
                     "--sinkhorn-tol", tol, "--normalization", "pre", "--values", "plain", "--integrator", "rk4",
                     "--dt", 0.05, "--horizon", 1, "--save-every", 0.25, "--save-velocity")
    with h5py.File(out) as f:
        x = f["particles/tokens/position/value"][:]
        velocity = f["particles/tokens/velocity/value"][:]
        error = f["observables/sinkhorn_column_error/value"][:]
        taken = f["observables/sinkhorn_sweeps/value"][:]
    assert len(error) == len(x) == 5
    for frame in range(len(x)):
        plan = velocity[frame] @ np.linalg.pinv(direction(x[frame]))
        measured = np.abs(plan.sum(axis=0) - 1.0).max()
        assert error[frame] == pytest.approx(measured, rel=1e-3, abs=2e-13)
    if tol == 0:
        np.testing.assert_array_equal(taken, sweeps)
        assert error.min() > 1e-6  # three sweeps do not reach the limit
    else:
        assert taken.max() < sweeps and error.max() <= tol


@pytest.mark.parametrize("args, message", [
    (["--kernel", "sinkhorn", "--mask", "causal"], "--mask causal: with --kernel sinkhorn: a causal matrix has no "
                                                   "doubly stochastic scaling"),
    (["--kernel", "sinkhorn", "--aux-factor", "toeplitz"], "--aux-factor toeplitz: the toeplitz factor changes sign"),
    (["--kernel", "sinkhorn", "--eps-den", "0.1"], "--eps-den 0.1: is SA's denominator term"),
    (["--kernel", "sinkhorn", "--sinkhorn-iterations", "100001"], "--sinkhorn-iterations 100001: must be an integer"),
    (["--kernel", "sinkhorn", "--sinkhorn-tol", "nan"], "--sinkhorn-tol nan"),
    (["--kernel", "sinkhorn", "--backend", "cuda"], "cuda"),
])
def test_options_without_a_scaling_are_refused(mfattn_binary, tmp_path, args, message):
    out = tmp_path / "x.h5"
    done = subprocess.run([str(mfattn_binary), "run", "--n", "8", *args, "--out", str(out)], capture_output=True,
                          text=True)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


def test_meanfield_refuses_sinkhorn(mfattn_binary, tmp_path):
    out = tmp_path / "m.h5"
    done = subprocess.run([str(mfattn_binary), "meanfield", "--d", "2", "--kernel", "sinkhorn", "--out", str(out)],
                          capture_output=True, text=True)
    # What the solver takes is its declaration's (capabilities.hpp), the message generated.
    assert done.returncode == 2 and "--kernel sinkhorn: mfattn meanfield takes --kernel usa, sa" in done.stderr
    assert not out.exists()
