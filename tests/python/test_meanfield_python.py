"""The Python side of `mfattn meanfield` (docs/python.md, docs/meanfield.md): mfattn.meanfield
against the command line, the loader's Density, analysis/sample_density.py and
analysis/plot_meanfield.py.

The package is the build's python/mfattn (with its compiled mfattn._core; conftest.py), the
binary MFATTN_BINARY's. Every solve here is small (64-cell circles, L = 8 on S^2): the file runs in
seconds.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from scipy.special import iv

from conftest import REPO_ROOT, as_kwargs, bits

ANALYSIS = REPO_ROOT / "analysis"

from mfattn import io as mfattn_io  # noqa: E402  (conftest puts the package on sys.path)
from mfattn.plot_meanfield import growth_rates  # noqa: E402


@pytest.fixture
def solve(mfattn_binary: Path, tmp_path: Path):
    """``solve(*args, out="density.h5") -> Path``: ``mfattn meanfield ARGS --quiet --threads 1
    --out tmp_path/out``; a nonzero exit fails the test with the program's output."""

    def run(*args, out: str = "density.h5") -> Path:
        target = tmp_path / out
        command = [str(mfattn_binary), "meanfield", *map(str, args), "--threads", "1", "--quiet",
                   "--out", str(target)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            pytest.fail(f"mfattn exited with {done.returncode}: {' '.join(command)}\n"
                        f"{done.stdout}{done.stderr}", pytrace=False)
        return target

    return run


CASES = {
    "circle": ["--d", "2", "--beta", "3", "--grid", "64", "--perturbation", "2,0.01"],
    "labels": ["--d", "2", "--grid", "32", "--label-points", "8", "--positions", "uniform",
               "--geometry", "rope", "--perturbation", "1,0.05"],
    "zonal": ["--d", "4", "--zonal", "--grid", "64", "--kernel", "sa", "--init-density", "vmf",
              "--init-kappa", "2"],
    "sphere": ["--d", "3", "--grid", "8", "--noise-kappa", "10", "--perturbation", "2,0.01"],
    "sphere_labels": ["--d", "3", "--grid", "8", "--label-points", "4", "--positions", "uniform", "--geometry",
                      "rope", "--rope-freqs", "1", "--noise-kappa", "10", "--init-density", "vmf", "--init-kappa", "1"],
}
SHAPES = {"circle": (64,), "labels": (8, 32), "zonal": (64,), "sphere": (13, 25), "sphere_labels": (4, 13, 25)}
KINDS = {"labels": "circle", "sphere_labels": "sphere"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_meanfield_returns_the_command_lines_density_bitwise(mfattn, solve, tmp_path, case):
    args = CASES[case] + ["--horizon", "0.5", "--save-every", "0.25"]
    path = solve(*args)
    density = mfattn.meanfield(**as_kwargs(args), threads=1)
    assert isinstance(density, mfattn.Density) and density.path is None
    assert density.kind == KINDS.get(case, case)
    assert density.values.shape == (3, *SHAPES[case]) and density.status == "complete"
    with h5py.File(path, "r") as f:
        group = f["fields/density"]
        for name, ours in [("value", density.values), ("time", density.times),
                           ("theta", density.theta), ("weights", density.weights)]:
            assert np.array_equal(bits(ours), bits(group[name][()])), name
        assert np.array_equal(density.steps, group["step"][()])
        for name, ours in [("phi", density.phi), ("labels", density.labels)]:
            assert (ours is None) == (name not in group), name
            if ours is not None:
                assert np.array_equal(bits(ours), bits(group[name][()])), name
        assert sorted(density.observables) == sorted(f["observables"])
        for name, ours in density.observables.items():
            assert np.array_equal(bits(ours), bits(f[f"observables/{name}/value"][()]), equal_nan=True), name
    assert density.parameters["command"] == "meanfield"
    # out= keeps the file, which load() reads back alike.
    kept = mfattn.meanfield(out=tmp_path / "kept.h5", **as_kwargs(args), threads=1)
    assert kept.path == str(tmp_path / "kept.h5")
    assert np.array_equal(bits(mfattn.load(kept.path).values), bits(density.values))


def test_usage_errors_raise_value_error_with_the_command_lines_message(mfattn, mfattn_binary, tmp_path):
    # The command line's message, its options said as keywords (--n is n, --grid 2 is grid=2).
    with pytest.raises(ValueError, match=r"^n: not taken by mfattn meanfield") as raised:
        mfattn.meanfield(d=2, n=16)
    done = subprocess.run([str(mfattn_binary), "meanfield", "--d", "2", "--n", "16", "--out",
                           str(tmp_path / "x.h5")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("mfattn meanfield: --n: not taken by mfattn meanfield")
    with pytest.raises(ValueError, match=r"^grid=2: "):
        mfattn.meanfield(d=2, grid=2)
    with pytest.raises(ValueError, match=r"^progress: "):
        mfattn.meanfield(d=2, progress=lambda t, s: True)
    with pytest.raises(ValueError, match=r"^compare: "):
        mfattn.meanfield(d=2, compare=str(tmp_path / "run.h5"))
    assert not (tmp_path / "x.h5").exists()


def test_load_reads_density_files_and_still_runs(solve, run_mfattn):
    labelled = mfattn_io.load(solve(*CASES["labels"], "--horizon", "0.2", "--save-every", "0.1"))
    assert isinstance(labelled, mfattn_io.Density)
    assert labelled.values.shape == (3, 8, 32) and labelled.labels.shape == (8,)
    assert labelled.phi is None and labelled.d == 2 and labelled.complete
    assert np.allclose(labelled.mass(), 1.0, atol=1e-12) and abs(labelled.mass(0) - 1.0) < 1e-12
    assert np.allclose(labelled.marginal(1), labelled.values[1].mean(axis=0))
    assert labelled.marginal().shape == (3, 32)
    # the stored A_1 is the marginal's first Fourier modulus
    h = 2 * np.pi / 32
    a1 = abs(np.sum(h * labelled.marginal(2) * np.exp(1j * labelled.theta)))
    assert abs(a1 - labelled.observables["mode_amplitudes"][2, 0]) < 1e-12
    assert mfattn_io.is_density(labelled.path) and mfattn_io.is_complete(labelled.path)
    with pytest.raises(ValueError, match="density file has no replicas"):
        mfattn_io.load(labelled.path, replica=0)
    sphere = mfattn_io.load(solve(*CASES["sphere"], "--horizon", "0.1", out="s.h5"))
    assert sphere.kind == "sphere" and sphere.values.shape[1:] == (13, 25)
    assert abs((sphere.marginal(0) * sphere.polar_weights).sum() - 1) < 1e-12
    assert np.allclose(sphere.polar_edges[[0, -1]], [0, np.pi])
    assert np.all((sphere.polar_edges[:-1] < sphere.theta) & (sphere.theta < sphere.polar_edges[1:]))
    run = mfattn_io.load(run_mfattn("--n", 8, "--d", 2, "--horizon", 0.1))
    assert isinstance(run, mfattn_io.Trajectory) and run.positions.shape[1:] == (8, 2)
    assert not mfattn_io.is_density(run.path)


def test_sphere_labels_from_density_to_particles_and_back(solve, run_mfattn, mfattn_binary, tmp_path):
    """S^2 with rope about e_3: the loader's marginal, samples drawn per label node, a particle run
    of the same model started from them, and --compare's sliced W1 between the two."""
    model = ["--d", "3", "--positions", "uniform", "--geometry", "rope", "--rope-freqs", "1", "--beta", "2",
             "--noise-kappa", "20"]
    rope = [*model, "--label-points", "8"]
    start = solve(*rope, "--grid", "16", "--init-density", "vmf", "--init-kappa", "3", "--horizon", "0.01",
                  "--save-every", "0.01", out="start.h5")
    density = mfattn_io.load(start)
    assert density.values.shape[1] == 8 and density.labels.shape == (8,)
    marginal = density.marginal(0)
    assert marginal.shape == density.theta.shape
    assert abs((marginal * density.polar_weights).sum() - 1) < 1e-12
    n = 1200
    x = draw(start, n, 3)
    assert x.shape == (n, 3) and np.max(np.abs(np.linalg.norm(x, axis=1) - 1)) < 1e-14
    # Token i belongs to node i M_xi / n: every node's samples have its conditional mean.
    # (node c holds the tokens round(i 8 / n) = c: i in [(c - 1/2) n/8, (c + 1/2) n/8).)
    for c in range(1, 8):
        rows = x[(2 * c - 1) * n // 16:(2 * c + 1) * n // 16]
        masses = density.weights[c] * density.values[0, c]
        t, p = np.meshgrid(density.theta, density.phi, indexing="ij")
        mean = np.array([(masses * np.sin(t) * np.cos(p)).sum(), (masses * np.sin(t) * np.sin(p)).sum(),
                         (masses * np.cos(t)).sum()])
        assert np.all(np.abs(rows.mean(axis=0) - mean) < 5.0 / np.sqrt(len(rows))), c
    (tmp_path / "x0.txt").write_text("\n".join(" ".join(repr(v) for v in row) for row in x) + "\n")
    run = run_mfattn("--n", n, *model, "--init", "file", "--init-file", tmp_path / "x0.txt",
                     "--integrator", "euler-maruyama", "--dt", 0.01, "--horizon", 1, "--save-every", 0.5, "--seed", 4)
    done = subprocess.run([str(mfattn_binary), "meanfield", *rope, "--grid", "16", "--init-density", "vmf",
                           "--init-kappa", "3", "--horizon", "1", "--save-every", "0.5", "--threads", "1", "--quiet",
                           "--out", str(tmp_path / "solve.h5"), "--compare", str(run)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    distances = [float(line.split("W1 = ")[1].split()[0]) for line in done.stdout.splitlines() if "W1 = " in line]
    assert len(distances) == 3, done.stdout
    # Sliced W1 of 1200 noisy particles against the density stays at the sampling error of
    # the start (0.013 here; the particles' noise and their continuous labels against 8 nodes
    # add little by t = 1), far below the 0.4 between the vmf start and a uniform measure.
    assert max(distances) < 0.04, done.stdout


def draw(path: Path, n: int, seed: int, *extra: str) -> np.ndarray:
    done = subprocess.run([sys.executable, str(ANALYSIS / "sample_density.py"), str(path),
                           "--n", str(n), "--seed", str(seed), *extra],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return np.loadtxt(done.stdout.splitlines(), ndmin=2)


def test_sample_density_draws_from_the_density(solve, run_mfattn, tmp_path):
    # A vmf start exp(4 cos theta): <cos theta> = I_1(4) / I_0(4) = 0.86, far from a uniform's 0.
    path = solve("--d", "2", "--grid", "128", "--init-density", "vmf", "--init-kappa", "4",
                 "--horizon", "0.01", "--save-every", "0.01")
    density = mfattn_io.load(path)
    n = 4000
    x = draw(path, n, 11)
    assert x.shape == (n, 2)
    assert np.max(np.abs(np.linalg.norm(x, axis=1) - 1)) < 1e-14
    theta = np.arctan2(x[:, 1], x[:, 0])
    masses = density.cell_masses(0)
    for k in (1, 2, 3):
        expected = np.sum(masses * np.cos(k * density.theta))
        square = np.sum(masses * np.cos(k * density.theta) ** 2)
        sigma = np.sqrt((square - expected ** 2) / n)
        assert abs(np.cos(k * theta).mean() - expected) < 4.5 * sigma, k
        assert abs(np.sin(k * theta).mean()) < 4.5 * np.sqrt((1 - square) / n), k
    assert abs(np.sum(masses * np.cos(density.theta)) - iv(1, 4) / iv(0, 4)) < 1e-3
    # The same seed gives the same rows; the rows start a particle run.
    assert np.array_equal(draw(path, 5, 11), draw(path, 5, 11))
    (tmp_path / "x0.txt").write_text("\n".join(" ".join(repr(v) for v in row) for row in x[:64]) + "\n")
    run = mfattn_io.load(run_mfattn("--n", 64, "--d", 2, "--init", "file", "--init-file",
                                    tmp_path / "x0.txt", "--horizon", 0.01))
    assert np.allclose(run.positions[0], x[:64], atol=1e-15)
    # S^2 (vmf about e_1, the angle polar from e_3) and a zonal d = 4 density: their means.
    for args, d in [(["--d", "3", "--grid", "16"], 3), (["--d", "4", "--zonal", "--grid", "128"], 4)]:
        path = solve(*args, "--init-density", "vmf", "--init-kappa", "2", "--horizon", "0.01",
                     "--save-every", "0.01", out=f"d{d}.h5")
        y = draw(path, n, 5)
        assert y.shape == (n, d) and np.max(np.abs(np.linalg.norm(y, axis=1) - 1)) < 1e-14
        density = mfattn_io.load(path)
        expected = density.observables["order_parameter"][0]  # |int x dmu|, along e_1
        assert abs(y[:, 0].mean() - expected) < 4.5 / np.sqrt(n), (d, y[:, 0].mean(), expected)
        assert np.all(np.abs(y[:, 1:].mean(axis=0)) < 4.5 / np.sqrt(n)), d


def test_growth_rates_are_the_formula_and_the_solvers():
    beta = 2.5
    k = np.arange(1, 7)
    assert np.allclose(growth_rates(2, beta, "usa", 0.0, 6), k ** 2 * iv(k, beta) / beta, rtol=1e-13)
    assert np.allclose(growth_rates(2, beta, "sa", 4.0, 6),
                       k ** 2 * (iv(k, beta) / (beta * iv(0, beta)) - 1 / 4.0), rtol=1e-13)
    assert np.allclose(growth_rates(2, beta, "usa", 0.0, 6, time_scale="rescaled"),
                       k ** 2 * iv(k, beta) * np.exp(-beta) / beta, rtol=1e-13)
    # d = 3: c_l = Gamma(3/2) (2/beta)^(1/2) I_{l+1/2}(beta) = sqrt(pi / (2 beta)) I_{l+1/2}.
    assert np.allclose(growth_rates(3, beta, "usa", 0.0, 6),
                       k * (k + 1) * np.sqrt(np.pi / (2 * beta)) * iv(k + 0.5, beta) / beta, rtol=1e-13)


def test_a_small_perturbation_grows_at_the_linear_rate(solve):
    density = mfattn_io.load(solve("--d", "2", "--beta", "2", "--grid", "128",
                                   "--perturbation", "3,1e-5", "--horizon", "1", "--save-every", "1"))
    a = density.observables["mode_amplitudes"][:, 2]
    measured = np.log(a[-1] / a[0]) / density.times[-1]
    assert abs(measured / growth_rates(2, 2.0, "usa", 0.0, 3)[2] - 1) < 0.01


def test_plot_meanfield_writes_a_png(solve, run_mfattn, tmp_path):
    path = solve("--d", "2", "--beta", "2", "--grid", "64", "--perturbation", "2,0.02",
                 "--horizon", "1", "--save-every", "0.25")
    run = run_mfattn("--n", 64, "--d", 2, "--beta", 2, "--horizon", 1, "--save-every", 0.25)
    figure = tmp_path / "figure.png"
    env = dict(os.environ, MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(ANALYSIS / "plot_meanfield.py"), str(path),
                           "--run", str(run), "--out", str(figure)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(figure)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = subprocess.run([sys.executable, str(ANALYSIS / "plot_meanfield.py"), str(run)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "not a density file" in done.stderr


def test_particle_amplitudes_use_the_densitys_normalisation_and_the_warning_names_the_faster_mode(solve, run_mfattn):
    """A Dirac has A_k = 1 and the uniform density 0: particles all at one point give A_k = 1 on
    the circle and on S^2; a perturbation of mode 2 at beta = 1 (gamma_1 > gamma_2) is warned
    about, one of mode 2 at beta = 2 (the fastest there) is not."""
    from mfattn.plot_meanfield import particle_amplitudes, seeded_mode_warning, _rates_for
    for d in (2, 3):
        density = mfattn_io.load(solve("--d", str(d), "--beta", "1", "--grid", "16" if d == 3 else "64",
                                       "--horizon", "0.5", "--save-every", "0.5", out=f"uniform{d}.h5"))
        clustered = mfattn_io.load(run_mfattn("--n", 40, "--d", d, "--init", "clustered", "--init-clusters", 1,
                                              "--init-spread", 0, "--horizon", 0.5, "--save-every", 0.5,
                                              out=f"dirac{d}.h5"))
        times, values = particle_amplitudes(density, clustered)
        assert list(times) == [0.0, 0.5]
        np.testing.assert_allclose(values, 1.0, rtol=1e-12)
        spread = mfattn_io.load(run_mfattn("--n", 400, "--d", d, "--horizon", 0.5, "--save-every", 0.5,
                                           out=f"spread{d}.h5"))
        assert particle_amplitudes(density, spread)[1].max() < 0.3  # about n^(-1/2)
    slower = mfattn_io.load(solve("--d", "2", "--beta", "1", "--grid", "64", "--perturbation", "2,0.001",
                                  "--horizon", "0.5", "--save-every", "0.5", out="slower.h5"))
    warning = seeded_mode_warning(slower, _rates_for(slower))
    assert warning and "perturbed mode k = 2" in warning and "mode 1 grows faster" in warning
    fastest = mfattn_io.load(solve("--d", "2", "--beta", "2", "--grid", "64", "--perturbation", "2,0.001",
                                   "--horizon", "0.5", "--save-every", "0.5", out="fastest.h5"))
    assert seeded_mode_warning(fastest, _rates_for(fastest)) is None
