"""experiments/reference/phase_diagram.sh and sphere.sh end to end on their --quick workloads
(MFATTN_BINARY set, so nothing is built), and analysis/plot_reference.py's figures and errors.

The phase run writes one .npz per configuration the binary can run (identity matrices always;
random per-replica matrices where `mfattn run --help` offers the presets) with the reference
step and with rk4, and a figure per kernel and matrices with the difference panel; the sphere
run checks itself against the NumPy peer of sphere.py and draws the tokens at a few times.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "experiments" / "reference"))
import mfattn_reference as mr  # noqa: E402


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.02, f"{path} looks blank"


def script(name, *args, env_binary):
    env = dict(os.environ, MPLBACKEND="Agg", MFATTN_BINARY=str(env_binary))
    return subprocess.run(["bash", str(REPO_ROOT / "experiments/reference" / name), *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)


def test_phase_diagram_script_quick(mfattn_binary, tmp_path):
    done = script("phase_diagram.sh", "--quick", "--out-dir", tmp_path, env_binary=mfattn_binary)
    assert done.returncode == 0, done.stdout + done.stderr
    feats = mr.features(mfattn_binary)
    kinds = ["identity"] + (["random"] if feats.random_matrices(1, 1) else [])
    for kernel in ("sa", "usa"):
        for matrices in kinds:
            runs = {}
            for integrator in ("reference", "rk4"):
                path = tmp_path / "phase_diagram" / f"{kernel}_{matrices}_{integrator}.npz"
                with np.load(path) as f:
                    runs[integrator] = {k: f[k] for k in f.files}
                mean = runs[integrator]["mean"]
                settings = json.loads(str(runs[integrator]["settings"]))
                assert mean.shape == (3, 200)
                # A numerical failure (rk4's unnormalised stages overflowing the USA weights
                # with random matrices) leaves NaN rows, and the settings say which beta.
                failed = np.isnan(mean).any(axis=1)
                assert sum("numerical failure" in w for w in settings["notes"]) == failed.sum()
                assert np.all((mean[~np.isnan(mean)] >= 0) & (mean[~np.isnan(mean)] <= 1))
                assert settings["batch"] == 32 and settings["kernel"] == kernel
                want = ("euler-unprojected" if feats.unprojected else "euler") \
                    if integrator == "reference" else "rk4"
                assert settings["binary_integrator"] == want
            # The same states (seeds) and dt: the two integrators start alike and part later.
            assert np.array_equal(runs["reference"]["steps"], runs["rk4"]["steps"])
            assert not np.isnan(runs["reference"]["mean"]).any()
            assert_png(tmp_path / "figures" / f"phase_{kernel}_{matrices}.png")
    if not feats.random_matrices(1, 1):
        assert "left out" in done.stdout


def test_sphere_script_quick(mfattn_binary, tmp_path):
    done = script("sphere.sh", "--quick", "--out-dir", tmp_path, env_binary=mfattn_binary)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "differs from mfattn's" in done.stdout
    assert (tmp_path / "sphere" / "reference.h5").is_file() and (tmp_path / "sphere" / "rk4.h5").is_file()
    assert_png(tmp_path / "figures" / "sphere.png")


def test_plot_reference_refuses_an_empty_folder(tmp_path):
    done = subprocess.run(["/usr/bin/python3", str(REPO_ROOT / "analysis/plot_reference.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, MPLBACKEND="Agg"))
    assert done.returncode == 2
    assert done.stderr.startswith("plot_reference.py: ") and "no phase_diagram" in done.stderr


def test_a_relative_out_dir_is_the_callers_and_help_lists_accepted_values(mfattn_binary, tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg", MFATTN_BINARY=str(mfattn_binary))
    done = subprocess.run(["bash", str(REPO_ROOT / "experiments/reference/phase_diagram.sh"), "--quick",
                           "--kernels", "sa", "--matrices", "identity", "--out-dir", "mine"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "mine" / "phase_diagram" / "sa_identity_reference.npz").is_file()
    assert_png(tmp_path / "mine" / "figures" / "phase_sa_identity.png")

    shown = subprocess.run(["bash", str(REPO_ROOT / "experiments/reference/phase_diagram.sh"), "--help"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for words in ("of: sa, usa", "of: identity, random", "of: reference", "0, 1, 2 or 3"):
        assert words in " ".join(shown.stdout.split()), words
    wrong = subprocess.run(["/usr/bin/python3", str(REPO_ROOT / "experiments/reference/run_reference.py"),
                            "phase", "--kernels", "sa,softmax"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "'sa,softmax': accepted: a comma-separated list of sa, usa" in wrong.stderr


def test_nothing_is_installed_or_built_unless_asked(tmp_path):
    """A checkout without build/mfattn and no MFATTN_BINARY: one line naming --build and
    MFATTN_BINARY, exit 2, and no build/ or data/ made (the scripts copied into a bare tree)."""
    checkout = tmp_path / "checkout"
    (checkout / "experiments" / "reference").mkdir(parents=True)
    for name in ("phase_diagram.sh", "sphere.sh", "run_with_figures.sh"):
        shutil.copy(REPO_ROOT / "experiments/reference" / name, checkout / "experiments/reference" / name)
    env = {k: v for k, v in os.environ.items() if k != "MFATTN_BINARY"}
    for name in ("phase_diagram.sh", "sphere.sh"):
        done = subprocess.run(["bash", str(checkout / "experiments/reference" / name), "--quick"],
                              capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and "--build" in lines[0] and "MFATTN_BINARY" in lines[0], done.stderr
        assert not (checkout / "build").exists() and not (checkout / "data").exists()


def test_the_sa_sweep_file_reference_md_prints_ships_and_runs(mfattn_binary):
    """docs/reference.md's SA sweep is experiments/sweeps/reference_sa_step.ini, line for line,
    and mfattn sweep takes it: 10 cases, beta zipped with the seed."""
    text = (REPO_ROOT / "docs" / "reference.md").read_text()
    block = text.split("reference_sa_step.ini` (every step a", 1)[1].split("```ini\n", 1)[1].split("```", 1)[0]
    shipped = REPO_ROOT / "experiments" / "sweeps" / "reference_sa_step.ini"
    lines = [line for line in shipped.read_text().splitlines() if line and not line.startswith("#")]
    assert block.splitlines() == lines
    done = subprocess.run([str(mfattn_binary), "sweep", "--config", str(shipped), "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("mfattn sweep: 10 cases")
    assert "beta=9.0 seed=9" in done.stdout or "beta=9 seed=9" in done.stdout
