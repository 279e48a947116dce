#!/usr/bin/env bash
# Installs what is missing (Debian), builds mfattn, and runs every test: the C++ unit and
# integration tests (CTest), a sanitizer build of the unit tests, and the Python tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
source "$here/tests/install_deps.sh"
install_deps

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

if [ "${MFATTN_SKIP_SANITIZE:-0}" != 1 ]; then
  # The sanitizer build runs the unit tests that do not start the mfattn binary many times.
  cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DMFATTN_SANITIZE=ON -DMFATTN_NATIVE=OFF >/dev/null
  cmake --build build-sanitize -j "$jobs" --target mfattn_tests mfattn
  (cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$jobs" -L sanitize)
fi

if ls tests/python/test_*.py >/dev/null 2>&1; then
  MFATTN_BINARY="$here/build/mfattn" MPLBACKEND=Agg /usr/bin/python3 -m pytest -q tests/python
fi
