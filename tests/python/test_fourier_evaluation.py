"""--evaluation fourier from the command line and Python (docs/model.md section 2f): a run
with it records the option and follows the direct run to rounding, the Python Model takes
evaluation=, and a model the series cannot take is refused with exit 2, one line naming why,
and no file."""
from __future__ import annotations

import subprocess

import h5py
import numpy as np


def test_a_run_and_a_model_take_the_series(mfattn, mfattn_binary, tmp_path):
    args = ["--n", "2500", "--d", "2", "--beta", "4", "--kernel", "sa", "--geometry", "rope", "--horizon", "0.5",
            "--save-every", "0.25", "--seed", "2", "--quiet"]
    for name, extra in (("direct.h5", []), ("series.h5", ["--evaluation", "fourier"])):
        done = subprocess.run([str(mfattn_binary), "run", *args, *extra, "--out", str(tmp_path / name)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "direct.h5") as a, h5py.File(tmp_path / "series.h5") as b:
        assert str(b["parameters"].attrs["evaluation"]) == "fourier"
        x, y = a["particles/tokens/position/value"][:], b["particles/tokens/position/value"][:]
        assert 0 < np.abs(x - y).max() < 1e-10
        assert np.array_equal(a["observables/n_clusters/value"][:], b["observables/n_clusters/value"][:])
    model = mfattn.Model(n=4000, d=2, beta=3, q="gaussian", k="gaussian", v="gaussian", seed=4)
    series = mfattn.Model(n=4000, d=2, beta=3, q="gaussian", k="gaussian", v="gaussian", seed=4,
                          evaluation="fourier")
    x = model.initial_state()
    direct = model.velocity(x)
    assert np.abs(series.velocity(x) - direct).max() < 1e-10 * np.abs(direct).max()


def test_what_the_series_cannot_take_is_refused(mfattn_binary, tmp_path):
    out = tmp_path / "refused.h5"
    for extra, words in ((["--d", "4"], "takes d = 2 (the circle) or d = 3"),
                         (["--d", "3", "--q", "gaussian"], "zonal kernels"), (["--d", "2", "--mask", "window"], "takes --mask full, causal or causal-strict"),
                         (["--d", "2", "--kernel", "sinkhorn"], "--kernel sinkhorn: --evaluation fourier takes --kernel usa, sa"),
                         (["--d", "2", "--geometry", "rope", "--q", "gaussian"], "with a gauge"),
                         (["--d", "2", "--backend", "reference"], "give --backend cpu"),
                         (["--d", "2", "--evaluation-tol", "0"], "--evaluation-tol 0"),
                         (["--d", "2", "--observables", "default+attention"], "with --evaluation fourier")):
        done = subprocess.run([str(mfattn_binary), "run", "--n", "16", "--evaluation", "fourier", *extra, "--out",
                               str(out)], capture_output=True, text=True)
        assert done.returncode == 2, (extra, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (extra, done.stderr)
        assert not out.exists()


def test_a_causal_mask_is_summed_in_position_order_and_the_series_has_no_derivatives(mfattn):
    # RoPE under a causal mask with prefix tokens: the series' prefix sums against the pair loop.
    options = dict(n=3000, d=2, beta=4, kernel="sa", geometry="rope", mask="causal", prefix=3, v="gaussian", seed=6)
    model, series = mfattn.Model(**options), mfattn.Model(**options, evaluation="fourier")
    x = model.initial_state()
    direct = model.velocity(x)
    assert np.abs(series.velocity(x) - direct).max() < 1e-10 * np.abs(direct).max()
    # Derivatives are refused by the series' registry entry, before any work.
    try:
        series.vjp(x, np.ones_like(x))
    except ValueError as error:
        assert "evaluation=fourier: has no derivatives (they take evaluation=direct" in str(error)
    else:
        raise AssertionError("the series gave a derivative")
