#!/usr/bin/python3
"""Target against realized law of mfattn realize's files:

    /usr/bin/python3 analysis/plot_realization.py FILE.h5 [FILE.h5 ...] --out FIGURE.png

The code and its --help are the module mfattn.plot_realization
(analysis/mfattn/plot_realization.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.plot_realization import main

if __name__ == "__main__":
    raise SystemExit(main())
