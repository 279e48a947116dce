#!/usr/bin/env python3
"""A trajectory viewer in one self-contained HTML file:

    /usr/bin/python3 analysis/view.py RUN.h5 --out run.html [--replica R] [--max-mb 6]

The code and its --help are the module mfattn.view (analysis/mfattn/view.py), which this script
imports from the folder beside it: nothing needs building or installing."""
from mfattn.view import main

if __name__ == "__main__":
    raise SystemExit(main())
