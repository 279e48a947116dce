#!/usr/bin/env python3
"""The clustered-pair fraction per normalization placement:

    /usr/bin/python3 analysis/plot_normalization.py CURVES.csv --out FIGURE.png

The code and its --help are the module mfattn.plot_normalization
(analysis/mfattn/plot_normalization.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.plot_normalization import main

if __name__ == "__main__":
    raise SystemExit(main())
