"""Frame batches (`mfattn run --flush-interval`, docs/output.md "Chunks, filters, flushing"):
how frames are grouped into flushes changes no value in the file, and a bad interval is
refused. What a SIGKILL keeps is tested in test_faults_run.py and test_save_positions.py
(with the default interval) and in the unit test H5md.StagedFramesReachTheFileOnlyAtFlush.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

# Attributes that record how the run went, not what it computed.
RUN_ATTRIBUTES = {"wall_time_s"}


def run(binary: Path, out: Path, *args, cwd=None) -> subprocess.CompletedProcess:
    command = [str(binary), "run", *map(str, args), "--threads", "1", "--quiet", "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


def contents(path: Path) -> dict:
    """Every dataset's values and every attribute, by path (command lines and timings left out)."""
    found: dict = {}
    with h5py.File(path, "r") as f:
        def visit(name, item):
            if isinstance(item, h5py.Dataset):
                found[name] = item[()]
            for key, value in item.attrs.items():
                if name == "run" and key in RUN_ATTRIBUTES:
                    continue
                if name == "parameters" and key in ("command_line", "flush-interval"):
                    continue
                found[f"{name}@{key}"] = value
        f.visititems(visit)
        visit("", f)
    return found


@pytest.mark.parametrize("mode", ["all", "ends", "none"])
def test_the_batching_of_frames_changes_no_value(mfattn_binary, tmp_path, mode):
    args = ["--n", 24, "--d", 3, "--replicas", 2, "--horizon", 4, "--save-every", 0.05,
            "--save-positions", mode, "--seed", 3] + (["--save-velocity"] if mode != "none" else [])
    files = {}
    for interval in ("0", "86400"):
        (tmp_path / interval).mkdir()
        # The same --out in each folder: /parameters holds it.
        done = run(mfattn_binary, Path("run.h5"), *args, "--flush-interval", interval,
                   cwd=tmp_path / interval)
        assert done.returncode == 0, done.stderr
        files[interval] = contents(tmp_path / interval / "run.h5")
    per_frame, batched = files["0"], files["86400"]
    assert per_frame.keys() == batched.keys()
    assert per_frame["observables/energy/value"].shape[0] == 81
    for name, value in per_frame.items():
        assert np.array_equal(np.asarray(value), np.asarray(batched[name])), name


def test_the_interval_is_an_execution_option_a_resume_may_change(mfattn_binary, tmp_path):
    out = tmp_path / "r.h5"
    args = ("--n", 16, "--horizon", 2, "--save-every", 0.1, "--seed", 1)
    assert run(mfattn_binary, out, *args, "--flush-interval", "0").returncode == 0
    grown = [a if a != 2 else 3 for a in args]
    done = run(mfattn_binary, out, *grown, "--flush-interval", "5", "--resume")
    assert done.returncode == 0, done.stderr
    with h5py.File(out, "r") as f:
        assert f["observables/energy/value"].shape[0] == 31
        assert f["run"].attrs["status"] in ("complete", b"complete")
