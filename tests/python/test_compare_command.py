"""`mfattn compare PARTICLES.h5 DENSITY.h5` (docs/meanfield.md section 7): the W1 of
`mfattn meanfield --compare` for two existing files, to the same digits; --json and --out (the
JSON object written whole); files in the wrong order, one file, an unknown option refused with
one line and exit 2."""
from __future__ import annotations

import json
import subprocess


def mfattn(binary, *args):
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=600)


def test_compare_gives_the_solvers_numbers_for_two_files(mfattn_binary, tmp_path):
    density, particles = tmp_path / "D.h5", tmp_path / "P.h5"
    common = ["--d", 2, "--beta", 2, "--horizon", 1, "--save-every", 0.5]
    particle_run = mfattn(mfattn_binary, "run", *common, "--n", 256, "--out", particles)
    assert particle_run.returncode == 0, particle_run.stderr
    solved = mfattn(mfattn_binary, "meanfield", *common, "--grid", 64, "--init-density", "vmf", "--init-kappa", 0.5,
                    "--out", density, "--compare", particles)
    assert solved.returncode == 0, solved.stderr
    again = mfattn(mfattn_binary, "compare", particles, density)
    assert again.returncode == 0, again.stderr
    assert again.stdout == solved.stdout and again.stdout.count("W1 = ") == 3
    stored = tmp_path / "w1.json"
    as_json = mfattn(mfattn_binary, "compare", particles, density, "--json", "--out", stored)
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    assert json.loads(stored.read_text()) == record
    assert record["metric"] == "circle-w1" and [f["time"] for f in record["frames"]] == [0, 0.5, 1]


def test_bad_calls_are_refused_with_one_line(mfattn_binary, tmp_path):
    run = tmp_path / "P.h5"
    assert mfattn(mfattn_binary, "run", "--n", 8, "--d", 2, "--horizon", 0.1, "--out", run).returncode == 0
    for args, message in [((run,), "needs two files, PARTICLES.h5 DENSITY.h5 (got 1)"),
                          ((run, run), "is not a density file of mfattn meanfield"),
                          ((run, run, "--csv"), "--csv: no such option (accepted: --json, --out FILE.json)"),
                          ((run, run, "--out"), "--out: needs a file name")]:
        done = mfattn(mfattn_binary, "compare", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("mfattn compare: ") and message in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
