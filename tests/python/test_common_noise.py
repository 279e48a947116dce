"""Common noise (docs/model.md, "Common noise"): stochastic-heun's steps against the scheme
written here in NumPy from the field and the replayed draws, the same bits on 1 and 2 threads
and across a stop and --resume, and bad options refused with one line. The decorrelation and
Lyapunov rates are Monte Carlo tests in tests/unit/test_dynamics.cpp (Noise.*)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest


def bits(a):
    return np.ascontiguousarray(a).view(np.uint64)


def heun_steps(model, x, steps, h, xi, increments):
    """y = N(x + h f(x) + g(x)), x <- N(x + h (f(x) + f(y)) / 2 + (g(x) + g(y)) / 2), with
    g_i(x) = a P_{x_i} xi_i + P_{x_i}(dB x_i), a = sqrt(2 h / kappa), P_z = I - z z^T / |z|^2;
    x: [R, n, d]."""
    def normalize(z):
        return z / np.linalg.norm(z, axis=-1, keepdims=True)

    def noise(z, k):
        square = (z * z).sum(-1, keepdims=True)
        own = xi[k] - (xi[k] * z).sum(-1, keepdims=True) / square * z if xi is not None else 0.0
        shared = 0.0
        if increments is not None:
            bz = np.einsum("rab,rib->ria", increments[k], z)
            shared = bz - (bz * z).sum(-1, keepdims=True) / square * z
        return own + shared

    frames = [x]
    for k in range(steps):
        f0, g0 = model.velocity(x), noise(x, k)
        y = normalize(x + h * f0 + g0)
        x = normalize(x + h * 0.5 * (f0 + model.velocity(y)) + 0.5 * (g0 + noise(y, k)))
        frames.append(x)
    return np.array(frames)


@pytest.mark.parametrize("kind", ["symmetric", "rotation"])
@pytest.mark.parametrize("kappa", [0.0, 8.0])
def test_the_steps_are_the_stratonovich_heun_scheme_written_here(mfattn, kind, kappa):
    model_options = dict(n=6, d=3, kernel="sa", beta=1.3, replicas=2, seed=11, threads=1)
    sigma, h, steps = 0.6, 0.01, 4
    run = mfattn.run(integrator="stochastic-heun", noise_kappa=kappa, common_noise=sigma, common_noise_kind=kind,
                     dt=h, horizon=steps * h, save_every=h, **model_options)
    model = mfattn.Model(**model_options)
    positions = np.asarray(run.positions)
    assert positions.shape == (steps + 1, 2, 6, 3)
    xi = None
    if kappa > 0:
        xi = mfattn._core.maruyama_noise(11, steps, 2, 6, 3) * np.sqrt(2 * h / kappa)
    increments = mfattn._core.common_noise(11, steps, 2, 3, sigma, h, kind)
    if kind == "symmetric":
        assert np.array_equal(increments, np.swapaxes(increments, -1, -2))
    else:
        assert np.array_equal(increments, -np.swapaxes(increments, -1, -2))
    expected = heun_steps(model, positions[0], steps, h, xi, increments)
    np.testing.assert_allclose(positions, expected, rtol=0, atol=1e-14)
    # The noise moved the tokens: without it the same steps land elsewhere.
    assert np.abs(heun_steps(model, positions[0], steps, h, None, None) - positions).max() > 1e-3


def test_threads_and_a_stop_with_resume_change_no_bit(mfattn, tmp_path):
    options = dict(n=40, d=4, kernel="usa", beta=2.0, replicas=3, seed=5, integrator="stochastic-heun",
                   noise_kappa=30, common_noise=0.5, dt=0.01, horizon=2, save_every=0.25)
    whole = mfattn.run(threads=1, **options)
    assert np.array_equal(bits(mfattn.run(threads=2, **options).positions), bits(whole.positions))

    def progress(time, step):
        if time >= 1.0:
            raise KeyboardInterrupt

    out = tmp_path / "stopped.h5"
    with pytest.raises(KeyboardInterrupt):
        mfattn.run(out=out, progress=progress, flush_interval=0, threads=2, **options)
    assert 1.0 <= mfattn.load(out).times[-1] < 2.0
    resumed = mfattn.run(out=out, resume=True, threads=1, **options)
    assert resumed.complete
    assert np.array_equal(bits(resumed.positions), bits(whole.positions))
    # The rotation keeps every inner product, and the scheme does to O(h) (its step's map is
    # I + A + A^2 / 2 with A skew, then normalised: O(h^2) a step).
    drifts = []
    for h in (0.01, 0.005):
        rotation = dict(options, noise_kappa=0, common_noise=1.0, common_noise_kind="rotation", v="zero", dt=h)
        moved = np.asarray(mfattn.run(**rotation).positions)
        gram = np.einsum("frid,frjd->frij", moved, moved)
        assert np.abs(moved[-1] - moved[0]).max() > 0.5
        drifts.append(np.abs(gram[-1] - gram[0]).max())
    assert drifts[0] < 0.05 and drifts[1] < 0.6 * drifts[0], drifts


@pytest.mark.parametrize("args, message", [
    (["--integrator", "euler-maruyama", "--noise-kappa", "10", "--common-noise", "0.5"],
     "--common-noise 0.5: is Stratonovich noise (its Ito form needs a correction drift), which --integrator "
     "euler-maruyama does not take (accepted: stochastic-heun)"),
    (["--integrator", "rk4", "--common-noise", "0.5"],
     "--common-noise 0.5: is Stratonovich noise (its Ito form needs a correction drift), which --integrator "
     "rk4 does not take (accepted: stochastic-heun)"),
    (["--integrator", "stochastic-heun"],
     "--integrator stochastic-heun: stochastic-heun needs --noise-kappa > 0 or --common-noise > 0"),
    (["--integrator", "stochastic-heun", "--common-noise", "-1"], "--common-noise -1: must lie in [0, 1e6]"),
    (["--integrator", "stochastic-heun", "--common-noise", "1", "--common-noise-kind", "orthogonal"],
     "--common-noise-kind orthogonal"),
    (["--integrator", "heun", "--noise-kappa", "3"],
     "--noise-kappa 3: noise needs a stochastic --integrator (euler-maruyama, stochastic-heun; got heun)"),
])
def test_bad_noise_options_are_refused_with_one_line(mfattn_binary, tmp_path, args, message):
    out = tmp_path / "never.h5"
    done = subprocess.run([str(mfattn_binary), "run", "--n", "4", *args, "--out", str(out)], capture_output=True,
                          text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not out.exists()


def test_the_density_solver_refuses_common_noise(mfattn_binary, tmp_path):
    done = subprocess.run([str(mfattn_binary), "meanfield", "--d", "2", "--common-noise", "0.5", "--out",
                           str(tmp_path / "never.h5")], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "--common-noise" in done.stderr and done.stderr.count("\n") == 1, done.stderr
