"""mfattn.analyze (docs/python.md): the JSON of `mfattn analyze --json` as a dict, from a path or
a Trajectory, every plateau, merge and split flagged with whether the text at min_decades lists
it; the refusals."""
from __future__ import annotations

import json
import subprocess

import pytest


def test_the_dict_is_the_commands_json_and_its_flags_are_the_texts(mfattn, mfattn_binary, tmp_path):
    path = tmp_path / "meta.h5"
    run = subprocess.run([str(mfattn_binary), "run", "--n", "32", "--d", "3", "--beta", "9", "--kernel", "sa",
                          "--horizon", "1000", "--dt", "0.05", "--save-log", "60", "--seed", "1", "--quiet", "--out",
                          str(path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    command = subprocess.run([str(mfattn_binary), "analyze", str(path), "--json"], capture_output=True, text=True)
    assert mfattn.analyze(path) == json.loads(command.stdout)
    assert mfattn.analyze(mfattn.load(path)) == json.loads(command.stdout)
    result = mfattn.analyze(str(path))
    text = subprocess.run([str(mfattn_binary), "analyze", str(path)], capture_output=True, text=True).stdout
    listed = [p for p in result["plateaus"] if p["listed"]]
    assert len(listed) == text.count("\nplateau ") < len(result["plateaus"])
    assert [p["initial"] for p in result["plateaus"]] == [True] + [False] * (len(result["plateaus"]) - 1)
    exact = [c for c in result["merge_times"] + result["split_times"] if c["listed"]]
    assert f"changes_not_listed        {len(result['merge_times']) + len(result['split_times']) - len(exact)} of" in text
    every = mfattn.analyze(path, min_decades=0)
    assert every["min_decades"] == 0 and all(p["listed"] for p in every["plateaus"])
    assert all(c["listed"] for c in every["merge_times"])


def test_refusals(mfattn, tmp_path):
    path = tmp_path / "r.h5"
    mfattn.run(out=str(path), n=6, d=3, horizon=0.2)
    with pytest.raises(ValueError, match="replica 3"):
        mfattn.analyze(path, replica=3)
    with pytest.raises(ValueError, match="min_decades: -1"):
        mfattn.analyze(path, min_decades=-1)
    with pytest.raises(ValueError, match="not read from a file"):
        mfattn.analyze(mfattn.run(n=4, d=3, horizon=0.1))
    (tmp_path / "not.h5").write_bytes(b"nothing")
    with pytest.raises(ValueError):
        mfattn.analyze(tmp_path / "not.h5")
