"""A whole layer against PyTorch (docs/model.md, section 2b): a random nn.MultiheadAttention and
nn.TransformerEncoderLayer exported with mfattn.export_torch give mfattn's velocity equal to the
tangent projection of PyTorch's own output, and a two-layer weights file with --layer-time
equals two runs chained by --init-file. PyTorch is Debian's python3-torch, in float64."""
from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest

torch = pytest.importorskip("torch")

D, HEADS, N = 16, 4, 50


def sphere_state(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def tangent(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return y - np.sum(x * y, axis=1, keepdims=True) * x


def random_attention(seed: int) -> "torch.nn.MultiheadAttention":
    torch.manual_seed(seed)
    return torch.nn.MultiheadAttention(D, HEADS, bias=False, dtype=torch.float64)


def random_encoder(seed: int, activation: str) -> "torch.nn.TransformerEncoderLayer":
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=24, activation=activation,
                                             dropout=0.0, dtype=torch.float64)
    with torch.no_grad():  # mfattn's heads take no attention bias; the MLP keeps its biases
        layer.self_attn.in_proj_bias.zero_()
        layer.self_attn.out_proj.bias.zero_()
        layer.linear1.bias.normal_()
        layer.linear2.bias.normal_()
    return layer.eval()


def torch_attention(attention, x: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(x)[:, None, :]  # (L, N = 1, E)
    with torch.no_grad():
        out, _ = attention(t, t, t, need_weights=False)
    return out[:, 0, :].numpy()


def torch_feed_forward(layer, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return layer.linear2(layer.activation(layer.linear1(torch.from_numpy(x)))).numpy()


def test_multihead_attention_velocity_is_pytorchs(mfattn, tmp_path):
    attention = random_attention(1)
    options = mfattn.export_torch(attention, tmp_path / "mha.h5")
    assert options["heads"] == HEADS and options["head_dim"] == D // HEADS
    assert options["beta"] == pytest.approx(1 / np.sqrt(D // HEADS), rel=1e-15)
    x = sphere_state(N, D, 2)
    v = mfattn.Model(n=N, threads=1, **options).velocity(x)
    expected = tangent(x, torch_attention(attention, x))
    np.testing.assert_allclose(v, expected, rtol=0, atol=1e-12)
    # The reference backend computes the same field pair by pair.
    v_ref = mfattn.Model(n=N, backend="reference", **options).velocity(x)
    np.testing.assert_allclose(v_ref, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_velocity_is_attention_plus_feed_forward(mfattn, tmp_path, activation):
    layer = random_encoder(3, activation)
    options = mfattn.export_torch(layer, tmp_path / "layer.h5")
    assert options["mlp"] == 24 and options["mlp_activation"] == activation
    x = sphere_state(N, D, 4)
    v = mfattn.Model(n=N, threads=1, **options).velocity(x)
    expected = tangent(x, torch_attention(layer.self_attn, x) + torch_feed_forward(layer, x))
    np.testing.assert_allclose(v, expected, rtol=0, atol=1e-12)
    with h5py.File(tmp_path / "layer.h5") as f:
        assert f["mlp"].attrs["activation"] == activation
        assert f["attention/query"].shape == (HEADS, D // HEADS, D)
        assert f["attention/output"].shape == (D, D)


def test_attention_bias_is_refused(mfattn, tmp_path):
    torch.manual_seed(5)
    attention = torch.nn.MultiheadAttention(D, HEADS, bias=True, dtype=torch.float64)
    with torch.no_grad():
        attention.in_proj_bias.normal_()
    with pytest.raises(ValueError, match="in_proj_bias is not zero"):
        mfattn.export_torch(attention, tmp_path / "bias.h5")
    assert not (tmp_path / "bias.h5").exists()


def zeroed_bias_kv(attention):
    with torch.no_grad():
        attention.bias_k.zero_()
        attention.bias_v.zero_()
    return attention


@pytest.mark.parametrize("make, message", [
    (lambda: torch.nn.MultiheadAttention(D, HEADS, bias=False, add_zero_attn=True, dtype=torch.float64),
     "add_zero_attn"),
    # Zero bias_k and bias_v are still an extra key and value: PyTorch's output moved by 0.1.
    (lambda: zeroed_bias_kv(torch.nn.MultiheadAttention(D, HEADS, bias=False, add_bias_kv=True, dtype=torch.float64)),
     "add_bias_kv"),
    (lambda: torch.nn.TransformerEncoderLayer(D, HEADS, 24, dropout=0.0, activation=torch.nn.GELU(approximate="tanh"),
                                              dtype=torch.float64), r"is not relu, gelu \(erf form\) or tanh"),
    (lambda: torch.nn.TransformerEncoderLayer(D, HEADS, 24, dropout=0.0, activation=torch.nn.functional.leaky_relu,
                                              dtype=torch.float64), r"is not relu, gelu \(erf form\) or tanh"),
])
def test_modules_that_differ_from_the_flow_are_refused(mfattn, tmp_path, make, message):
    module = make()
    if isinstance(module, torch.nn.TransformerEncoderLayer):
        with torch.no_grad():
            module.self_attn.in_proj_bias.zero_()
            module.self_attn.out_proj.bias.zero_()
    with pytest.raises(ValueError, match=message):
        mfattn.export_torch(module, tmp_path / "w.h5")
    assert not (tmp_path / "w.h5").exists()


def test_two_layer_file_equals_two_chained_runs(mfattn, run_mfattn, tmp_path):
    layers = [random_encoder(6, "gelu"), random_encoder(7, "gelu")]
    both = mfattn.export_torch(layers, tmp_path / "both.h5")
    assert mfattn.io.weights_file_layers(tmp_path / "both.h5") == 2
    first = mfattn.export_torch(layers[0], tmp_path / "first.h5")
    second = mfattn.export_torch(layers[1], tmp_path / "second.h5")

    def words(options: dict) -> list:
        return [w for k, v in options.items() for w in (f"--{k.replace('_', '-')}", v)]

    common = ["--n", 24, "--integrator", "rk4", "--dt", 0.01, "--save-every", 0.25]
    chained = run_mfattn(*common, *words(both), "--layer-time", 0.5, "--horizon", 1.0, out="chained.h5")
    a = run_mfattn(*common, *words(first), "--horizon", 0.5, out="a.h5")
    b = run_mfattn(*common, *words(second), "--horizon", 0.5, "--init", "file", "--init-file", a, out="b.h5")
    with h5py.File(chained) as f, h5py.File(b) as g:
        end = f["particles/tokens/position/value"][-1]
        assert f["particles/tokens/attention_matrices/layer_start"][:].tolist() == [0.0, 0.5]
        assert f["particles/tokens/attention_matrices/mlp_w1"].shape == (2, 24, D)
        np.testing.assert_allclose(end, g["particles/tokens/position/value"][-1], rtol=0, atol=1e-13)
        assert np.abs(end - f["particles/tokens/position/value"][0]).max() > 0.05  # it moved


def test_export_command_line(tmp_path):
    """The script takes a state dict (loaded with weights_only=True) plus --heads and --activation;
    a pickled module only with --trust-pickle (tests/python/test_faults_export_torch.py)."""
    layer = random_encoder(8, "relu")
    torch.save(layer.state_dict(), tmp_path / "layer.pt")
    script = ["/usr/bin/python3", "analysis/export_torch.py"]
    root = str(__import__("conftest").REPO_ROOT)
    done = subprocess.run([*script, "--heads", str(HEADS), "--activation", "relu", str(tmp_path / "layer.pt"),
                           str(tmp_path / "w.h5")], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    assert "--heads 4 --head-dim 4 --beta 0.5 --kernel sa --values plain" in done.stdout
    assert "--mlp 24 --mlp-activation relu" in done.stdout
    torch.save(layer, tmp_path / "module.pt")
    done = subprocess.run([*script, "--trust-pickle", str(tmp_path / "module.pt"), str(tmp_path / "m.h5")],
                          capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "w.h5") as f, h5py.File(tmp_path / "m.h5") as g:
        for name in ("attention/query", "attention/key", "attention/value", "attention/output",
                     "mlp/w1", "mlp/b1", "mlp/w2", "mlp/b2"):
            assert np.array_equal(f[name][()], g[name][()]), name
    torch.save(torch.nn.Linear(3, 3), tmp_path / "linear.pt")
    done = subprocess.run([*script, "--trust-pickle", str(tmp_path / "linear.pt"), str(tmp_path / "x.h5")],
                          capture_output=True, text=True, cwd=root)
    assert done.returncode == 2 and "takes a torch.nn.MultiheadAttention" in done.stderr
    assert not (tmp_path / "x.h5").exists()


def write_weights(path, **arrays):
    with h5py.File(path, "w") as f:
        for name, value in arrays.items():
            if name == "activation":
                f.require_group("mlp").attrs["activation"] = value
            else:
                f[name] = value
    return path


@pytest.mark.parametrize("case, arrays, extra, message", [
    ("wrong shape", {"attention/query": np.zeros((2, 4, 8)), "attention/key": np.zeros((2, 4, 8)),
                     "attention/value": np.zeros((2, 4, 8)), "attention/output": np.zeros((8, 8))},
     ["--heads", "2", "--head-dim", "3"],
     "/attention/query is [2, 4, 8]; expected [2, 3, 8] or [L, 2, 3, 8] from --heads 2 --head-dim 3 --d 8"),
    ("missing output", {"attention/query": np.zeros((1, 8, 8)), "attention/key": np.zeros((1, 8, 8)),
                        "attention/value": np.zeros((1, 8, 8))}, [],
     "/attention/output is missing"),
    ("not finite", {"mlp/w1": np.full((3, 8), np.nan), "mlp/b1": np.zeros(3), "mlp/w2": np.zeros((8, 3)),
                    "mlp/b2": np.zeros(8)}, ["--mlp", "3"], "/mlp/w1 holds a number that is not finite"),
    ("float32", {"mlp/w1": np.zeros((3, 8), np.float32), "mlp/b1": np.zeros(3), "mlp/w2": np.zeros((8, 3)),
                 "mlp/b2": np.zeros(8)}, ["--mlp", "3"], "/mlp/w1 must be float64"),
    ("activation", {"mlp/w1": np.zeros((3, 8)), "mlp/b1": np.zeros(3), "mlp/w2": np.zeros((8, 3)),
                    "mlp/b2": np.zeros(8), "activation": "gelu"}, ["--mlp", "3"],
     "--mlp-activation relu: the --weights file's /mlp says activation gelu"),
    ("layers without time", {"mlp/w1": np.zeros((2, 3, 8)), "mlp/b1": np.zeros((2, 3)), "mlp/w2": np.zeros((2, 8, 3)),
                             "mlp/b2": np.zeros((2, 8)), "activation": "relu"}, ["--mlp", "3"],
     "holds 2 layers: give --layer-time T"),
    ("horizon past the layers", {"mlp/w1": np.zeros((2, 3, 8)), "mlp/b1": np.zeros((2, 3)),
                                 "mlp/w2": np.zeros((2, 8, 3)), "mlp/b2": np.zeros((2, 8)), "activation": "relu"},
     ["--mlp", "3", "--layer-time", "0.5", "--horizon", "2"],
     "--horizon 2: the --weights file's 2 layers of --layer-time 0.5 end at t = 1"),
    ("empty", {"other": np.zeros(3)}, [], "holds neither /attention nor /mlp"),
])
def test_bad_weights_files_are_refused_before_the_run(mfattn_binary, tmp_path, case, arrays, extra, message):
    weights = write_weights(tmp_path / "w.h5", **arrays)
    out = tmp_path / "run.h5"
    done = subprocess.run([str(mfattn_binary), "run", "--n", "8", "--d", "8", "--weights", str(weights), *extra,
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 2, (case, done.stderr)
    assert message in done.stderr, (case, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists() and not list(tmp_path.glob("run.h5*"))
