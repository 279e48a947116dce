"""Writes the weights file of ``mfattn run --weights`` from a saved PyTorch layer.

    /usr/bin/python3 analysis/export_torch.py --heads H [--activation relu|gelu|tanh] STATE_DICT_FILE OUT.h5
    /usr/bin/python3 analysis/export_torch.py --trust-pickle MODULE_FILE OUT.h5

STATE_DICT_FILE is what ``torch.save(layer.state_dict(), STATE_DICT_FILE)`` wrote for a
torch.nn.MultiheadAttention, a torch.nn.TransformerEncoderLayer or a torch.nn.TransformerEncoder
(its layers on a leading layer axis). The kind of layer is read from the keys (in_proj_weight:
MultiheadAttention; self_attn.* and linear1.*: encoder layer; layers.0.*: encoder), its sizes
from the tensors' shapes, and what a state dict does not carry from the options:

  --heads H          num_heads of the attention (required; H divides the embedding dimension)
  --activation A     the encoder layers' activation: relu, gelu (erf form) or tanh (required
                     for an encoder layer or encoder; refused for a MultiheadAttention)
  --trust-pickle     load the file with Python's full unpickler (torch.load(...,
                     weights_only=False)) to take a whole module saved with
                     ``torch.save(layer, MODULE_FILE)`` (or a file in a format refused below).
                     UNPICKLING RUNS ARBITRARY CODE FROM THE FILE: use it only for files you
                     made yourself. A module carries its heads and activation: --heads and
                     --activation are refused with it.
  -h, --help         this text

Without --trust-pickle the file is read with torch.load(..., weights_only=True), which builds
tensors and plain containers only and runs no code from the file, and only in the zip format
torch.save writes (PyTorch >= 1.6): a TorchScript archive (which torch before 2.6 hands to
torch.jit.load, running its code, even with weights_only=True), a plain pickle and the legacy
format are refused before torch.load sees them. Torch's weights-only reader had flaws of its own
until torch 2.10: for a file from someone else, prefer a current torch.

Dropout, the layer norms (norm1, norm2, norm_first, eps) and batch_first do not change the weights
file. add_zero_attn is not in a state dict: the rebuilt layer has none (do not export the state
dict of a layer built with it; the module itself is refused). Prints the options that run the
weights as PyTorch computes them (beta = 1 / sqrt(head_dim), softmax attention, plain values);
the file is the one ``mfattn.export_torch(module, path)`` in the Python module writes from the
layer itself. Bad input (a file or layer it does not take, a missing or wrong option) exits 2
with one line ``export_torch.py: <what>`` on stderr and writes no OUT.h5 (mfattn.cli).
"""
import os
import pickle
import re
import sys
import warnings

from . import io as mfattn_io
from .cli import BadInput, script

PROGRAM = "export_torch.py"
ACTIVATIONS = ("relu", "gelu", "tanh")
SAFE_ALTERNATIVE = ("save the weights with torch.save(layer.state_dict(), FILE) and give --heads "
                    "(and --activation for an encoder layer)")
TRUST_HINT = "or pass --trust-pickle (which runs code from the file) only for a file you made yourself"


class Refused(BadInput):
    """Bad input: main prints ``export_torch.py: <message>`` and exits 2."""


def one_line(text) -> str:
    return re.sub(r"\s+", " ", str(text)).strip()


