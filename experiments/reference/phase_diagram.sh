#!/usr/bin/env bash
# The phase diagrams of arXiv:2312.10794 (phase-diagrams.py of borjanG/2023-transformers-rotf)
# run by mfattn: SA and USA, identity and random per-replica matrices (randomKQ 1, randomV 1),
# each with the reference step (--integrator euler-unprojected, the USA step capped at
# 0.1 / max(sqrt(beta) e^(beta - 1/2), 1)) and with --integrator rk4 at the same dt; the
# reference's workload (2048 systems of n = 32 in d = 2, 90 betas in [0.1, 9], T = 30 for SA
# and 1 for USA, 200 checkpoints). Writes data/reference/phase_diagram/*.npz and the figures
# data/reference/figures/phase_<kernel>_<matrices>.png (analysis/plot_reference.py).
#
# Usage: experiments/reference/phase_diagram.sh [run_reference.py phase options, e.g. --quick,
#        --kernels sa, --matrices identity, --batch 512, --betas 10, --jobs 2, --out-dir DIR]
# Times on 2 cores: docs/reference.md.
# The binary: MFATTN_BINARY=path, else this checkout's build/mfattn; --build installs what is
# missing and builds it (nothing is built otherwise). A relative --out-dir is taken from the
# calling folder. --help lists every option and its accepted values.
source "$(dirname "${BASH_SOURCE[0]}")/run_with_figures.sh"
run_with_figures phase "$@"
