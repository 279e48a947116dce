"""analysis/export_torch.py loads no code from the file it is given: a crafted pickle runs
nothing (torch.load weights_only=True) and is refused with one line; a pickled module is taken
only with --trust-pickle. A state dict plus --heads (and --activation) gives the weights file
that the module itself gives, for a MultiheadAttention, an encoder layer and an encoder; bad
state dicts and options are refused with one line `export_torch.py: ...` and exit 2, writing no
file. The crafted-pickle and switch tests run the script as a process (/usr/bin/python3); the
refusals call its main() in this process (one torch import), with the same stderr and exit code.
"""
from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import REPO_ROOT

torch = pytest.importorskip("torch")
from mfattn import export_torch_cli as export_torch  # noqa: E402  (the script's module)
from mfattn import io as mfattn_io  # noqa: E402

D, HEADS, WIDTH = 8, 2, 12
SCRIPT = ["/usr/bin/python3", str(REPO_ROOT / "analysis" / "export_torch.py")]


class RunsACommand:
    """Unpickling it runs `touch SENTINEL`, as a crafted file would run anything."""

    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def script(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*SCRIPT, *map(str, args)], capture_output=True, text=True, cwd=str(cwd), timeout=120)


def assert_refused(done_rc: int, stdout: str, stderr: str, out: Path, match: str) -> None:
    assert done_rc == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("export_torch.py: "), stderr
    assert match in lines[0], stderr
    assert stdout == ""
    assert not out.exists() and not Path(f"{out}.part").exists()


def attention(seed: int = 1, **kwargs) -> "torch.nn.MultiheadAttention":
    torch.manual_seed(seed)
    return torch.nn.MultiheadAttention(D, HEADS, **{"bias": False, "dtype": torch.float64, **kwargs}).eval()


def encoder_layer(seed: int, activation: str, dtype=torch.float64) -> "torch.nn.TransformerEncoderLayer":
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=WIDTH, activation=activation, dropout=0.0,
                                             dtype=dtype)
    with torch.no_grad():  # biases of the attention zero (mfattn's heads take none); the MLP's random
        layer.linear1.bias.normal_()
        layer.linear2.bias.normal_()
    return layer.eval()


def encoder(seed: int) -> "torch.nn.TransformerEncoder":
    model = torch.nn.TransformerEncoder(encoder_layer(seed, "gelu"), 2, norm=torch.nn.LayerNorm(D, dtype=torch.float64))
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # the encoder clones its layer: make the two layers differ
        for layer in model.layers:
            for name in ("in_proj_weight",):
                getattr(layer.self_attn, name).normal_()
            for linear in (layer.self_attn.out_proj, layer.linear1, layer.linear2):
                linear.weight.normal_()
            layer.linear1.bias.normal_()
    return model.eval()


def datasets(path: Path) -> dict:
    found: dict = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: found.__setitem__(
            name, (item[()], item.dtype) if isinstance(item, h5py.Dataset) else None))
        for name in ("", *found):
            found["attrs:" + name] = dict((f[name] if name else f).attrs)
    return found


def assert_same_file(a: Path, b: Path) -> None:
    left, right = datasets(a), datasets(b)
    assert left.keys() == right.keys()
    for name, value in left.items():
        if isinstance(value, tuple):
            assert value[1] == right[name][1] and np.array_equal(value[0], right[name][0]), name
        else:
            assert value == right[name], name


# ---------------------------------------------------------------------------------------------
# The defect: a crafted file ran a shell command (torch.load weights_only=False) before being refused.

