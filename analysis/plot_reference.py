#!/usr/bin/python3
"""The figures of the reference experiments:

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_reference.py DATA [--out FIGURES]

The code and its --help are the module mfattn.plot_reference
(analysis/mfattn/plot_reference.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.plot_reference import main

if __name__ == "__main__":
    raise SystemExit(main())
