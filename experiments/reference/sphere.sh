#!/usr/bin/env bash
# sphere.py of arXiv:2312.10794's code (borjanG/2023-transformers-rotf) run by mfattn: n = 64
# tokens on S^2, beta = 1, SA, T = 15, dt = 0.1, every step a frame, with the reference step
# (--integrator euler-unprojected) and with --integrator rk4; checks the reference run against
# the NumPy peer of sphere.py (tests/peers/reference_peer.py) from the same start, and draws
# the tokens at a few times (data/reference/figures/sphere.png, analysis/plot_reference.py).
#
# Usage: experiments/reference/sphere.sh [run_reference.py sphere options: --quick, --n 256,
#        --T 15, --seed S, --out-dir DIR].
# The binary: MFATTN_BINARY=path, else this checkout's build/mfattn; --build installs what is
# missing and builds it (nothing is built otherwise). A relative --out-dir is taken from the
# calling folder. --help lists every option and its accepted values.
source "$(dirname "${BASH_SOURCE[0]}")/run_with_figures.sh"
run_with_figures sphere "$@"
