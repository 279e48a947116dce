#!/usr/bin/env bash
# Builds mfattn once per instruction-set level (-march=native, x86-64-v3, x86-64-v2; no
# run-time dispatch) next to the dispatching Release build, and checks that every build and
# every kernel set of the Release build agree to 1e-12 on whole trajectories and that each is
# bitwise identical across thread counts (tests/python/test_portable_build.py).
# Not part of tests/run.sh (three more Release builds, ~5 minutes on 2 cores); run it after
# tests/run.sh, from the repository root:  tests/isa_builds.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
jobs=$(nproc 2>/dev/null || echo 2)
# The dispatching Release build, brought up to date (incremental when it is current).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" --target mfattn
extra=()
for arch in native x86-64-v3 x86-64-v2; do
  dir="build-isa/$arch"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMFATTN_ARCH="$arch" -DMFATTN_TESTS=OFF >/dev/null
  cmake --build "$dir" -j "$jobs" --target mfattn
  echo "$dir: $("$dir/mfattn" --version | sed -n 's/^cpu kernels: //p')"
  extra+=("$here/$dir/mfattn")
done
MFATTN_EXTRA_BINARIES="$(IFS=:; echo "${extra[*]}")" MFATTN_BINARY="$here/build/mfattn" \
  /usr/bin/python3 -m pytest -q tests/python/test_portable_build.py
