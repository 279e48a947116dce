#!/usr/bin/env bash
# The main collapse experiments: installs what is missing, builds mfattn, runs the baseline
# collapse of USA and SA (n = 64, 128, 256, d = 3, beta = 1, t = 20) into data/collapse/,
# prints the outcome table and draws data/figures/collapse_min_inner.png.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
source "$here/tests/install_deps.sh"
install_deps

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target mfattn

out="$here/data/collapse"
mkdir -p "$out" "$here/data/figures"
for kernel in usa sa; do
  for n in 64 128 256; do
    ./build/mfattn run --n "$n" --d 3 --beta 1 --kernel "$kernel" --horizon 20 \
      --save-every 0.1 --seed 0 --quiet --overwrite --out "$out/baseline_${kernel}_n${n}.h5"
  done
done

MPLBACKEND=Agg /usr/bin/python3 analysis/collapse_summary.py "$out" --figure "$here/data/figures/collapse_min_inner.png"
