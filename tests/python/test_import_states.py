"""Other models' states as mfattn files (docs/import.md): mfattn.io.write and `mfattn import`
store them as given, with the observables of their directions (checked against NumPy written
here from docs/model.md section 6's definitions); analyze, info, load, view, animate and
plot_run take the file; .npy and .npz (stored and deflated) give the same file as io.write; bad
input is refused with exit 2 (ValueError) and no file. The hidden states are those of a PyTorch
encoder, layer by layer."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components

from conftest import ANALYSIS_DIR, bits

torch = pytest.importorskip("torch")


def directions_observables(states: np.ndarray, presence: np.ndarray, delta: float) -> dict[str, np.ndarray]:
    """Per frame of [T, n, d]: n_clusters, min_inner, marginal_spread and norm_mean of the
    directions u_i = x_i / |x_i| of the tokens with presence > 0."""
    moving = presence > 0
    out = {name: [] for name in ("n_clusters", "min_inner", "marginal_spread", "norm_mean")}
    for x in states:
        scale = np.abs(x[moving]).max(axis=1, keepdims=True)  # rows of 1e-200 and 1e200 too
        norms = (scale * np.linalg.norm(x[moving] / scale, axis=1, keepdims=True))[:, 0]
        u = (x[moving] / scale) / np.linalg.norm(x[moving] / scale, axis=1, keepdims=True)
        gram = u @ u.T
        m = len(u)
        off = gram[~np.eye(m, dtype=bool)]
        out["n_clusters"].append(connected_components(gram > 1 - delta, directed=False)[0])
        out["min_inner"].append(off.min())
        out["marginal_spread"].append(1 - np.linalg.eigvalsh(u.T @ u / m)[-1])
        out["norm_mean"].append(norms.mean())
    return {name: np.asarray(values, dtype=float) for name, values in out.items()}


def encoder_hidden_states(layers: int = 12, n: int = 24, d: int = 16) -> np.ndarray:
    """The input and every layer's output of a PyTorch encoder whose layers share one set of
    weights (a fixed layer applied `layers` times), for one sequence of n random tokens:
    [layers + 1, n, d], not unit rows (post-norm layers give |x| near sqrt(d))."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=2 if d % 2 == 0 else 1, dim_feedforward=32, dropout=0.0,
                                             batch_first=True, dtype=torch.float64)
    # A larger query-key product makes the attention sharp enough for tokens to gather.
    with torch.no_grad():
        layer.self_attn.in_proj_weight[: 2 * d] *= 4.0
    layer.eval()
    x = torch.randn(1, n, d, dtype=torch.float64)
    states = [x]
    with torch.no_grad():
        for _ in range(layers):
            x = layer(x)
            states.append(x)
    return torch.cat(states).numpy()


