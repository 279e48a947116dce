#!/usr/bin/env python3
"""The figures and outcome table of a folder of runs:

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_sweep.py DIR [--out DIR2] [--skip-bad]

The code and its --help are the module mfattn.plot_sweep (analysis/mfattn/plot_sweep.py), which
this script imports from the folder beside it: nothing needs building or installing."""
from mfattn.plot_sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
