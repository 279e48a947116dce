"""`mfattn fit` (docs/cli.md, "fit"): weights fitted by gradients through whole runs. A target
made by running hidden weights from the same initial tokens is reached (the loss falls by
1e10 and the hidden value matrix comes back), the file it writes replays its best run to the
bit, layers in time and x(0) are fitted and replayed by the config file beside it, SIGTERM
keeps the best weights, and bad input is one line, exit 2, nothing written."""
from __future__ import annotations

import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

# The hidden weights' run: 8 tokens in d = 3 over t in [0, 1], rk4 steps of 0.05.
MODEL = ["--n", "8", "--d", "3", "--kernel", "sa", "--values", "plain", "--horizon", "1", "--dt", "0.05",
         "--seed", "3"]


def write_weights(path, weights):
    with h5py.File(path, "w") as f:
        for key, value in weights.items():
            f[key] = np.asarray(value, dtype=np.float64)


def last_frame(path):
    with h5py.File(path, "r") as f:
        return f["particles/tokens/position/value"][-1]


def fit(binary, *args, timeout=600):
    return subprocess.run([str(binary), "fit", *MODEL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def hidden(mfattn, mfattn_binary, tmp_path):
    """The hidden weights (gaussian Q, K, V of seed 3), their run's last frame as the target, and
    a start that knows Q and K but not V."""
    weights = mfattn.Model(n=8, d=3, kernel="sa", values="plain", q="gaussian", k="gaussian", v="gaussian",
                           seed=3).weights()
    write_weights(tmp_path / "hidden.h5", weights)
    subprocess.run([str(mfattn_binary), "run", *MODEL, "--weights", str(tmp_path / "hidden.h5"), "--out",
                    str(tmp_path / "target.h5"), "--quiet"], check=True, timeout=120)
    start = dict(weights, **{"attention/value": np.eye(3)[None]})
    write_weights(tmp_path / "start.h5", start)
    return weights, tmp_path


def test_a_reachable_target_is_reached_and_the_value_matrix_returns(mfattn_binary, hidden):
    weights, folder = hidden
    done = fit(mfattn_binary, "--weights", str(folder / "start.h5"), "--target", str(folder / "target.h5"),
               "--fit", "value", "--optimizer", "lbfgs", "--iterations", "300", "--out", str(folder / "fit.h5"))
    assert done.returncode == 0, done.stderr
    assert "mfattn fit: iteration 0/300  loss " in done.stderr
    with h5py.File(folder / "fit.h5", "r") as f:
        losses = f["fit/loss"][:]
        record = dict(f["fit"].attrs)
        value = f["attention/value"][:]
        assert np.array_equal(f["attention/query"][:], weights["attention/query"])
    assert record["status"] == "complete" and record["optimizer"] == "lbfgs"
    best = float(record["best_loss"])
    assert best == losses.min() and best <= 1e-10 * losses[0]
    assert np.max(np.abs(value - weights["attention/value"])) <= 1e-4 * np.max(np.abs(weights["attention/value"]))
    # The weights file replays the best run to the bit, alone (with the model's options) and
    # through the config file beside it.
    subprocess.run([str(mfattn_binary), "run", *MODEL, "--weights", str(folder / "fit.h5"), "--out",
                    str(folder / "replay.h5"), "--quiet"], check=True, timeout=120)
    subprocess.run([str(mfattn_binary), "run", "--config", str(folder / "fit.cfg"), "--out",
                    str(folder / "again.h5"), "--quiet"], check=True, timeout=120)
    replay = last_frame(folder / "replay.h5")
    assert np.array_equal(replay, last_frame(folder / "again.h5"))
    assert abs(np.sum((replay - last_frame(folder / "target.h5")) ** 2) - best) <= 1e-12 * losses[0]


def test_layers_in_time_and_x0_are_fitted_and_replayed_by_the_config(mfattn_binary, hidden):
    """Adam over three layers of the attention's matrices and x(0): the loss falls, the weights
    carry a leading layer axis, and `mfattn run --config FILE.cfg` (its weights, layer time and
    x(0) file) makes the run of the best loss."""
    _, folder = hidden
    done = fit(mfattn_binary, "--weights", str(folder / "start.h5"), "--target", str(folder / "target.h5"),
               "--fit", "attention,x0", "--layers", "3", "--iterations", "25", "--learning-rate", "0.02",
               "--quiet", "--out", str(folder / "layers.h5"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    with h5py.File(folder / "layers.h5", "r") as f:
        losses = f["fit/loss"][:]
        best = float(f["fit"].attrs["best_loss"])
        assert f["attention/query"].shape == (3, 1, 3, 3) and f["attention/output"].shape == (3, 3, 3)
        assert f["fit"].attrs["layer_time"] == str(1 / 3)
    assert len(losses) == 26 and best < 0.5 * losses[0]
    config = (folder / "layers.cfg").read_text()
    assert f"init-file = {folder / 'layers.x0.txt'}" in config and "layer-time = " in config
    x0 = np.loadtxt(folder / "layers.x0.txt")
    assert np.allclose(np.linalg.norm(x0, axis=1), 1.0, atol=1e-15)
    subprocess.run([str(mfattn_binary), "run", "--config", str(folder / "layers.cfg"), "--out",
                    str(folder / "replay.h5"), "--quiet"], check=True, timeout=120)
    replay = last_frame(folder / "replay.h5")
    assert abs(np.sum((replay - last_frame(folder / "target.h5")) ** 2) - best) <= 1e-12 * losses[0]


def test_sigterm_keeps_the_best_weights(mfattn_binary, hidden):
    _, folder = hidden
    process = subprocess.Popen([str(mfattn_binary), "fit", *MODEL, "--weights", str(folder / "start.h5"), "--target",
                                str(folder / "target.h5"), "--fit", "value", "--iterations", "10000000", "--quiet",
                                "--out", str(folder / "fit.h5")], stderr=subprocess.PIPE, text=True)
    # The first iteration's weights are written at once; then the fit is stopped.
    deadline = time.monotonic() + 300
    while not (folder / "fit.h5").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "mfattn fit: stopped by SIGTERM after iteration" in stderr and "holds the best weights" in stderr
    with h5py.File(folder / "fit.h5", "r") as f:
        assert f["fit"].attrs["status"] == "interrupted: SIGTERM"
        losses = f["fit/loss"][:]
        assert float(f["fit"].attrs["best_loss"]) == losses.min()
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("args, message", [
    (["--fit", "value"], "--target: required"),
    (["--target", "T", "--fit", "gate"], "--fit gate: 'gate' is none of attention, query, key, value, output, mlp"),
    (["--target", "T", "--fit", "value", "--loss", "w3"], "--loss w3: accepted: tokens, mmd, w2, energy, sinkhorn"),
    (["--target", "T", "--fit", "value", "--optimizer", "sgd"], "--optimizer sgd: accepted: adam, lbfgs"),
    (["--target", "T", "--fit", "value", "--iterations", "0"], "--iterations 0: accepted: 1 to 10000000"),
    (["--target", "T", "--fit", "value", "--layers", "0"], "--layers 0: accepted: 1 to 4096"),
    (["--target", "T", "--fit", "value", "--learning-rate", "-1"], "--learning-rate -1: must be a finite number > 0"),
    (["--target", "T", "--fit", "w1"], "the model has no feed-forward term (give --mlp W)"),
    (["--target", "T", "--fit", "value", "--replicas", "2"], "--replicas 2: fit fits one run (1 replica)"),
    (["--target", "T", "--fit", "value", "--integrator", "lie-euler"],
     "--integrator lie-euler: gradients through runs take euler, euler-unprojected, heun, rk4, dopri5, euler-maruyama"),
    (["--target", "T", "--fit", "value", "--loss-times", "0.335"], "--loss-times: 0.335 is none of the run's frame times"),
    (["--target", "ROWS", "--fit", "value"], "rows; the tokens loss takes one a token (8)"),
    (["--target", "T", "--fit", "value", "--out", "EXISTING"], "exists (give --overwrite to replace it)"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(mfattn_binary, hidden, args, message):
    _, folder = hidden
    np.savetxt(folder / "rows.txt", np.eye(3))
    (folder / "existing.h5").write_bytes(b"")
    words = [{"T": str(folder / "target.h5"), "ROWS": str(folder / "rows.txt"),
              "EXISTING": str(folder / "existing.h5")}.get(a, a) for a in args]
    if "--out" not in words:
        words += ["--out", str(folder / "fit.h5")]
    before = sorted(p.name for p in folder.iterdir())
    done = fit(mfattn_binary, "--weights", str(folder / "start.h5"), *words)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


def test_the_measure_to_measure_experiment_runs_quick(mfattn_binary, tmp_path):
    """experiments/gradients/measure_to_measure.py --quick: the fit, its replay and its table,
    the loss falling and the figure written."""
    import csv
    import os
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, MFATTN_BINARY=str(mfattn_binary), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(root / "experiments/gradients/measure_to_measure.py"), "--quick",
                           "--data", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "| d | n | layers | L-BFGS iterations |" in done.stdout
    row = next(csv.DictReader(open(tmp_path / "gradients" / "measure_to_measure.csv")))
    assert int(row["d"]) == 3 and int(row["n"]) == 30 and int(row["layers"]) == 2
    assert float(row["loss_end"]) < float(row["loss_start"])
    assert 0 < float(row["largest_distance"]) < np.pi
    assert (tmp_path / "figures" / "measure_to_measure.png").stat().st_size > 0


def test_the_anti_collapse_experiment_runs_quick(mfattn_binary, tmp_path):
    """experiments/gradients/anti_collapse.py --quick: the fit of the feed-forward term, its
    three runs and their table, and the figure."""
    import csv
    import os
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, MFATTN_BINARY=str(mfattn_binary), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(root / "experiments/gradients/anti_collapse.py"), "--quick", "--data",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {r["run"]: r for r in csv.DictReader(open(tmp_path / "gradients" / "anti_collapse.csv"))}
    assert sorted(rows) == ["attention alone", "fitted feed-forward", "untrained feed-forward"]
    with h5py.File(tmp_path / "gradients" / "anti_collapse_mlp.h5", "r") as f:
        losses = f["fit/loss"][:]
    assert len(losses) >= 2 and losses.min() < losses[0]
    # The fit lowers the mmd at T below the untrained term's.
    assert float(rows["fitted feed-forward"]["mmd_T"]) < float(rows["untrained feed-forward"]["mmd_T"])
    assert (tmp_path / "figures" / "anti_collapse.png").stat().st_size > 0
