"""Per-replica matrices and layers (--matrices, --regen-period) as the file records them, and
a run's trajectory across a layer start (docs/reference.md)."""
from __future__ import annotations

import h5py
import numpy as np

BASE = ("--n", 16, "--d", 3, "--kernel", "sa", "--beta", 2, "--k", "goe-unit", "--v", "wishart",
        "--integrator", "euler-unprojected", "--dt", 0.1, "--save-every", 0.1, "--replicas", 3,
        "--matrices", "per-replica", "--seed", 5)


def positions(path, replica=0):
    group = "tokens" if replica == 0 else f"tokens_r{replica}"
    with h5py.File(path, "r") as f:
        return f[f"particles/{group}/position/value"][()], f[f"particles/{group}/position/time"][()]


def matrices(path, replica=0):
    group = "tokens" if replica == 0 else f"tokens_r{replica}"
    with h5py.File(path, "r") as f:
        g = f[f"particles/{group}/attention_matrices"]
        return {name: g[name][()] for name in ("layer_start", "query", "key", "value")}


def test_every_replica_records_its_own_matrices_of_every_layer(run_mfattn):
    path = run_mfattn(*BASE, "--horizon", 2.5, "--regen-period", 1)
    first, second = matrices(path, 0), matrices(path, 1)
    np.testing.assert_array_equal(first["layer_start"], [0.0, 1.0, 2.0])
    assert first["key"].shape == (3, 3, 3)
    assert not np.array_equal(first["key"], second["key"])  # replicas differ
    assert not np.array_equal(first["key"][0], first["key"][1])  # layers differ
    np.testing.assert_array_equal(first["query"], np.broadcast_to(np.eye(3), (3, 3, 3)))
    # goe-unit is symmetric; wishart is symmetric positive semi-definite.
    np.testing.assert_array_equal(first["key"], np.swapaxes(first["key"], 1, 2))
    assert np.all(np.linalg.eigvalsh(first["value"]) > -1e-12)


def test_layer_zero_is_the_run_without_layers_until_the_first_start(run_mfattn):
    layered = run_mfattn(*BASE, "--horizon", 2, "--regen-period", 1, out="layered.h5")
    plain = run_mfattn(*BASE, "--horizon", 2, out="plain.h5")
    np.testing.assert_array_equal(matrices(plain)["key"][0], matrices(layered)["key"][0])
    x_layered, times = positions(layered)
    x_plain, _ = positions(plain)
    up_to_start = int(np.searchsorted(times, 1.0)) + 1  # frames at t <= 1 (t = 1 included)
    np.testing.assert_array_equal(x_layered[:up_to_start], x_plain[:up_to_start])
    assert np.abs(x_layered[-1] - x_plain[-1]).max() > 1e-6  # the new layer moved them elsewhere


def test_the_new_layer_drives_the_steps_after_its_start(run_mfattn, tmp_path):
    """A run started at layer 1's state with layer 1's matrices given as files continues the
    layered run to the last bit (one replica, shared matrices)."""
    shared = ("--n", 12, "--d", 3, "--kernel", "usa", "--beta", 1, "--k", "gaussian-product",
              "--integrator", "euler-unprojected", "--dt", 0.125, "--save-every", 0.125, "--seed", 3)
    layered = run_mfattn(*shared, "--horizon", 2, "--regen-period", 1, out="layered.h5")
    record = matrices(layered)
    key_file = tmp_path / "k1.txt"
    np.savetxt(key_file, record["key"][1], fmt="%.17g")
    x, times = positions(layered)
    start = int(np.searchsorted(times, 1.0))
    assert times[start] == 1.0
    init_file = tmp_path / "x1.txt"
    np.savetxt(init_file, x[start], fmt="%.17g")
    continued = run_mfattn("--n", 12, "--d", 3, "--kernel", "usa", "--beta", 1, "--k", str(key_file),
                           "--integrator", "euler-unprojected", "--dt", 0.125, "--save-every", 0.125,
                           "--horizon", 1, "--init", "file", "--init-file", str(init_file),
                           out="continued.h5")
    x_continued, _ = positions(continued)
    np.testing.assert_array_equal(x_continued[-1], x[-1])


def test_resume_across_a_layer_start_gives_the_uninterrupted_run(run_mfattn, mfattn_binary, tmp_path):
    import subprocess

    whole = run_mfattn(*BASE, "--horizon", 3, "--regen-period", 1, out="whole.h5")
    part = run_mfattn(*BASE, "--horizon", 1.5, "--regen-period", 1, out="part.h5")
    done = subprocess.run([str(mfattn_binary), "run", *map(str, BASE), "--horizon", "3", "--regen-period", "1",
                           "--threads", "1", "--quiet", "--resume", "--out", str(part)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for replica in range(3):
        np.testing.assert_array_equal(positions(part, replica)[0], positions(whole, replica)[0])
        np.testing.assert_array_equal(matrices(part, replica)["key"], matrices(whole, replica)["key"])
