#!/usr/bin/env python3
"""Writes the weights file of ``mfattn run --weights`` from a saved PyTorch layer.

    /usr/bin/python3 analysis/export_torch.py MODULE_FILE OUT.h5

MODULE_FILE is what ``torch.save(layer, MODULE_FILE)`` wrote: a torch.nn.MultiheadAttention, a
torch.nn.TransformerEncoderLayer or a torch.nn.TransformerEncoder (its layers on a leading layer
axis). Prints the options that run it as PyTorch computes it (beta = 1 / sqrt(head_dim), softmax
attention, plain values). The same as ``mfattn.export_torch(module, path)`` in the Python module.
Exit 2 with one line for a module it does not take.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mfattn_io  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(argv) != 1 else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    import torch

    module_file, out = argv
    try:
        try:  # torch >= 1.13 takes weights_only; a saved module needs the full unpickler
            module = torch.load(module_file, weights_only=False)
        except TypeError:
            module = torch.load(module_file)
    except Exception as error:  # torch raises many kinds for a file that is not a saved module
        print(f"export_torch.py: {module_file}: cannot be loaded by torch.load ({error})", file=sys.stderr)
        return 2
    try:
        options = mfattn_io.export_torch(module, out)
    except ValueError as error:
        print(f"export_torch.py: {error}", file=sys.stderr)
        return 2
    words = [f"--{k.replace('_', '-')} {float(v)!r}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
             for k, v in options.items()]
    layers = mfattn_io.weights_file_layers(out)
    print(f"wrote {out}; run it with: mfattn run {' '.join(words)}"
          + (f" --layer-time T  ({layers} layers: layer l acts on [l T, (l + 1) T))" if layers > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