@pytest.mark.parametrize("options", [[], ["--heads", str(HEADS)]], ids=["plain", "with --heads"])
@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_crafted_pickle_runs_no_code(tmp_path, writer, options):
    sentinel = tmp_path / "SENTINEL"
    payload = {"in_proj_weight": torch.zeros(3 * D, D), "out_proj.weight": RunsACommand(sentinel)}
    if writer == "torch.save":
        torch.save(payload, tmp_path / "evil.pt")
    else:
        with open(tmp_path / "evil.pt", "wb") as f:
            pickle.dump(payload, f)
    done = script(*options, tmp_path / "evil.pt", tmp_path / "out.h5", cwd=tmp_path)
    assert not sentinel.exists(), "the file's code ran"
    assert_refused(done.returncode, done.stdout, done.stderr, tmp_path / "out.h5", "--trust-pickle")
    assert "runs code from the file" in done.stderr and "torch.save(layer.state_dict(), FILE)" in done.stderr


def test_a_torchscript_archive_runs_no_code(tmp_path):
    """torch.load(weights_only=True) of PyTorch < 2.6 hands a TorchScript archive to torch.jit.load,
    which runs the archive's code (here a __setstate__ that prints): the script refuses the archive
    before torch.load sees it."""
    from typing import Tuple

    class Payload(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.zeros(2)

        @torch.jit.export
        def __getstate__(self) -> Tuple[torch.Tensor, bool]:
            return (self.w, self.training)

        @torch.jit.export
        def __setstate__(self, state: Tuple[torch.Tensor, bool]) -> None:
            print("TORCHSCRIPT PAYLOAD RAN")
            self.w = state[0]
            self.training = state[1]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    torch.jit.save(torch.jit.script(Payload()), str(tmp_path / "script.pt"))
    done = script(tmp_path / "script.pt", tmp_path / "out.h5", cwd=tmp_path)
    assert "PAYLOAD RAN" not in done.stdout + done.stderr, "the archive's code ran"
    assert_refused(done.returncode, done.stdout, done.stderr, tmp_path / "out.h5", "a TorchScript archive")
    assert "--trust-pickle" in done.stderr


def test_the_trust_switch_runs_the_files_code(tmp_path):
    """What --help and the docs say of --trust-pickle: the full unpickler runs the file's code (so
    the payload above is live: it is the loader, not the file, that keeps it from running)."""
    sentinel = tmp_path / "SENTINEL"
    torch.save({"out_proj.weight": RunsACommand(sentinel)}, tmp_path / "evil.pt")
    done = script("--trust-pickle", tmp_path / "evil.pt", tmp_path / "out.h5", cwd=tmp_path)
    assert sentinel.exists()
    assert done.returncode == 2 and not (tmp_path / "out.h5").exists()  # then refused: not a state dict


def test_a_pickled_module_needs_the_trust_switch(tmp_path):
    module = encoder_layer(3, "gelu")
    torch.save(module, tmp_path / "layer.pt")
    done = script(tmp_path / "layer.pt", tmp_path / "refused.h5", cwd=tmp_path)
    assert_refused(done.returncode, done.stdout, done.stderr, tmp_path / "refused.h5", "--trust-pickle")
    assert "TransformerEncoderLayer" in done.stderr and "torch.save(layer.state_dict(), FILE)" in done.stderr
    trusted = script("--trust-pickle", tmp_path / "layer.pt", tmp_path / "trusted.h5", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    torch.save(module.state_dict(), tmp_path / "layer_sd.pt")
    safe = script("--heads", HEADS, "--activation", "gelu", tmp_path / "layer_sd.pt", tmp_path / "safe.h5",
                  cwd=tmp_path)
    assert safe.returncode == 0, safe.stderr
    assert "--mlp 12 --mlp-activation gelu" in safe.stdout
    assert safe.stdout.replace("safe.h5", "X") == trusted.stdout.replace("trusted.h5", "X")
    assert_same_file(tmp_path / "safe.h5", tmp_path / "trusted.h5")


# ---------------------------------------------------------------------------------------------
# A state dict gives the module's weights file (in process: main() is the script).

CASES = {
    "attention": (lambda: attention(1), []),
    "attention with its zero biases": (lambda: attention(2, bias=True), []),
    "encoder layer gelu": (lambda: encoder_layer(3, "gelu"), ["--activation", "gelu"]),
    "encoder layer relu float32": (lambda: encoder_layer(4, "relu", torch.float32), ["--activation", "relu"]),
    "encoder layer tanh": (lambda: encoder_layer(5, torch.tanh), ["--activation", "tanh"]),
    "two-layer encoder": (lambda: encoder(6), ["--activation", "gelu"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_state_dict_gives_the_modules_weights_file(tmp_path, capsys, case):
    make, options = CASES[case]
    module = make()
    expected = mfattn_io.export_torch(module, tmp_path / "module.h5")
    torch.save(module.state_dict(), tmp_path / "state.pt")
    assert export_torch.main(["--heads", str(HEADS), *options, str(tmp_path / "state.pt"),
                              str(tmp_path / "state.h5")]) == 0
    printed = capsys.readouterr()
    assert printed.err == ""
    assert_same_file(tmp_path / "state.h5", tmp_path / "module.h5")
    assert f"--heads {HEADS} --head-dim {D // HEADS}" in printed.out
    if "mlp" in expected:
        assert f"--mlp {WIDTH} --mlp-activation {expected['mlp_activation']}" in printed.out
    assert ("--layer-time T  (2 layers" in printed.out) == (case == "two-layer encoder")


# ---------------------------------------------------------------------------------------------
# Refusals: one line, exit 2, no file.

def mha_state() -> dict:
    return dict(attention(1).state_dict())


def layer_state() -> dict:
    return dict(encoder_layer(3, "relu").state_dict())


def with_(state: dict, **changes) -> dict:
    state = dict(state)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            del state[key]
        else:
            state[key] = value
    return state


REFUSALS = {
    "no --heads": (mha_state, [], "give --heads H"),
    "heads not dividing d": (mha_state, ["--heads", "3"], "--heads 3 does not divide the embedding dimension 8"),
    "heads zero": (mha_state, ["--heads", "0"], "--heads '0' is not a positive integer"),
    "no --activation": (layer_state, ["--heads", "2"], "give --activation relu|gelu|tanh"),
    "activation for attention": (mha_state, ["--heads", "2", "--activation", "relu"], "--activation is for an encoder layer"),
    "unknown activation": (layer_state, ["--heads", "2", "--activation", "swish"], "is not relu, gelu or tanh"),
    "a Linear's state dict": (lambda: dict(torch.nn.Linear(3, 3).state_dict()), ["--heads", "1"],
                              "not the state dict of a torch.nn.MultiheadAttention"),
    "empty state dict": (dict, ["--heads", "1"], "not the state dict of a torch.nn.MultiheadAttention"),
    "non-tensor value": (lambda: with_(mha_state(), step=3), ["--heads", "2"], "step holds a value of type int, not a tensor"),
    "integer tensor": (lambda: with_(mha_state(), in_proj_weight=torch.zeros(3 * D, D, dtype=torch.int64)),
                       ["--heads", "2"], "not a floating-point one"),
    "a list of tensors": (lambda: [torch.zeros(3)], ["--heads", "2"], "holds a list, not a state dict"),
    "unexpected key": (lambda: with_(mha_state(), extra=torch.zeros(2)), ["--heads", "2"], "unexpected key extra"),
    "missing out_proj": (lambda: with_(mha_state(), out_proj__weight=None), ["--heads", "2"], "has no out_proj.weight"),
    "missing linear2": (lambda: with_(layer_state(), linear2__weight=None), ["--heads", "2", "--activation", "relu"],
                        "has no linear2.weight"),
    "wrong shape": (lambda: with_(mha_state(), out_proj__weight=torch.zeros(D, D + 1, dtype=torch.float64)),
                    ["--heads", "2"], "out_proj.weight has shape [8, 9], not [8, 8]"),
    "in_proj not [3d, d]": (lambda: with_(mha_state(), in_proj_weight=torch.zeros(D, D)), ["--heads", "2"],
                            "in_proj_weight has shape [8, 8], not [3 d, d]"),
    "kdim unlike d": (lambda: dict(torch.nn.MultiheadAttention(D, HEADS, kdim=4, vdim=4, bias=False).state_dict()),
                      ["--heads", "2"], "kdim and vdim must equal embed_dim"),
    "encoder layers 0 and 2": (lambda: {f"layers.{i}.{k}": v for i in (0, 2) for k, v in layer_state().items()},
                               ["--heads", "2", "--activation", "relu"], "numbered [0, 2], not 0, 1, ..."),
    "nonzero attention bias": (lambda: with_(dict(attention(1, bias=True).state_dict()),
                                             in_proj_bias=torch.ones(3 * D, dtype=torch.float64)),
                               ["--heads", "2"], "in_proj_bias is not zero"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_bad_state_dict_or_option_is_refused(tmp_path, capsys, case):
    make, options, message = REFUSALS[case]
    torch.save(make(), tmp_path / "state.pt")
    rc = export_torch.main([*options, str(tmp_path / "state.pt"), str(tmp_path / "out.h5")])
    printed = capsys.readouterr()
    assert_refused(rc, printed.out, printed.err, tmp_path / "out.h5", message)


@pytest.mark.parametrize("argv, message", [
    (["{dir}/state.pt"], "takes two file names"),
    (["--heads", "2", "--frobnicate", "{dir}/state.pt", "{dir}/out.h5"], "unknown option --frobnicate"),
    (["--heads"], "--heads needs a value"),
    (["--heads", "2", "{dir}/missing.pt", "{dir}/out.h5"], "missing.pt: no such file"),
    (["--heads", "2", "{dir}/text.pt", "{dir}/out.h5"], "not a zip archive as torch.save writes"),
    (["--heads", "2", "{dir}/empty.pt", "{dir}/out.h5"], "not a zip archive as torch.save writes"),
    (["--heads", "2", "{dir}/legacy.pt", "{dir}/out.h5"], "but a plain pickle or the legacy format"),
    (["--heads", "2", "{dir}/truncated.pt", "{dir}/out.h5"], "not a readable torch.save archive"),
    (["--heads", "2", "{dir}/module.pt", "{dir}/out.h5"], "Unsupported class torch.nn.modules.activation.MultiheadAttention"),
    (["--trust-pickle", "--heads", "2", "{dir}/module.pt", "{dir}/out.h5"], "drop --heads and --activation"),
    (["--trust-pickle", "{dir}/linear.pt", "{dir}/out.h5"], "takes a torch.nn.MultiheadAttention"),
    (["--heads", "2", "{dir}/state.pt", "{dir}/no/such/dir/out.h5"], "cannot be written"),
])
def test_bad_command_lines_and_files_are_refused(tmp_path, capsys, argv, message):
    torch.save(mha_state(), tmp_path / "state.pt")
    torch.save(attention(1), tmp_path / "module.pt")
    torch.save(torch.nn.Linear(3, 3), tmp_path / "linear.pt")
    (tmp_path / "text.pt").write_text("not a torch file\n")
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save(mha_state(), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "truncated.pt").write_bytes((tmp_path / "state.pt").read_bytes()[:200])
    args = [a.format(dir=tmp_path) for a in argv]
    rc = export_torch.main(args)
    printed = capsys.readouterr()
    assert_refused(rc, printed.out, printed.err, Path(args[-1]) if args[-1].endswith(".h5") else tmp_path / "out.h5",
                   message)


def test_help_names_the_options_and_what_the_switch_means(capsys):
    assert export_torch.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "export_torch.py --heads H [--activation relu|gelu|tanh] STATE_DICT_FILE OUT.h5" in text
    assert "export_torch.py --trust-pickle MODULE_FILE OUT.h5" in text
    assert "weights_only=True" in text and "RUNS ARBITRARY CODE FROM THE FILE" in text
    assert "a TorchScript archive" in text and "--heads H num_heads" in text and "--activation A" in text
    assert "only for files you made yourself" in text
