#!/usr/bin/env python3
"""A density file's figure, against a particle run:

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_meanfield.py DENSITY.h5 [--run RUN.h5] [--out FIG.png]

The code and its --help are the module mfattn.plot_meanfield
(analysis/mfattn/plot_meanfield.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.plot_meanfield import main

if __name__ == "__main__":
    raise SystemExit(main())
