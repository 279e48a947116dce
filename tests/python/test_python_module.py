"""The Python module `mfattn` (docs/python.md) against the command line it wraps.

The package is the build's python/mfattn, beside the binary (MFATTN_PYTHON_MODULE_DIR overrides
the folder; conftest.py); a build without its compiled mfattn._core fails these tests, saying
where it was looked for.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import BUILD_DIR, MODULE_DIR, REPO_ROOT, as_kwargs, bits  # the fixture mfattn is conftest's too


# Every kernel, gauge, mask, factor, prefix and presence option the model has (with random Q,
# K, V and per-replica matrices among them).
MODEL_CASES = [
    ["--kernel", "usa"],
    ["--kernel", "sa", "--eps-den", "0.25"],
    ["--kernel", "sa", "--time-scale", "rescaled", "--beta", "4"],
    ["--q", "gaussian", "--k", "gaussian", "--v", "goe"],
    ["--replicas", "2", "--matrices", "per-replica", "--k", "gaussian-product", "--v", "wishart"],
    ["--geometry", "rope"],
    ["--geometry", "rope", "--values", "plain"],
    ["--geometry", "rope-axial", "--d", "4"],
    ["--geometry", "rope-mixed", "--d", "4"],
    ["--geometry", "rope-conjugated", "--d", "4"],
    ["--geometry", "lie", "--d", "4"],
    ["--mask", "causal"],
    ["--mask", "window", "--window", "3"],
    ["--aux-factor", "distance", "--aux-lambda", "0.3"],
    ["--aux-factor", "gaussian", "--aux-sigma", "4"],
    ["--aux-factor", "cosine", "--aux-omega", "0.7"],
    ["--aux-factor", "toeplitz", "--toeplitz-coefficients", "1,-0.5", "--toeplitz-frequencies", "0.3,1.1"],
    ["--prefix", "3", "--prompts", "2", "--mask", "per-prompt", "--prefix-weight", "2"],
    ["--amplitudes", "0.7", "--tau", "0.5", "--null-tokens", "2"],
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: " ".join(c))
def test_velocity_and_energy_equal_the_cli_first_frame_bitwise(mfattn, run_mfattn, case):
    args = ["--n", "23", "--seed", "7", "--horizon", "0.05", "--dt", "0.05", "--save-velocity", *case]
    path = run_mfattn(*args)
    with h5py.File(path, "r") as f:
        replicas = int(f["parameters"].attrs["replicas"])
        groups = ["tokens"] + [f"tokens_r{r}" for r in range(1, replicas)]
        x0 = np.stack([f[f"particles/{g}/position/value"][0] for g in groups])
        v0 = np.stack([f[f"particles/{g}/velocity/value"][0] for g in groups])
        e0 = f["observables/energy/value"][0]
    model = mfattn.Model(**as_kwargs(args), threads=1)
    x = x0 if replicas > 1 else x0[0]
    assert np.array_equal(bits(model.initial_state()), bits(x))
    velocity = model.velocity(x)
    assert velocity.shape == x.shape
    assert np.array_equal(bits(velocity), bits(v0 if replicas > 1 else v0[0]))
    assert np.array_equal(bits(np.asarray(model.energy(x))), bits(np.asarray(e0)))


@pytest.mark.parametrize("case", [
    ["--kernel", "sa", "--integrator", "rk4", "--replicas", "3", "--matrices", "per-replica", "--q", "gaussian"],
    ["--kernel", "usa", "--integrator", "euler-maruyama", "--noise-kappa", "40", "--geometry", "rope"],
    ["--kernel", "sa", "--integrator", "dopri5", "--prefix", "2", "--mask", "causal"],
], ids=lambda c: " ".join(c[:4]))
def test_run_returns_the_cli_trajectory_bitwise(mfattn, run_mfattn, case):
    args = ["--n", "30", "--seed", "3", "--horizon", "2", "--save-every", "0.5", "--threads", "1", *case]
    path = run_mfattn(*args)
    from mfattn.io import load
    expected = load(path)
    got = mfattn.run(**as_kwargs(args))
    assert isinstance(got, mfattn.Trajectory)
    assert got.path is None
    assert got.complete and got.status == "complete"
    assert np.array_equal(bits(got.times), bits(expected.times))
    assert np.array_equal(bits(got.positions), bits(expected.positions))
    assert set(got.observables) == set(expected.observables)
    for name, values in expected.observables.items():
        assert np.array_equal(bits(got.observables[name]), bits(values)), name
    for name, values in expected.labels.items():
        assert np.array_equal(got.labels[name], values), name
    assert got.parameters["beta"] == expected.parameters["beta"]


def cli_message(mfattn_binary: Path, args: list[str]) -> str:
    done = subprocess.run([str(mfattn_binary), "run", *args, "--out", "never-written.h5"],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    return done.stderr.strip().removeprefix("mfattn run: ")


def as_keywords(message: str) -> str:
    """The command line's message as the module says it: "--kernel softmax" is
    "kernel=softmax", "--aux-factor:" is "aux_factor:", --help is mfattn.options()."""
    message = message.replace("--help lists every option", "mfattn.options() lists every option")
    message = re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*) (?!\()", lambda m: m.group(1).replace("-", "_") + "=", message)
    return re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), message)


@pytest.mark.parametrize("args", [
    ["--kernel", "softmax"],
    ["--n", "-4"],
    ["--beta", "warm"],
    ["--geometry", "rope", "--values", "sideways"],
    ["--dt", "0"],
    ["--integrator", "euler", "--noise-kappa", "3"],
], ids=lambda a: " ".join(a))
def test_bad_options_raise_value_error_with_the_cli_message(mfattn, mfattn_binary, args):
    expected = as_keywords(cli_message(mfattn_binary, ["--n", "8", *args] if args[0] != "--n" else args))
    kwargs = as_kwargs(["--n", "8", *args] if args[0] != "--n" else args)
    with pytest.raises(ValueError) as raised:
        mfattn.Model(**kwargs)
    assert str(raised.value) == expected
    with pytest.raises(ValueError) as raised:
        mfattn.run(**kwargs)
    assert str(raised.value) == expected


def test_messages_name_the_keywords_and_options_lists_the_table(mfattn, mfattn_binary):
    """Errors say kernel=softmax, not --kernel softmax; mfattn.options() is the one option table
    (the same names, defaults and help as `mfattn run --help`); repr(Model) gives its keywords."""
    with pytest.raises(ValueError) as raised:
        mfattn.Model(kernel="softmax")
    assert str(raised.value) == "kernel=softmax: accepted: usa, sa, sinkhorn"
    with pytest.raises(ValueError) as raised:
        mfattn.Model(heds=2)
    assert str(raised.value) == "heds: no such option (the closest: heads); mfattn.options() lists every option"
    options = mfattn.options()
    shown = subprocess.run([str(mfattn_binary), "run", "--help"], capture_output=True, text=True).stdout
    listed = re.findall(r"^  --([a-z0-9-]+)", shown, flags=re.M)
    assert set(options) == {name.replace("-", "_") for name in listed}
    assert options["n"] == {"option": "--n", "default": "64", "help": "active tokens, >= 1"}
    assert options["kernel"]["default"] == "usa" and "sinkhorn" in options["kernel"]["help"]
    assert options["quiet"]["default"].startswith("off")
    model = mfattn.Model(n=8, kernel="sa", q=np.eye(3))
    assert repr(model).startswith("mfattn.Model(n=8, kernel='sa', q=<array (3, 3)>)  # sa, n = 8, d = 3")
    for documented in (mfattn.Model, mfattn.Model.velocity, mfattn.Model.energy, mfattn.run, mfattn.options):
        assert len(documented.__doc__) > 200, documented


def test_unknown_option_and_unavailable_backend_are_named(mfattn):
    with pytest.raises(ValueError, match="kernal"):
        mfattn.Model(n=8, kernal="sa")
    with pytest.raises(ValueError, match="--backend cuda"):
        mfattn.Model(n=8, backend="cuda")


def test_positions_of_the_wrong_shape_dtype_or_value_are_refused(mfattn):
    model = mfattn.Model(n=5, d=3, seed=1)
    x = model.initial_state()
    with pytest.raises(ValueError, match=r"shape \(4, 3\); expected \(5, 3\) or \(R, 5, 3\)"):
        model.velocity(x[:4])
    with pytest.raises(ValueError, match=r"shape \(15,\)"):
        model.velocity(x.ravel())
    with pytest.raises(TypeError, match="not a real number type"):
        model.velocity(x.astype(np.complex128))
    with pytest.raises(TypeError, match="not a real number type"):
        model.velocity(np.full((5, 3), "a"))
    bad = x.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="element 7 is nan"):
        model.velocity(bad)
    with pytest.raises(ValueError, match="threads: 0"):
        model.velocity(x, threads=0)
    # float32 and Fortran-ordered arrays are copied once and give the float64 answer.
    assert np.array_equal(model.velocity(np.asfortranarray(x)), model.velocity(x))
    per_replica = mfattn.Model(n=5, replicas=2, matrices="per-replica", q="gaussian")
    with pytest.raises(ValueError, match="3 replicas, but --matrices per-replica drew 2"):
        per_replica.velocity(np.stack([x, x, x]))


def test_velocity_releases_the_gil_and_concurrent_calls_give_the_same_bits(mfattn):
    model = mfattn.Model(n=600, d=3, kernel="sa", beta=2, seed=4, threads=1)
    x = model.initial_state()
    expected = model.velocity(x)
    assert mfattn._last_call_released_gil()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: model.velocity(x), range(8)))
    for result in results:
        assert np.array_equal(bits(result), bits(expected))
    stacked = model.velocity(np.stack([x, x]), threads=2)
    assert np.array_equal(bits(stacked[1]), bits(expected))


def test_usa_overflow_raises_numerical_error(mfattn, tmp_path):
    twice = tmp_path / "twice.txt"
    twice.write_text("2 0 0\n0 2 0\n0 0 2\n")
    model = mfattn.Model(n=6, beta=400, k=str(twice), init="clustered", init_clusters=1, init_spread=0.01)
    with pytest.raises(mfattn.NumericalError, match="USA weights overflow double"):
        model.velocity(model.initial_state())
    assert issubclass(mfattn.NumericalError, ArithmeticError)


def test_progress_and_a_stop_leave_a_file_that_resumes_exactly(mfattn, tmp_path):
    args = dict(n=40, kernel="sa", horizon=3, save_every=0.5, seed=9, threads=1)
    whole = mfattn.run(**args)
    seen = []

    def progress(time, step):
        seen.append((time, step))
        if time >= 1.0:
            raise KeyboardInterrupt

    out = tmp_path / "stopped.h5"
    with pytest.raises(KeyboardInterrupt):
        mfattn.run(out=out, progress=progress, flush_interval=0, **args)
    assert seen[0] == (0.0, 0)
    assert all(b[0] >= a[0] for a, b in zip(seen, seen[1:]))
    stopped = mfattn.load(out)
    assert stopped.status == "interrupted: stopped by the caller"
    assert 1.0 <= stopped.times[-1] < 3.0
    resumed = mfattn.run(out=out, resume=True, **args)
    assert resumed.complete
    assert np.array_equal(bits(resumed.positions), bits(whole.positions))
    # Returning False stops too; the interpreter's own SIGINT handler is back afterwards.
    with pytest.raises(KeyboardInterrupt):
        mfattn.run(progress=lambda t, s: t < 0.5, **args)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigint_during_run_ends_it_cleanly(mfattn, tmp_path):
    out = tmp_path / "signalled.h5"

    def progress(time, step):
        if time >= 0.5:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in a notebook sends

    with pytest.raises(KeyboardInterrupt):
        mfattn.run(out=out, progress=progress, n=30, horizon=50, save_every=0.5, threads=1, flush_interval=0)
    stopped = mfattn.load(out)
    assert stopped.status == "interrupted: SIGINT"
    assert stopped.times[-1] < 50
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # The module still works.
    assert mfattn.run(n=5, horizon=0.1).complete


def test_runs_in_parallel_threads_match_serial_runs(mfattn):
    betas = [0.5, 1.0, 2.0, 4.0]
    serial = [mfattn.run(n=32, kernel="sa", beta=b, horizon=2, seed=1, threads=1) for b in betas]
    with ThreadPoolExecutor(max_workers=2) as pool:
        parallel = list(pool.map(lambda b: mfattn.run(n=32, kernel="sa", beta=b, horizon=2, seed=1, threads=1), betas))
    for a, b in zip(serial, parallel):
        assert np.array_equal(bits(a.positions), bits(b.positions))


@pytest.mark.parametrize("script, args", [
    ("sphere.py", ["--n", "24", "--steps", "40"]),
    ("phase_diagram.py", ["--systems", "16", "--betas", "3", "--horizon", "4"]),
])
def test_examples_run(mfattn, tmp_path, script, args):
    env = dict(os.environ, MPLBACKEND="Agg", MFATTN_PYTHON_MODULE_DIR=str(MODULE_DIR))
    done = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / script), *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = list(tmp_path.glob("*.png"))
    assert figures, done.stdout
    assert all(f.stat().st_size > 10_000 for f in figures)


def test_pip_install_puts_an_importable_module_in_place(mfattn, tmp_path):
    """The whole package is installed: the compiled mfattn._core beside the pure-Python modules
    (the loader mfattn.io, mfattn.view with its page template), as in the build's folder."""
    # Offline: no build isolation; MFATTN_BUILD_DIR reuses the tests' configured build folder.
    env = dict(os.environ, MFATTN_BUILD_DIR=str(BUILD_DIR))
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                           "--target", str(target), str(REPO_ROOT)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    check = subprocess.run([sys.executable, "-c", "import mfattn, mfattn.view; print(mfattn.__file__); "
                            "print(mfattn._core.__file__); print(mfattn.io.__file__); "
                            "print(mfattn.io.load is mfattn.load, mfattn.view.PAGE.is_file()); "
                            "print(mfattn.run(n=4, horizon=0.1).status)"], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(target)), cwd=tmp_path, timeout=120)
    assert check.returncode == 0, check.stderr
    package = target / "mfattn"
    assert check.stdout.split() == [str(package / "__init__.py"), str(next(package.glob("_core*.so"))),
                                    str(package / "io.py"), "True", "True", "complete"]
    installed = {p.name for p in package.iterdir() if p.suffix in (".py", ".html")}
    assert installed == {p.name for p in (REPO_ROOT / "analysis" / "mfattn").iterdir() if p.suffix in (".py", ".html")}


