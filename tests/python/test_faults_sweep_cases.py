"""A sweep counts a complete case file as done only when it was made with the case's options:
a file of other options under a case id (put there by hand, or left by another grid) fails
that case, names the option, and is left untouched (docs/sweeps.md)."""
from __future__ import annotations

import shutil
import subprocess

from test_faults_sweep import DEADLINE, dry_run_ids, manifest_status, write_sweep


def sweep(binary, config, out):
    return subprocess.run([str(binary), "sweep", "--config", str(config), "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=DEADLINE)


def test_a_complete_file_of_other_options_under_a_case_id_is_refused_untouched(mfattn_binary, tmp_path):
    config = write_sweep(tmp_path / "s.ini", "beta = 1 2\n", base="d = 3\nn = 8\nthreads = 1\nhorizon = 1\n")
    out = tmp_path / "out"
    first = sweep(mfattn_binary, config, out)
    assert first.returncode == 0, first.stderr
    beta1, beta2 = dry_run_ids(mfattn_binary, config, out)
    # The beta = 2 file under beta = 1's id.
    shutil.copyfile(out / f"{beta2}.h5", out / f"{beta1}.h5")
    planted = (out / f"{beta1}.h5").read_bytes()
    again = sweep(mfattn_binary, config, out)
    assert again.returncode == 4, again.stdout + again.stderr
    text = again.stdout + again.stderr
    assert f"{beta1}.h5 is a complete run of other options (--beta is 1 but the file was made with 2)" in text, text
    assert (out / f"{beta1}.h5").read_bytes() == planted
    # The case of beta = 2 is still done, and a rerun after moving the file away completes.
    assert manifest_status(out)[beta2] == "complete"
    (out / f"{beta1}.h5").unlink()
    assert sweep(mfattn_binary, config, out).returncode == 0
    assert set(manifest_status(out).values()) == {"complete"}


def test_a_complete_file_of_another_horizon_is_not_the_case(mfattn_binary, tmp_path):
    config = write_sweep(tmp_path / "s.ini", "seed = 1\n", base="d = 3\nn = 8\nthreads = 1\nhorizon = 1\n")
    out = tmp_path / "out"
    assert sweep(mfattn_binary, config, out).returncode == 0
    (case,) = dry_run_ids(mfattn_binary, config, out)
    shorter = subprocess.run([str(mfattn_binary), "run", "--d", "3", "--n", "8", "--threads", "1", "--seed", "1",
                              "--horizon", "0.5", "--quiet", "--overwrite", "--out", str(out / f"{case}.h5")],
                             capture_output=True, text=True, timeout=DEADLINE)
    assert shorter.returncode == 0, shorter.stderr
    again = sweep(mfattn_binary, config, out)
    assert again.returncode == 4 and "--horizon is 1 but the file was made with 0.5" in again.stdout + again.stderr
