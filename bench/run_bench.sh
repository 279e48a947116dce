#!/usr/bin/env bash
# mfattn benchmark: mfattn vs a dense NumPy peer, memory at n = 50000, roofline.
# Usage: bench/run_bench.sh [collect.py options, e.g. --repeats 5 --idle-wait 300]
# Writes bench/results.md (and prints it). About 1-2 minutes on an idle 2-core machine; it waits
# (90 s at most in all) for other work to finish, measures a disturbed group once more, and
# flags in the report every command that other processes still disturbed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
BIN="$BUILD/mfattn"
NOTES=()

# (a) a Release binary, brought up to date with the tree (incremental; quick when current).
build() {
  if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$BUILD" -j2 --target mfattn >/dev/null
}
built=0
for attempt in 1 2 3; do
  if build; then built=1; break; fi
  echo "run_bench: build failed (attempt $attempt; someone may be mid-edit); retrying in 60 s" >&2
  sleep 60
done
if [[ $built == 0 ]]; then
  if [[ -x $BIN ]]; then
    echo "run_bench: build still failing; benchmarking the existing binary, which may be stale" >&2
    NOTES+=(--note "WARNING: the build failed; the binary measured may not match the tree.")
  else
    echo "run_bench: no binary at $BIN and the build fails" >&2
    exit 1
  fi
fi

# /usr/bin/time for peak RSS.
if [[ ! -x /usr/bin/time ]]; then
  apt-get install -y time >/dev/null
fi

# (b) measure and write bench/results.md.
exec /usr/bin/python3 "$ROOT/bench/collect.py" --mfattn "$BIN" --out "$ROOT/bench/results.md" \
  ${NOTES[@]+"${NOTES[@]}"} "$@"