def test_velocity_and_energy_refuse_rows_off_the_sphere(mfattn):
    """The post placement's state is on the unit sphere: a row off it is refused naming the row
    and its norm (never a field of no state the model has); a row normalised in float32 is
    taken; the other placements take states in R^d."""
    model = mfattn.Model(n=8, d=3, kernel="sa", beta=2)
    for method in (model.velocity, model.energy):
        with pytest.raises(ValueError, match=r"x: row 0 has norm 1\.7320508075688772; the state is on "
                                             r"the unit sphere \(within 1e-06 of norm 1\)"):
            method(np.ones((8, 3)))
    x = model.initial_state()
    stretched = np.stack([x, x])
    stretched[1, 5] *= 1.001
    with pytest.raises(ValueError, match=r"x: row 5 of replica 1 has norm 1\.0009999"):
        model.velocity(stretched)
    single = x.astype(np.float32)
    single /= np.linalg.norm(single, axis=-1, keepdims=True)
    np.testing.assert_allclose(model.velocity(single.astype(np.float64)), model.velocity(x), atol=1e-6)
    pre = mfattn.Model(n=8, d=3, kernel="sa", beta=2, normalization="pre")
    assert np.isfinite(pre.velocity(2.0 * x)).all() and np.isfinite(pre.energy(2.0 * x))
    with pytest.raises(ValueError, match=r"x: row 0 has norm (2|1\.99999)"):
        mfattn.Model(n=8, d=3, kernel="sa", beta=2, normalization="ngpt").velocity(2.0 * x)


