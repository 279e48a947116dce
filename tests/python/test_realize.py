"""`mfattn realize` (docs/realization.md): the constructions realize their target laws."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from scipy.linalg import expm

REPO_ROOT = Path(__file__).resolve().parents[2]


def realize(binary: Path, tmp_path: Path, *args, out: str = "r.h5") -> dict:
    command = [str(binary), "realize", *map(str, args), "--threads", "1", "--out", str(tmp_path / out), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, " ".join(command) + "\n" + done.stderr
    result = json.loads(done.stdout)
    assert {"metric", "distance", "noise_floor"} <= set(result)
    return result


def test_rope_realizes_a_circle_law_within_the_noise_and_at_rate_n_to_minus_half(mfattn_binary, tmp_path):
    result = realize(mfattn_binary, tmp_path, "--target", "vmf-mixture", "--mechanism", "rope", "--n", 256)
    assert result["metric"].startswith("wasserstein-1 on the circle")
    assert result["max_deviation"] < 1e-9  # x_i = G_i^T u to rounding: the orbit
    assert result["distance"] < 2.0 * result["noise_floor"]
    with h5py.File(tmp_path / "r.h5", "r") as f:
        group = f["realization"]
        assert group["target"].shape == (256,) and group["realized"].shape == (256,)
        assert group.attrs["mechanism"] == "rope" and group.attrs["distance"] == result["distance"]
        assert f["run"].attrs["status"] == "complete"
    # The distance falls like n^(-1/2): the log-log slope over n = 64 ... 1024, three seeds each.
    sizes = [64, 128, 256, 512, 1024]
    means = []
    for n in sizes:
        values = [realize(mfattn_binary, tmp_path, "--target", "vmf-mixture", "--mechanism", "rope", "--n", n,
                          "--seed", seed, "--horizon", 20, out=f"r{n}_{seed}.h5")["distance"] for seed in (1, 2, 3)]
        means.append(np.mean(values))
    slope = np.polyfit(np.log(sizes), np.log(means), 1)[0]
    assert -0.8 < slope < -0.3, (slope, means)


def test_rope_mixed_realizes_a_torus_law(mfattn_binary, tmp_path):
    result = realize(mfattn_binary, tmp_path, "--target", "cap", "--mechanism", "rope-mixed", "--n", 256)
    assert result["max_deviation"] < 1e-9
    assert result["distance"] < 2.0 * result["noise_floor"]


def test_prefix_gauge_realizes_a_vmf_mixture_and_without_the_pin_a_push_forward(mfattn_binary, tmp_path):
    pinned = realize(mfattn_binary, tmp_path, "--target", "vmf-mixture", "--mechanism", "prefix-gauge", "--n", 256,
                     out="pinned.h5")
    assert pinned["metric"].startswith("energy distance")
    assert pinned["max_deviation"] < 1e-9
    assert pinned["distance"] < 2.0 * pinned["noise_floor"]
    assert np.allclose(pinned["u"], [0, 0, 1], atol=1e-9)
    free = realize(mfattn_binary, tmp_path, "--target", "vmf-mixture", "--mechanism", "prefix-gauge", "--n", 256,
                   "--no-pin", out="free.h5")
    # Without the pin the law is the push-forward by O(g)^T u for the u the dynamics picked:
    # rebuilt here from the stored u, positions and generators.
    with h5py.File(tmp_path / "free.h5", "r") as f:
        u = f["realization/u"][()]
        positions = f["particles/tokens/aux_position"][()]
        generators = f["particles/tokens/gauge_generators"][()]
        x = f["particles/tokens/position/value"][-1]
        assert f["realization"].attrs["pinned"] == "no"
    predicted = np.stack([expm(np.tensordot(xi, generators, axes=1)).T @ u for xi in positions])
    assert np.max(np.abs(predicted - x)) < 1e-9
    assert not np.allclose(u, [0, 0, 1], atol=1e-3)
    assert free["distance"] > 2.0 * free["noise_floor"]  # a distorted copy, not the target


def test_contrasts_do_not_realize_the_target(mfattn_binary, tmp_path):
    bias = realize(mfattn_binary, tmp_path, "--target", "cap", "--mechanism", "rope", "--contrast", "distance-bias",
                   "--n", 128, "--horizon", 60, out="bias.h5")
    plain = realize(mfattn_binary, tmp_path, "--target", "cap", "--mechanism", "rope", "--contrast", "plain-values",
                    "--n", 128, out="plain.h5")
    for result in (bias, plain):
        assert result["distance"] > 5.0 * result["noise_floor"]
    assert bias["max_deviation"] < 0.05  # collapsed towards one point whatever the positions


def test_a_target_file_and_bad_input(mfattn_binary, tmp_path):
    samples = tmp_path / "angles.txt"
    rng = np.random.default_rng(0)
    samples.write_text("\n".join(str(a) for a in rng.uniform(0, math.pi, 500)))
    result = realize(mfattn_binary, tmp_path, "--target", samples, "--mechanism", "rope", "--n", 200)
    assert result["distance"] < 2.0 * result["noise_floor"]

    def refused(*args):
        done = subprocess.run([str(mfattn_binary), "realize", *map(str, args), "--out", str(tmp_path / "no.h5")],
                              capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert not (tmp_path / "no.h5").exists()
        return done.stderr

    assert "--target bogus: accepted: vmf-mixture, band, cap, uniform" in refused("--target", "bogus", "--mechanism", "rope")
    assert "--d 4: --mechanism rope realizes laws on the latitude circles of d = 3" in refused(
        "--target", "uniform", "--mechanism", "rope", "--d", "4")
    assert "--mechanism spiral: accepted: rope, rope-mixed, prefix-gauge" in refused(
        "--target", "uniform", "--mechanism", "spiral")
    assert "--no-pin: only with --mechanism prefix-gauge" in refused("--target", "uniform", "--mechanism", "rope", "--no-pin")
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2\n")
    assert "each line must hold 3 finite numbers" in refused("--target", bad, "--mechanism", "prefix-gauge")


def test_realization_figure(mfattn_binary, tmp_path):
    realize(mfattn_binary, tmp_path, "--target", "band", "--mechanism", "rope", "--n", 128, out="circle.h5")
    realize(mfattn_binary, tmp_path, "--target", "vmf-mixture", "--mechanism", "prefix-gauge", "--n", 128, out="sphere.h5")
    realize(mfattn_binary, tmp_path, "--target", "vmf-mixture", "--mechanism", "rope-mixed", "--n", 128, out="torus.h5")
    figure = tmp_path / "realization.png"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "analysis" / "plot_realization.py"),
                           str(tmp_path / "circle.h5"), str(tmp_path / "sphere.h5"), str(tmp_path / "torus.h5"),
                           "--out", str(figure)], capture_output=True, text=True,
                          env=dict(os.environ, MPLBACKEND="Agg"))
    assert done.returncode == 0, done.stderr
    assert figure.stat().st_size > 20_000
