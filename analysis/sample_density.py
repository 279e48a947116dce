#!/usr/bin/env python3
"""Token positions drawn from a density file:

    /usr/bin/python3 analysis/sample_density.py DENSITY.h5 --n N --seed S [--frame F] > x0.txt

The code and its --help are the module mfattn.sample_density
(analysis/mfattn/sample_density.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.sample_density import main

if __name__ == "__main__":
    raise SystemExit(main())
