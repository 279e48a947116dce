#!/usr/bin/env python3
"""Every figure of the experiments under a data folder:

    MPLBACKEND=Agg /usr/bin/python3 analysis/make_figures.py [--data DIR] [--out DIR]

The code and its --help are the module mfattn.make_figures (analysis/mfattn/make_figures.py),
which this script imports from the folder beside it: nothing needs building or installing."""
from mfattn.make_figures import main

if __name__ == "__main__":
    raise SystemExit(main())