def test_matrix_and_table_options_take_numpy_arrays(mfattn, tmp_path, monkeypatch):
    """q=, k=, v= (and init_file=, generators=: every option that reads a FILE of numbers) take
    an array of two dimensions or more: the same bits as the file of its values, the run's
    file holding the matrices, and the temporary text files gone with the call or the Model."""
    import gc
    import glob
    import tempfile

    # The module makes its folders with tempfile.mkdtemp; a folder of this test's own keeps
    # other tests' folders (other pytest workers share the system's) out of the counts below.
    own_temp = tmp_path / "temp"
    own_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_temp))

    def array_folders() -> set[str]:
        return set(glob.glob(str(Path(tempfile.gettempdir()) / "mfattn-arrays-*")))

    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(3, 3)) for _ in range(3))
    for name, matrix in (("q", q), ("k", k), ("v", v)):
        np.savetxt(tmp_path / f"{name}.txt", matrix, fmt="%.17g")
    before = array_folders()
    by_array = mfattn.Model(n=6, d=3, kernel="sa", q=q, k=k, v=v)
    by_file = mfattn.Model(n=6, d=3, kernel="sa", **{name: str(tmp_path / f"{name}.txt") for name in "qkv"})
    x = by_array.initial_state()
    assert np.array_equal(by_array.velocity(x).view(np.uint64), by_file.velocity(x).view(np.uint64))

    start = rng.normal(size=(6, 3))
    start /= np.linalg.norm(start, axis=1, keepdims=True)
    model = mfattn.Model(n=6, d=3, init="file", init_file=start)
    np.testing.assert_allclose(model.initial_state(), start, atol=1e-15)
    held = array_folders() - before
    assert len(held) == 2  # one per Model given arrays, kept while it lives
    del model, by_array
    gc.collect()
    assert not (array_folders() & held)

    out = tmp_path / "run.h5"
    mfattn.run(n=6, d=3, kernel="sa", q=q, horizon=0.1, out=str(out))
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["particles/tokens/attention_matrices/query"][0], q)  # [layers, d, d]
    assert not (array_folders() - before)
    with pytest.raises(ValueError, match="--q"):
        mfattn.Model(n=6, d=3, q=np.ones((2, 2)))


