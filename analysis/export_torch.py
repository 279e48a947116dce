#!/usr/bin/env python3
"""The --weights file of a saved PyTorch layer:

    /usr/bin/python3 analysis/export_torch.py --heads H [--activation relu|gelu|tanh] STATE_DICT_FILE OUT.h5

The code and its --help are the module mfattn.export_torch_cli
(analysis/mfattn/export_torch_cli.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.export_torch_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
