#!/usr/bin/env python3
"""The outcome table of a folder of runs:

    MPLBACKEND=Agg /usr/bin/python3 analysis/collapse_summary.py FOLDER [--cases] [--figure F.png] [--final-figure F.png]

The code and its --help are the module mfattn.collapse_summary
(analysis/mfattn/collapse_summary.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.collapse_summary import main

if __name__ == "__main__":
    raise SystemExit(main())
