#!/usr/bin/env python3
"""An MP4 or GIF of one run or density file:

    MPLBACKEND=Agg /usr/bin/python3 analysis/animate.py FILE.h5 --out run.mp4|run.gif [options]

The code and its --help are the module mfattn.animate (analysis/mfattn/animate.py), which this
script imports from the folder beside it: nothing needs building or installing."""
from mfattn.animate import main

if __name__ == "__main__":
    raise SystemExit(main())