def test_hidden_states_of_a_pytorch_encoder_are_analysed_on_their_directions(mfattn, mfattn_binary, tmp_path):
    states = encoder_hidden_states()
    T, n, d = states.shape
    presence = np.ones(n)
    presence[-2:] = 0.0  # two padding tokens: stored, left out of the observables
    path = tmp_path / "encoder.h5"
    delta = 0.02
    space = mfattn.io.write(path, states, labels={"presence": presence, "prompt_id": np.arange(n) % 3},
                            parameters={"model": "TransformerEncoderLayer", "d_model": d, "heads": 2,
                                        "shared_weights": True, "scales": [4.0, 1.0]},
                            cluster_delta=delta)
    assert space == "euclidean"
    tr = mfattn.load(path)
    assert tr.state_space == "euclidean"
    assert np.array_equal(bits(tr.positions), bits(states))  # the states as given, to the bit
    assert np.allclose(np.linalg.norm(tr.directions, axis=-1), 1.0, atol=1e-15)
    assert np.array_equal(tr.times, np.arange(T, dtype=float))
    assert np.array_equal(tr.labels["presence"], presence)
    assert np.array_equal(tr.labels["prompt_id"], np.arange(n) % 3)
    assert np.array_equal(tr.labels["aux_position"].ravel(), np.arange(n, dtype=float))
    assert tr.parameters["model"] == "TransformerEncoderLayer" and tr.parameters["d_model"] == d
    assert tr.parameters["scales"] == [4.0, 1.0] and tr.parameters["command"] == "import"
    assert tr.parameters["active_tokens"] == n - 2
    assert "beta" not in tr.parameters and "kernel" not in tr.parameters and "energy" not in tr.observables

    expected = directions_observables(states, presence, delta)
    for name, values in expected.items():
        assert np.allclose(tr.observables[name], values, rtol=0, atol=1e-12), name
    clusters = expected["n_clusters"]
    assert clusters[0] > clusters[-1], "the encoder should gather its tokens"

    result = mfattn.analyze(path, min_decades=0)
    assert result["state_space"] == "euclidean" and result["energy_in_file"] is False
    assert result["final_clusters"] == clusters[-1]
    assert result["energy_final"] is None and result["energy_monotone"] is None
    # Plateaus: the maximal runs of equal counts, in order; merges where the count drops.
    runs = [[clusters[0], 0, 0]]
    for f in range(1, T):
        if clusters[f] == runs[-1][0]:
            runs[-1][2] = f
        else:
            runs.append([clusters[f], f, f])
    assert [(p["clusters"], p["first_frame"], p["last_frame"]) for p in result["plateaus"]] == \
        [(int(c), a, b) for c, a, b in runs]
    assert [m["time"] for m in result["merge_times"]] == \
        [float(f) for f in range(1, T) if clusters[f] < clusters[f - 1]]
    text = subprocess.run([str(mfattn_binary), "analyze", str(path)], capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert "states in R^d, analysed on their directions" in text.stdout
    assert "energy_final              none (the file has no energy)" in text.stdout
    info = subprocess.run([str(mfattn_binary), "info", str(path)], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert "model      none: states imported from mfattn.io.write (state space euclidean)" in info.stdout
    assert f"n = {n} (active {n - 2})" in info.stdout


def test_the_import_command_reads_npy_and_npz_as_write_does(mfattn, mfattn_binary, tmp_path):
    rng = np.random.default_rng(4)
    T, R, n, d = 6, 2, 20, 5
    states = rng.normal(size=(T, R, n, d)) * rng.uniform(0.5, 3.0, size=(1, 1, n, 1))
    times = np.array([0.5, 1, 2, 4, 8, 16.0])
    presence = np.r_[np.ones(n - 1), 0.0]
    prompt = np.arange(n) // 10
    reference = tmp_path / "written.h5"
    mfattn.io.write(reference, states, times, labels={"presence": presence, "prompt_id": prompt})
    everyone = tmp_path / "everyone.h5"  # a .npy has no labels: every token present
    mfattn.io.write(everyone, states, times)

    def imported(source: Path, *extra) -> Path:
        out = tmp_path / (source.stem + "_" + source.suffix[1:] + ".h5")
        done = subprocess.run([str(mfattn_binary), "import", str(source), "--out", str(out), *extra],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert f"{T} frames, {n} tokens, d = {d}, {R} replicas, states on R^d" in done.stdout
        return out

    np.savez(tmp_path / "stored.npz", positions=states, times=times, presence=presence, prompt_id=prompt)
    np.savez_compressed(tmp_path / "deflated.npz", states=states, times=times, presence=presence,
                        prompt_id=prompt, notes=np.zeros(3))
    np.save(tmp_path / "plain.npy", states)
    files = [imported(tmp_path / "stored.npz"), imported(tmp_path / "deflated.npz"),
             imported(tmp_path / "plain.npy", "--times", ",".join(map(str, times)))]
    for path in files:
        with h5py.File(everyone if path.name.startswith("plain") else reference) as want, h5py.File(path) as got:
            for group in ("particles/tokens", "particles/tokens_r1"):
                assert np.array_equal(bits(got[f"{group}/position/value"][:]),
                                      bits(want[f"{group}/position/value"][:]))
                assert np.array_equal(got[f"{group}/position/time"][:], times)
            for name in ("n_clusters", "min_inner", "marginal_spread", "norm_mean"):
                assert np.array_equal(bits(got[f"observables/{name}/value"][:]),
                                      bits(want[f"observables/{name}/value"][:])), (path, name)
        if not path.name.startswith("plain"):
            assert np.array_equal(mfattn.load(path).labels["presence"], presence)
    notes = subprocess.run([str(mfattn_binary), "import", str(tmp_path / "deflated.npz"), "--out",
                            str(tmp_path / "again.h5")], capture_output=True, text=True)
    assert "not imported: notes" in notes.stdout
    # float32 states are stored as the float64 of the same numbers.
    np.save(tmp_path / "single.npy", states[:, 0].astype(np.float32))
    single = tmp_path / "single.h5"
    done = subprocess.run([str(mfattn_binary), "import", str(tmp_path / "single.npy"), "--out", str(single)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(mfattn.load(single).positions, states[:, 0].astype(np.float32).astype(float))


def test_unit_rows_are_states_on_the_sphere(mfattn, tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 10, 4))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    assert mfattn.io.write(tmp_path / "unit.h5", x) == "sphere"
    tr = mfattn.load(tmp_path / "unit.h5")
    assert tr.state_space == "sphere" and tr.directions is tr.positions
    assert np.allclose(tr.observables["norm_mean"], 1.0, atol=1e-15)


def test_the_tools_take_an_imported_file(mfattn, tmp_path):
    from mfattn.plot_run import plot_run
    from mfattn.view import read_page_data
    states = encoder_hidden_states(layers=4, n=12, d=3)
    path = tmp_path / "hidden.h5"
    mfattn.io.write(path, states)
    written = plot_run(path, tmp_path / "figs")
    assert written and all(p.stat().st_size > 0 for p in written)
    gif = mfattn.load(path).animate(tmp_path / "hidden.gif", frames=3)
    assert Path(gif).stat().st_size > 0
    view = subprocess.run([sys.executable, str(ANALYSIS_DIR / "view.py"), str(path), "--out",
                           str(tmp_path / "hidden.html")], capture_output=True, text=True,
                          env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"})
    assert view.returncode == 0, view.stderr
    u = states / np.linalg.norm(states, axis=-1, keepdims=True)
    drawn = read_page_data(tmp_path / "hidden.html")["positions"]
    assert np.allclose(drawn, u.astype(np.float32), atol=1e-6)  # the directions, on the sphere


def refused(binary: Path, tmp_path: Path, *args) -> str:
    out = tmp_path / "refused.h5"
    done = subprocess.run([str(binary), "import", *map(str, args), "--out", str(out)], capture_output=True,
                          text=True)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_refusals(mfattn, mfattn_binary, tmp_path):
    x = np.random.default_rng(2).normal(size=(3, 5, 3))
    np.save(tmp_path / "flat.npy", x[0])
    assert "has shape [5, 3]; expected [T, n, d] or [T, R, n, d]" in refused(mfattn_binary, tmp_path,
                                                                            tmp_path / "flat.npy")
    zero = x.copy()
    zero[1, 2] = 0
    np.save(tmp_path / "zero.npy", zero)
    assert "frame 1, token 2: the state is zero and has no direction" in refused(mfattn_binary, tmp_path,
                                                                               tmp_path / "zero.npy")
    nan = x.copy()
    nan[2, 4, 1] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    assert "frame 2, token 4: the state holds a value that is not finite" in refused(
        mfattn_binary, tmp_path, tmp_path / "nan.npy")
    np.save(tmp_path / "good.npy", x)
    assert "time 2 = 1 follows 2" in refused(mfattn_binary, tmp_path, tmp_path / "good.npy", "--times", "0,2,1")
    assert "3 frames" in refused(mfattn_binary, tmp_path, tmp_path / "good.npy", "--times", "0,1")
    (tmp_path / "text.npy").write_text("not numpy\n")
    assert "text.npy" in refused(mfattn_binary, tmp_path, tmp_path / "text.npy")
    np.savez(tmp_path / "two.npz", a=x, b=x)
    assert "several arrays of 3 or 4 axes (a, b); name the states with --array NAME" in refused(
        mfattn_binary, tmp_path, tmp_path / "two.npz")
    assert "--array c:" in refused(mfattn_binary, tmp_path, tmp_path / "two.npz", "--array", "c")
    assert "no such file" in refused(mfattn_binary, tmp_path, tmp_path / "missing.npy").lower()
    assert "--cluster-delta 3" in refused(mfattn_binary, tmp_path, tmp_path / "good.npy", "--cluster-delta", 3)
    # An existing --out is kept untouched.
    kept = tmp_path / "kept.h5"
    kept.write_bytes(b"mine")
    done = subprocess.run([str(mfattn_binary), "import", str(tmp_path / "good.npy"), "--out", str(kept)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--overwrite" in done.stderr and kept.read_bytes() == b"mine"
    # The Python writer: the same rules as ValueError, and FileExistsError.
    with pytest.raises(ValueError, match="'beta' is written by the import itself"):
        mfattn.io.write(tmp_path / "p.h5", x, parameters={"beta": 1.0})
    with pytest.raises(ValueError, match="labels: colour not accepted"):
        mfattn.io.write(tmp_path / "p.h5", x, labels={"colour": np.zeros(5)})
    with pytest.raises(ValueError, match=r"positions: shape \(5, 3\)"):
        mfattn.io.write(tmp_path / "p.h5", x[0])
    with pytest.raises(ValueError, match="presence: token 1 has -1"):
        mfattn.io.write(tmp_path / "p.h5", x, labels={"presence": [1, -1, 1, 1, 1]})
    with pytest.raises(ValueError, match="times: 2 times for 3 frames"):
        mfattn.io.write(tmp_path / "p.h5", x, times=[0, 1])
    with pytest.raises(FileExistsError):
        mfattn.io.write(kept, x)
    assert not (tmp_path / "p.h5").exists() and kept.read_bytes() == b"mine"
    assert json.loads(json.dumps(mfattn.io.write(tmp_path / "p.h5", x, overwrite=True))) == "euclidean"


def test_rows_of_any_scale_and_parameters_as_given(mfattn, tmp_path):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 6, 3))
    x[0, :3] *= 1e-200
    x[1, 3:] *= 1e200
    mfattn.io.write(tmp_path / "scales.h5", x, parameters={"flag": np.bool_(True), "rate": np.float32(0.5),
                                                           "count": np.array(7), "name": "ünïcode",
                                                           "widths": (1, 2.5)})
    tr = mfattn.load(tmp_path / "scales.h5")
    assert np.array_equal(bits(tr.positions), bits(x))
    scale = np.abs(x).max(axis=-1, keepdims=True)
    assert np.allclose(tr.directions, (x / scale) / np.linalg.norm(x / scale, axis=-1, keepdims=True), atol=1e-15)
    expected = directions_observables(x, np.ones(6), 1e-4)
    for name, values in expected.items():
        assert np.allclose(tr.observables[name], values, rtol=1e-14, atol=1e-12), name
    p = tr.parameters
    assert p["flag"] == 1 and p["rate"] == 0.5 and p["count"] == 7 and p["name"] == "ünïcode"
    assert p["widths"] == [1.0, 2.5]
    for bad, match in ((None, "NoneType is not stored"), ("a\0b", "NUL"), (2**70, "64-bit"),
                       ({"a": 1}, "dict is not stored"), ([[1, 2]], "one axis")):
        with pytest.raises(ValueError, match=match):
            mfattn.io.write(tmp_path / "bad.h5", x, parameters={"p": bad})
    with pytest.raises(ValueError, match="at most 255 characters"):
        mfattn.io.write(tmp_path / "bad.h5", x, parameters={"p" * 300: 1})
    with pytest.raises(ValueError, match="does not exist"):
        mfattn.io.write(tmp_path / "missing" / "bad.h5", x)
    assert not (tmp_path / "bad.h5").exists()


def test_option_values_and_inputs_are_named(mfattn_binary, tmp_path):
    np.save(tmp_path / "good.npy", np.random.default_rng(2).normal(size=(3, 5, 3)))
    assert "--cluster-delta abc" in refused(mfattn_binary, tmp_path, tmp_path / "good.npy", "--cluster-delta", "abc")
    line = refused(mfattn_binary, tmp_path, tmp_path / "missing.npy")
    assert f"cannot read {tmp_path / 'missing.npy'}" in line
    assert f"cannot read {tmp_path}" in refused(mfattn_binary, tmp_path, tmp_path)


def test_a_signal_while_the_observables_are_computed_leaves_nothing(mfattn_binary, tmp_path):
    # 4 frames of 4 x 10^4 tokens: 3.2 x 10^9 pairs of observables, seconds of work.
    states = np.random.default_rng(3).normal(size=(4, 40000, 3)).astype(np.float32)
    np.save(tmp_path / "large.npy", states)
    out = tmp_path / "large.h5"
    run = subprocess.Popen([str(mfattn_binary), "import", str(tmp_path / "large.npy"), "--out", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = run.stderr.readline()
        assert "computing the observables of 4 frames of 40000 tokens" in first, first
        run.send_signal(signal.SIGINT)
        stdout, rest = run.communicate(timeout=120)
    finally:
        run.kill()
    if run.returncode == 0:
        pytest.skip("the observables were done before the signal came")
    assert run.returncode == 128 + signal.SIGINT, rest
    assert "mfattn import: interrupted by SIGINT; nothing was written" in rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["large.npy"]
