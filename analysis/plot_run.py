#!/usr/bin/env python3
"""The figures of one run:

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_run.py FILE.h5 --out DIR [--replica R] [--no-trails] [--times T1,T2,...]

The code and its --help are the module mfattn.plot_run (analysis/mfattn/plot_run.py), which this
script imports from the folder beside it: nothing needs building or installing."""
from mfattn.plot_run import main

if __name__ == "__main__":
    raise SystemExit(main())
