"""`mfattn meanfield` from the command line (docs/meanfield.md, docs/cli.md): the options it
refuses (exit 2, one message naming the option, no file), the density file's layout, and the
failure model of runs: a solve killed at any point keeps its flushed frames and resumes to the
same bits as an uninterrupted one."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest


def meanfield(binary: Path, out: Path, *args, check: bool = True, timeout: float = 120.0):
    command = [str(binary), "meanfield", *[str(a) for a in args], "--quiet", "--threads", "1", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"exit {done.returncode}: {' '.join(command)}\n{done.stderr}", pytrace=False)
    return done


@pytest.mark.parametrize("args, option", [
    (["--n", "16"], "--n"),
    (["--integrator", "rk4"], "--integrator"),
    (["--dt", "0.1"], "--dt"),
    (["--prefix", "2"], "--prefix"),
    (["--replicas", "2"], "--replicas"),
    (["--backend", "cuda"], "--backend"),
    (["--d", "4"], "--d"),
    (["--d", "3", "--q", "gaussian"], "--d 3"),
    (["--geometry", "rope"], "--geometry"),
    (["--label-points", "8"], "--positions"),
    (["--grid", "2"], "--grid"),
    (["--perturbation", "1,5"], "--perturbation"),
    (["--perturbation", "1.5,0.1"], "--perturbation"),
    (["--q", "gaussian", "--evaluation", "fourier"], "--evaluation"),
    (["--init-density", "no-such-file.txt"], "--init-density"),
    (["--zonal", "--d", "5", "--label-points", "4", "--positions", "uniform"], "--label-points"),
    (["--zonal", "--d", "5", "--grid", "1000000"], "--grid 1000000"),
    (["--d", "3", "--label-points", "4", "--positions", "uniform", "--geometry", "rope-conjugated"], "--geometry"),
])
def test_refused_options_exit_2_naming_the_option_and_leave_no_file(mfattn_binary, tmp_path, args, option):
    out = tmp_path / "refused.h5"
    done = meanfield(mfattn_binary, out, *([] if "--d" in args else ["--d", "2"]), *args, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mfattn meanfield: ") and option in lines[0], done.stderr
    assert not out.exists()
    assert not list(tmp_path.iterdir())


def test_density_file_layout(mfattn_binary, tmp_path):
    out = tmp_path / "labels.h5"
    meanfield(mfattn_binary, out, "--d", "2", "--label-points", "4", "--positions", "uniform", "--geometry", "rope",
              "--rope-freqs", "1", "--grid", "32", "--perturbation", "1,0.1", "--horizon", "0.5", "--save-every", "0.25")
    with h5py.File(out) as f:
        assert "particles" not in f
        values = f["fields/density/value"][:]
        assert values.shape == (3, 4, 32)
        assert list(f["fields/density/time"][:]) == [0.0, 0.25, 0.5]
        weights = f["fields/density/weights"][:]
        assert weights.shape == (4, 32)
        assert np.allclose((weights * values).sum(axis=2), 1.0, atol=1e-12)
        assert np.allclose(f["fields/density/labels"][:], 2 * np.pi * np.arange(4) / 4)
        assert f["observables/mode_amplitudes/value"].shape == (3, 16)
        assert f["observables/conditional_circular_variance/value"].shape == (3,)
        assert f["parameters"].attrs["command"] == "meanfield"
        assert f["run"].attrs["status"] == "complete"
    assert subprocess.run([str(mfattn_binary), "info", str(out)], capture_output=True).returncode == 0


def test_sphere_label_file_layout(mfattn_binary, tmp_path):
    """S^2 with rope about e_3: one density per label node, value [T, M_xi, n_theta, n_phi]."""
    out = tmp_path / "sphere_labels.h5"
    meanfield(mfattn_binary, out, "--d", "3", "--label-points", "4", "--positions", "uniform", "--geometry", "rope",
              "--rope-freqs", "1", "--grid", "8", "--noise-kappa", "10", "--init-density", "vmf", "--init-kappa", "1",
              "--horizon", "0.2", "--save-every", "0.1")
    with h5py.File(out) as f:
        values = f["fields/density/value"][:]
        n_theta, n_phi = f["fields/density/theta"].shape[0], f["fields/density/phi"].shape[0]
        assert values.shape == (3, 4, n_theta, n_phi)
        weights = f["fields/density/weights"][:]
        assert weights.shape == (4, n_theta, n_phi)
        assert np.allclose((weights * values).sum(axis=(2, 3)), 1.0, atol=1e-12)
        assert np.allclose(f["fields/density/labels"][:], 2 * np.pi * np.arange(4) / 4)
        conditional = f["observables/conditional_circular_variance/value"][:]
        marginal = f["observables/marginal_circular_variance/value"][:]
        assert conditional.shape == (3,) and np.all(np.isfinite(conditional))
        # The marginal's mean resultant is at most the mean of the conditional ones.
        assert np.all(marginal >= conditional - 1e-12)
        assert "label nodes" in f["parameters"].attrs["scheme_used"]
        assert f["run"].attrs["status"] == "complete"
    assert subprocess.run([str(mfattn_binary), "info", str(out)], capture_output=True).returncode == 0


def test_an_existing_file_is_refused_without_overwrite(mfattn_binary, tmp_path):
    out = tmp_path / "d.h5"
    meanfield(mfattn_binary, out, "--d", "2", "--horizon", "0.1")
    done = meanfield(mfattn_binary, out, "--d", "2", "--horizon", "0.1", check=False)
    assert done.returncode == 2 and "--overwrite" in done.stderr
    meanfield(mfattn_binary, out, "--d", "2", "--horizon", "0.1", "--overwrite")


SOLVE = ["--d", "2", "--beta", "3", "--perturbation", "3,0.05", "--noise-kappa", "40", "--save-every", "0.25",
         "--flush-interval", "0"]


def test_resume_continues_to_the_same_bits(mfattn_binary, tmp_path):
    whole, part = tmp_path / "whole.h5", tmp_path / "part.h5"
    meanfield(mfattn_binary, whole, *SOLVE, "--grid", "512", "--horizon", "2")
    meanfield(mfattn_binary, part, *SOLVE, "--grid", "512", "--horizon", "1")
    meanfield(mfattn_binary, part, *SOLVE, "--grid", "512", "--horizon", "2", "--resume")
    with h5py.File(whole) as a, h5py.File(part) as b:
        assert np.array_equal(a["fields/density/time"][:], b["fields/density/time"][:])
        assert np.array_equal(a["fields/density/value"][:], b["fields/density/value"][:])
        assert np.array_equal(a["observables/energy/value"][:], b["observables/energy/value"][:])
        assert b["run"].attrs["status"] == "complete"
    done = meanfield(mfattn_binary, part, *[a if a != "40" else "41" for a in SOLVE], "--grid", "512", "--horizon", "3",
                     "--resume", check=False)
    assert done.returncode == 2 and "--noise-kappa" in done.stderr


def test_a_killed_solve_keeps_its_frames_and_resumes_to_the_same_bits(mfattn_binary, tmp_path):
    whole, killed = tmp_path / "whole.h5", tmp_path / "killed.h5"
    # About 4 s of solving (the semi-Lagrangian step takes ~2000 steps whatever the grid; the
    # grid sets their cost): the kill lands after frame 1 with most of the solve still to go.
    slow = [*SOLVE, "--grid", "2048", "--rtol", "1e-9"]
    command = [str(mfattn_binary), "meanfield", *slow, "--horizon", "1", "--quiet", "--threads", "1",
               "--out", str(killed)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    # Kill it once the file holds a frame after t = 0 (it is published with frame 0).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if killed.exists():
            try:
                with h5py.File(killed, "r", locking=False) as f:
                    if f["fields/density/time"].shape[0] >= 2:
                        break
            except (OSError, KeyError):
                pass
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    with h5py.File(killed, "r") as f:
        kept = f["fields/density/time"].shape[0]
        assert kept >= 2 and f["run"].attrs["status"] == "running"
    meanfield(mfattn_binary, killed, *slow, "--horizon", "1", "--resume", timeout=600)
    meanfield(mfattn_binary, whole, *slow, "--horizon", "1", timeout=600)
    with h5py.File(whole) as a, h5py.File(killed) as b:
        assert np.array_equal(a["fields/density/value"][:], b["fields/density/value"][:])
        assert b["run"].attrs["status"] == "complete"


def test_sigterm_records_the_interruption(mfattn_binary, tmp_path):
    out = tmp_path / "term.h5"
    command = [str(mfattn_binary), "meanfield", *SOLVE, "--grid", "1024", "--rtol", "1e-9", "--horizon", "50",
               "--quiet", "--threads", "1", "--out", str(out)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "--resume" in stderr
    with h5py.File(out) as f:
        assert f["run"].attrs["status"] == "interrupted: SIGTERM"
        assert f["fields/density/time"].shape[0] >= 1
