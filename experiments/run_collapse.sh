#!/usr/bin/env bash
# The main collapse experiments: installs what is missing, builds mfattn, runs the baseline
# collapse of USA and SA (n = 64, 128, 256, d = 3, beta = 1, t = 20) into data/collapse/ and
# the seed-003 auxiliary-variable cases (experiments/seed003/*.ini: RoPE, generalized RoPE,
# plain-value RoPE, distance bias vs cosine Toeplitz, prompts with frozen prefix tokens) into
# data/seed003/, prints the outcome tables, runs the metastability experiment (d = 2,
# beta = 5, 9, 16) into data/metastability/ and draws every figure into data/figures/
# (analysis/make_figures.py), with an animation of the RoPE latitude circle forming (n = 256,
# analysis/animate.py: data/figures/rope_d3_n256.mp4 and its last frame) and its viewer page
# (analysis/view.py: data/figures/rope_d3_n256.html).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
source "$here/tests/install_deps.sh"
install_deps

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=(mfattn)
# The Python module too, where pybind11 was found (docs/python.md).
grep -q "^MFATTN_PYTHON_MODULE:INTERNAL=ON" build/CMakeCache.txt && targets+=(mfattn_python)
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}"

out="$here/data/collapse"
mkdir -p "$out" "$here/data/figures"
for kernel in usa sa; do
  for n in 64 128 256; do
    ./build/mfattn run --n "$n" --d 3 --beta 1 --kernel "$kernel" --horizon 20 \
      --save-every 0.1 --seed 0 --quiet --overwrite --out "$out/baseline_${kernel}_n${n}.h5"
  done
done

MPLBACKEND=Agg /usr/bin/python3 analysis/collapse_summary.py "$out" --figure "$here/data/figures/collapse_min_inner.png"

seed003="$here/data/seed003"
mkdir -p "$seed003"
for ini in experiments/seed003/*.ini; do
  name="$(basename "$ini" .ini)"
  for n in 64 128 256; do
    ./build/mfattn run --config "$ini" --n "$n" --seed 0 --quiet --overwrite --out "$seed003/${name}_n${n}.h5"
  done
done
MPLBACKEND=Agg /usr/bin/python3 analysis/collapse_summary.py "$seed003" --cases \
  --figure "$here/data/figures/seed003_min_inner.png" --final-figure "$here/data/figures/seed003_final.png"

# The RoPE latitude circle forming (n = 256, d = 3): an animation and its last frame.
MPLBACKEND=Agg /usr/bin/python3 analysis/animate.py "$seed003/rope_d3_n256.h5" --trail 8 \
  --out "$here/data/figures/rope_d3_n256.mp4" --poster "$here/data/figures/rope_d3_n256_last.png"
/usr/bin/python3 analysis/view.py "$seed003/rope_d3_n256.h5" --out "$here/data/figures/rope_d3_n256.html"

# Metastability (d = 2, beta = 5, 9, 16, rescaled time, dopri5 to t = 1e5, seeds 0-3): one
# single-threaded run per core at a time.
meta="$here/data/metastability"
mkdir -p "$meta"
for beta in 5 9 16; do
  for seed in 0 1 2 3; do echo "$beta $seed"; done
done | xargs -P "$(nproc 2>/dev/null || echo 2)" -n 2 sh -c \
  './build/mfattn run --config experiments/metastability.ini --beta "$0" --seed "$1" --threads 1 --quiet --overwrite --out "data/metastability/beta$0_seed$1.h5"'
/usr/bin/python3 analysis/metastability_table.py "$meta" --mfattn ./build/mfattn

# Every figure of the experiments above into data/figures/.
MPLBACKEND=Agg /usr/bin/python3 analysis/make_figures.py --data "$here/data" --out "$here/data/figures"