def test_an_init_file_of_a_state_for_each_replica(mfattn):
    """init_file= with R n rows starts replica r at rows r n .. (r + 1) n - 1; n rows start every
    replica there; another count is refused naming both counts."""
    rng = np.random.default_rng(8)
    starts = rng.normal(size=(3, 5, 3))
    starts /= np.linalg.norm(starts, axis=2, keepdims=True)
    model = mfattn.Model(n=5, d=3, replicas=3, init="file", init_file=starts.reshape(15, 3))
    np.testing.assert_allclose(model.initial_state(), starts, atol=1e-15)
    shared = mfattn.Model(n=5, d=3, replicas=3, init="file", init_file=starts[1])
    np.testing.assert_allclose(shared.initial_state(), np.stack([starts[1]] * 3), atol=1e-15)
    with pytest.raises(ValueError, match="needs 5 rows \\(n \\+ null tokens\\), or 15 \\(5 for each of the 3 replicas\\), "
                       "found 10"):
        mfattn.Model(n=5, d=3, replicas=3, init="file", init_file=starts[:2].reshape(10, 3)).initial_state()


def test_help_of_run_lists_every_keyword_with_its_default(mfattn):
    doc = mfattn.run.__doc__
    for keyword, about in mfattn.options().items():
        default = about["default"]
        shown = "=False" if default and default.startswith("off (a switch") else (f"={default}" if default else "")
        assert f"\n  {keyword}{shown}: " in doc, keyword
    assert "\n  common_noise=0: " in doc and "\n  usa_denominator=count: " in doc
