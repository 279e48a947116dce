"""`mfattn realize` faults: prefix gauges up to d = 16, --beta limited to where the values
collapse (and a run that did not collapse is not reported as a realization), target files
whose bad lines are refused, never dropped, rows normalised without overflow (also
--normalize-init), and advice after a signal that can be followed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

DEADLINE = 120.0


def realize(binary, *args, timeout=DEADLINE):
    return subprocess.run([str(binary), "realize", "--threads", "1", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("d", [4, 9, 16])
def test_prefix_gauge_realizes_in_every_documented_dimension(mfattn_binary, tmp_path, d):
    done = realize(mfattn_binary, "--target", "uniform", "--mechanism", "prefix-gauge", "--d", d, "--n", 24,
                   "--out", tmp_path / "g.h5", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["max_deviation"] < 1e-12 and len(result["u"]) == d, result


def test_a_beta_beyond_the_collapse_is_refused_up_front(mfattn_binary, tmp_path):
    done = realize(mfattn_binary, "--target", "uniform", "--mechanism", "rope", "--beta", 5, "--out", tmp_path / "b.h5")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--beta 5: must be in (0, 3]" in done.stderr
    assert not list(tmp_path.iterdir())


def test_a_run_that_did_not_collapse_is_not_reported_as_realized(mfattn_binary, tmp_path):
    done = realize(mfattn_binary, "--target", "uniform", "--mechanism", "rope", "--n", 64, "--horizon", 0.3,
                   "--out", tmp_path / "c.h5")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "not realized: max |x_i - G_i^T u|" in done.stderr and "longer --horizon" in done.stderr


@pytest.mark.parametrize("bad", ["nan nan 1", "inf 0 0", "one two three", "1 2"])
def test_target_file_lines_that_are_not_points_are_refused_with_their_line(mfattn_binary, tmp_path, bad):
    target = tmp_path / "t.txt"
    target.write_text(f"0 0 1\n# a comment\n{bad}\n1 0 0\n")
    done = realize(mfattn_binary, "--target", target, "--mechanism", "prefix-gauge", "--d", 3, "--n", 16,
                   "--out", tmp_path / "t.h5")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "--target" in done.stderr and "line 3" in done.stderr, done.stderr
    assert not (tmp_path / "t.h5").exists()


def test_huge_and_tiny_target_rows_normalise_to_unit_points(mfattn_binary, tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("1e308 0 0\n0 -1e308 1e308\n0 0 1e-170\n")
    done = realize(mfattn_binary, "--target", target, "--mechanism", "prefix-gauge", "--d", 3, "--n", 16,
                   "--out", tmp_path / "t.h5")
    assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "t.h5", "r", locking=False) as f:
        drawn = f["realization/target"][()]
    np.testing.assert_allclose(np.linalg.norm(drawn, axis=-1), 1.0, rtol=0, atol=1e-15)


def test_normalize_init_rows_near_the_range_of_double(run_mfattn, tmp_path):
    rows = tmp_path / "x.txt"
    rows.write_text("1e308 1e308 0\n0 0 -1e-170\n3 4 0\n")
    out = run_mfattn("--n", 3, "--d", 3, "--horizon", 0.1, "--init", "file", "--init-file", rows,
                     "--normalize-init")
    with h5py.File(out, "r", locking=False) as f:
        first = f["particles/tokens/position/value"][0]
    expected = np.array([[2 ** -0.5, 2 ** -0.5, 0], [0, 0, -1], [0.6, 0.8, 0]])
    np.testing.assert_allclose(first, expected, rtol=0, atol=1e-15)


def test_sigterm_advice_can_be_followed(mfattn_binary, tmp_path):
    out = tmp_path / "s.h5"
    process = subprocess.Popen([str(mfattn_binary), "realize", "--threads", "1", "--target", "uniform",
                                "--mechanism", "rope", "--n", "64", "--dt", "1e-4", "--horizon", "30",
                                "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + DEADLINE
        while not out.exists() and process.poll() is None and time.monotonic() < end:
            time.sleep(0.01)
        assert out.exists(), "realize's run did not publish its file"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=DEADLINE)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "--resume" not in stderr and "run the same realize command again with --overwrite" in stderr, stderr
