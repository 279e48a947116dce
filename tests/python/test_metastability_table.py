"""analysis/metastability_table.py on small real runs: one row per beta with k*, the plateaus
that mfattn analyze reports, and the final counts; a folder without runs is an error."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "analysis" / "metastability_table.py"


def test_table_lists_each_beta_with_its_prediction_and_final_counts(run_mfattn, mfattn_binary, tmp_path):
    for beta in (5, 9):
        for seed in (0, 1):
            run_mfattn("--n", 24, "--d", 2, "--beta", beta, "--time-scale", "rescaled",
                       "--integrator", "dopri5", "--horizon", 300, "--save-log", 40,
                       "--seed", seed, out=f"beta{beta}_seed{seed}.h5")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--mfattn", str(mfattn_binary)],
                          capture_output=True, text=True, check=True)
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["5", "9"]
    assert [row.split("|")[2].strip() for row in rows] == ["3", "4"]  # k* of beta = 5, 9
    for row in rows:
        finals = row.split("|")[4].split(",")
        assert len(finals) == 2 and all(1 <= int(f) <= 24 for f in finals)
        assert "0: " in row and "1: " in row


def test_empty_folder_is_an_error(tmp_path, mfattn_binary):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--mfattn", str(mfattn_binary)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "no beta*_seed*.h5 files" in done.stderr