def error_text(error: Exception) -> str:
    """``Kind: message`` of an exception, on one line."""
    text = one_line(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def parse(argv: list[str]) -> dict:
    """The options and the two file names; Refused for anything else."""
    options: dict = {"heads": None, "activation": None, "trust_pickle": False, "files": []}
    words = list(argv)
    while words:
        word = words.pop(0)
        if word == "--":
            options["files"] += words
            break
        name, eq, inline = word.partition("=")
        if name in ("--heads", "--activation"):
            if not eq:
                if not words:
                    raise Refused(f"{name} needs a value")
                inline = words.pop(0)
            key = name[2:]
            if options[key] is not None:
                raise Refused(f"{name} given twice")
            if key == "heads":
                if not re.fullmatch(r"[0-9]+", inline) or int(inline) < 1:
                    raise Refused(f"--heads {inline!r} is not a positive integer")
                options["heads"] = int(inline)
            else:
                if inline not in ACTIVATIONS:
                    raise Refused(f"--activation {inline!r} is not relu, gelu or tanh")
                options["activation"] = inline
        elif word == "--trust-pickle":
            options["trust_pickle"] = True
        elif word.startswith("-") and word != "-":
            raise Refused(f"unknown option {word} (see --help)")
        else:
            options["files"].append(word)
    if len(options["files"]) != 2:
        raise Refused(f"takes two file names, the state dict file and OUT.h5; got {len(options['files'])} (see --help)")
    return options


def _refuse_unsafe_container(file, path: str) -> None:
    """Refuse what torch.load(weights_only=True) would not keep to tensors: PyTorch before 2.6 sends
    a TorchScript archive to torch.jit.load, which runs its code (pytorch/pytorch#143326,
    CVE-2025-32434), and reads the legacy formats by paths that 2.6 closed. Only a zip archive as
    torch.save writes it (PyTorch >= 1.6) is taken, checked with torch's own zip reader and test."""
    import torch

    start = file.tell()
    is_zip = file.read(4) == b"PK\x03\x04"  # what torch.serialization._is_zipfile tests
    file.seek(start)
    if not is_zip:
        raise Refused(f"{path}: not a zip archive as torch.save writes (PyTorch >= 1.6) but a plain pickle or "
                      f"the legacy format; {SAFE_ALTERNATIVE}, {TRUST_HINT}")
    try:
        records = torch._C.PyTorchFileReader(file).get_all_records()
    except Exception as error:
        raise Refused(f"{path}: not a readable torch.save archive ({error_text(error)})") from None
    finally:
        file.seek(start)
    if "constants.pkl" in records or any(r.startswith("code/") for r in records):  # torch's _is_torchscript_zip
        raise Refused(f"{path}: a TorchScript archive (torch.jit.save), whose loading runs its TorchScript code; "
                      f"{SAFE_ALTERNATIVE}, {TRUST_HINT}")


def load(path: str, trust_pickle: bool):
    """torch.load of the file: weights_only unless trust_pickle."""
    import torch

    if not os.path.isfile(path):
        raise Refused(f"{path}: no such file")
    with open(path, "rb") as file, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warnings (TorchScript dispatch, storages): one line on error
        if trust_pickle:
            try:
                return torch.load(file, map_location="cpu", weights_only=False)
            except Exception as error:  # torch raises many kinds for a file that is not a saved object
                raise Refused(f"{path}: cannot be loaded by torch.load ({error_text(error)})") from None
        _refuse_unsafe_container(file, path)  # the same open file goes to torch.load: no swap in between
        try:
            return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            # torch's weights-only unpickler met a class it does not build (a pickled module, or anything
            # else: building it could run code) or an opcode it does not take. Nothing from the file has run.
            reason = one_line(error)
            if "WeightsUnpickler error:" in reason:
                reason = reason.split("WeightsUnpickler error:", 1)[-1].strip()
            raise Refused(f"{path}: holds pickled Python objects, not only tensors ({reason}), whose unpickling "
                          f"would run code from the file; {SAFE_ALTERNATIVE}, {TRUST_HINT}") from None
        except Exception as error:
            raise Refused(f"{path}: cannot be loaded by torch.load(weights_only=True) ({error_text(error)})") from None


def _check_tensors(state: dict, path: str) -> None:
    import torch

    for key, value in state.items():
        if not isinstance(key, str):
            raise Refused(f"{path}: key {key!r} of the state dict is not a string")
        if not isinstance(value, torch.Tensor):
            raise Refused(f"{path}: the state dict's {key} holds a value of type {type(value).__name__}, not a tensor")
        if not value.is_floating_point():
            raise Refused(f"{path}: the state dict's {key} is a {value.dtype} tensor, not a floating-point one")


def _rebuild_attention(state: dict, heads: int, where: str, prefix: str = ""):
    """A torch.nn.MultiheadAttention (float64) holding the state dict's weights."""
    import torch

    if "q_proj_weight" in state or "k_proj_weight" in state or "v_proj_weight" in state:
        raise Refused(f"{where}: {prefix}q_proj_weight/k_proj_weight/v_proj_weight: kdim and vdim must equal "
                      "embed_dim (tokens attend to themselves)")
    for key in ("in_proj_weight", "out_proj.weight"):
        if key not in state:
            raise Refused(f"{where}: the attention has no {prefix}{key}")
    weight = state["in_proj_weight"]
    if weight.ndim != 2 or weight.shape[0] != 3 * weight.shape[1] or weight.shape[1] < 1:
        raise Refused(f"{where}: {prefix}in_proj_weight has shape {list(weight.shape)}, not [3 d, d]")
    d = weight.shape[1]
    if d % heads:
        raise Refused(f"--heads {heads} does not divide the embedding dimension {d} of {where}")
    return torch.nn.MultiheadAttention(d, heads, bias="in_proj_bias" in state,
                                       add_bias_kv="bias_k" in state or "bias_v" in state,
                                       dtype=torch.float64)


def _rebuild_encoder_layer(state: dict, heads: int, activation: str, where: str, prefix: str = ""):
    import torch

    attention = {k[len("self_attn."):]: v for k, v in state.items() if k.startswith("self_attn.")}
    _rebuild_attention(attention, heads, where, prefix + "self_attn.")  # its checks
    d = attention["in_proj_weight"].shape[1]
    for key in ("linear1.weight", "linear2.weight"):
        if key not in state:
            raise Refused(f"{where}: the encoder layer has no {prefix}{key}")
    width = state["linear1.weight"].shape[0] if state["linear1.weight"].ndim == 2 else 0
    function = {"relu": "relu", "gelu": "gelu", "tanh": torch.tanh}[activation]
    return torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=max(width, 1), dropout=0.0,
                                            activation=function, dtype=torch.float64)


