"""analysis/metastability_table.py on runs named anyhow: beta and the seed come from each
file's /parameters, any *.h5 under the folder is read, and the plateau counts are those of
`mfattn analyze --json` for the same file."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from mfattn.plotting import predicted_clusters

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "analysis" / "metastability_table.py"


def table(folder: Path, binary: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", str(SCRIPT), str(folder), "--mfattn", str(binary)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, MPLBACKEND="Agg"))


def test_rows_come_from_the_files_parameters_whatever_their_names(run_mfattn, mfattn_binary, tmp_path):
    folder = tmp_path / "runs"
    runs = {"first.h5": (4, 3), "deeper/x.h5": (4, 1), "b9.h5": (9, 2)}
    for name, (beta, seed) in runs.items():
        path = run_mfattn("--n", 24, "--d", 2, "--beta", beta, "--seed", seed, "--time-scale", "rescaled",
                          "--horizon", 100, "--save-log", 20, out=Path(name).name)
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
    done = table(folder, mfattn_binary)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("| clusters at t = 100 |")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]}
    assert sorted(rows) == ["4", "9"]
    assert rows["4"][1] == str(predicted_clusters(4.0)) and rows["9"][1] == str(predicted_clusters(9.0))
    # Seeds in order, from /parameters (the names say nothing of them).
    assert [part.split(":")[0] for part in rows["4"][2].split("; ")] == ["1", "3"]
    finals = {}
    for name, (beta, seed) in runs.items():
        report = json.loads(subprocess.run([str(mfattn_binary), "analyze", "--json", str(folder / name)],
                                           capture_output=True, text=True, check=True).stdout)
        finals.setdefault(beta, []).append((seed, str(report["final_clusters"])))
    assert rows["4"][3] == ", ".join(c for _, c in sorted(finals[4]))
    assert rows["9"][3] == finals[9][0][1]


def test_an_empty_folder_or_a_foreign_file_is_one_clear_line(mfattn_binary, tmp_path):
    done = table(tmp_path, mfattn_binary)
    assert done.returncode == 2 and done.stderr.strip() == f"metastability_table.py: no .h5 files under {tmp_path}"
    import h5py
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = [1.0]
    done = table(tmp_path, mfattn_binary)
    assert done.returncode == 2 and "foreign.h5: no beta and seed in /parameters" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
