"""experiments/fast/bipodal_time.py runs, prints
its table and writes its files (cheap sizes here; docs/experiments.md has the real run)."""
from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_bipodal_time_experiment_fits_its_collapse_times(mfattn_binary, tmp_path):
    env = dict(os.environ, MFATTN_BINARY=str(mfattn_binary), MPLBACKEND="Agg")
    done = subprocess.run(["/usr/bin/python3", str(REPO / "experiments/fast/bipodal_time.py"), "--sizes", "60,240",
                           "--seeds", "2", "--horizon", "80", "--frames", "40", "--out-dir", str(tmp_path),
                           "--figure-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "fit T = C ln n + D: C = " in done.stdout
    with open(tmp_path / "bipodal_time.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["n"]) for r in rows] == [60, 60, 240, 240]
    # Every run collapsed; those with a two-cluster plateau after it.
    assert all(float(r["collapse_time"]) > 0 for r in rows)
    bipodal = [r for r in rows if r["two_end"]]
    assert bipodal
    for r in bipodal:
        assert float(r["collapse_time"]) > float(r["two_end"]) >= float(r["two_start"]) > 0
    assert (tmp_path / "bipodal_time.png").stat().st_size > 0
