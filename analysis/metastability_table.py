#!/usr/bin/env python3
"""The plateau table of the metastability runs:

    /usr/bin/python3 analysis/metastability_table.py data/metastability [--mfattn build/mfattn]

The code and its --help are the module mfattn.metastability_table
(analysis/mfattn/metastability_table.py), which this script imports from the folder beside it:
nothing needs building or installing."""
from mfattn.metastability_table import main

if __name__ == "__main__":
    raise SystemExit(main())