def _load_into(module, state: dict, where: str, prefix: str = ""):
    """module with the state dict's tensors (float64, exactly: every float dtype widens exactly). A
    bias the state dict lacks (a layer built with bias=False) is zero, as export_torch reads a None
    bias."""
    import torch

    expected = module.state_dict()
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise Refused(f"{where}: unexpected key {prefix}{unexpected[0]} for a "
                      f"torch.nn.{type(module).__name__}")
    full = dict(state)
    for key in sorted(set(expected) - set(state)):
        if not key.endswith("bias"):
            raise Refused(f"{where}: the state dict has no {prefix}{key}")
        full[key] = torch.zeros_like(expected[key])
    for key, value in full.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise Refused(f"{where}: {prefix}{key} has shape {list(value.shape)}, not {list(expected[key].shape)}")
    module.load_state_dict(full, strict=True)
    return module.eval()


def rebuild(state: dict, heads: int | None, activation: str | None, path: str):
    """The module (or list of encoder layers) a state dict of a MultiheadAttention,
    TransformerEncoderLayer or TransformerEncoder comes from."""
    _check_tensors(state, path)
    keys = set(state)
    if "in_proj_weight" in keys or "out_proj.weight" in keys or "q_proj_weight" in keys:
        kind = "torch.nn.MultiheadAttention"
    elif any(k.startswith("self_attn.") for k in keys) and any(k.startswith("linear1.") for k in keys):
        kind = "torch.nn.TransformerEncoderLayer"
    elif any(k.startswith("layers.0.") for k in keys):
        kind = "torch.nn.TransformerEncoder"
    else:
        shown = ", ".join(sorted(keys)[:4]) + (", ..." if len(keys) > 4 else "") if keys else "no keys"
        raise Refused(f"{path}: not the state dict of a torch.nn.MultiheadAttention (in_proj_weight, "
                      f"out_proj.weight), TransformerEncoderLayer (self_attn.*, linear1.*) or TransformerEncoder "
                      f"(layers.0.*): {shown}")
    if heads is None:
        raise Refused(f"{path} holds the state dict of a {kind}: give --heads H (its num_heads, which a "
                      "state dict does not carry)")
    if kind == "torch.nn.MultiheadAttention":
        if activation is not None:
            raise Refused(f"--activation is for an encoder layer; {path} holds a torch.nn.MultiheadAttention")
        return _load_into(_rebuild_attention(state, heads, path), state, path)
    if activation is None:
        raise Refused(f"{path} holds the state dict of a {kind}: give --activation relu|gelu|tanh (which a "
                      "state dict does not carry)")
    if kind == "torch.nn.TransformerEncoderLayer":
        return _load_into(_rebuild_encoder_layer(state, heads, activation, path), state, path)
    # a TransformerEncoder: layers.<l>.*, l = 0, 1, ..., and its final norm.* (not read, as export_torch
    # does not read a TransformerEncoder's norm)
    layers: dict[int, dict] = {}
    for key, value in state.items():
        match = re.fullmatch(r"layers\.([0-9]+)\.(.+)", key)
        if match:
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = value
        elif key not in ("norm.weight", "norm.bias"):
            raise Refused(f"{path}: unexpected key {key} for a torch.nn.TransformerEncoder")
    if sorted(layers) != list(range(len(layers))):
        raise Refused(f"{path}: the encoder's layers are numbered {sorted(layers)}, not 0, 1, ...")
    modules = []
    for index in range(len(layers)):
        prefix = f"layers.{index}."
        module = _rebuild_encoder_layer(layers[index], heads, activation, path, prefix)
        modules.append(_load_into(module, layers[index], path, prefix))
    return modules


@script(PROGRAM)
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return
    options = parse(argv)
    path, out = options["files"]
    loaded = load(path, options["trust_pickle"])
    import torch

    if isinstance(loaded, dict):
        module = rebuild(loaded, options["heads"], options["activation"], path)
    elif not options["trust_pickle"]:  # weights_only builds tensors and containers only
        raise Refused(f"{path} holds a {type(loaded).__name__}, not a state dict: {SAFE_ALTERNATIVE}")
    elif isinstance(loaded, (torch.nn.Module, list, tuple)):  # export_torch checks what it is
        if options["heads"] is not None or options["activation"] is not None:
            raise Refused(f"{path} holds a pickled {type(loaded).__name__}, which carries its own "
                          "heads and activation: drop --heads and --activation")
        module = loaded
    else:
        raise Refused(f"{path} holds a {type(loaded).__name__}, neither a torch.nn module nor a state dict")
    try:
        written = mfattn_io.export_torch(module, out)
    except ValueError as error:
        raise Refused(one_line(error)) from None
    except OSError as error:
        raise Refused(f"{out}: cannot be written ({one_line(error)})") from None
    words = [f"--{k.replace('_', '-')} {float(v)!r}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
             for k, v in written.items()]
    layers = mfattn_io.weights_file_layers(out)
    print(f"wrote {out}; run it with: mfattn run {' '.join(words)}"
          + (f" --layer-time T  ({layers} layers: layer l acts on [l T, (l + 1) T))" if layers > 1 else ""))


if __name__ == "__main__":
    raise SystemExit(main())
