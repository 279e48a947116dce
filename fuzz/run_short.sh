#!/usr/bin/env bash
# Builds the option fuzzer with clang (libFuzzer, ASan, UBSan) and runs the committed corpus
# plus a short fuzzing run. Usage: fuzz/run_short.sh [SECONDS (30)] [BUILD_DIR (build-fuzz)]
# Exit 0: no finding. A finding leaves crash-*, timeout-* or oom-* files in BUILD_DIR.
# MFATTN_FUZZ_SANITIZED_LIBS=DIR: a sanitizer build's folder (CMake, -DMFATTN_SANITIZE=ON,
# clang) whose libmfattn_core.a and libmfattn_integrators.a are linked instead of compiling
# src/core and src/integrators here (tests/run.sh passes its own: 60 of the build's 105
# CPU-seconds). Their code then carries the sanitizers but not the fuzzer's coverage counters,
# which the parser's files (app/, io/weights_file) keep.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
seconds="${1:-30}"
build="${2:-$root/build-fuzz}"
cxx="${CLANGXX:-clang++-14}"
command -v "$cxx" >/dev/null || cxx=clang++
# HDF5 for the --weights file that validation reads (pkg-config names Debian's serial build).
hdf5_flags=($(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial))
hdf5_libs=($(pkg-config --libs hdf5 2>/dev/null || echo -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5))
flags=(-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize=pointer-overflow -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/src" -I/usr/include/eigen3 "${hdf5_flags[@]}" -fopenmp)
mkdir -p "$build/corpus"
# The sources the parser links (the core and the integrators as CMakeLists.txt globs them, so
# that a new file there is linked here too; the config reader, validation, the --weights
# reader), compiled once, side by side, and reused.
sources=() objects=() archives=() pids=() library_objects=()
libs="${MFATTN_FUZZ_SANITIZED_LIBS:-}"
if [[ -n "$libs" && -f "$libs/libmfattn_core.a" && -f "$libs/libmfattn_integrators.a" ]]; then
  # After the objects, the integrators before the core: the linker takes an archive's members
  # only for what is still missing.
  archives=("$libs/libmfattn_integrators.a" "$libs/libmfattn_core.a")
else
  for file in "$root"/src/core/*.cpp "$root"/src/integrators/*.cpp; do
    file="${file#"$root/src/"}"
    sources+=("${file%.cpp}")
  done
fi
sources+=(app/config app/validate app/run_resources io/weights_file)
for source in "${sources[@]}"; do
  object="$build/$(basename "$source").o"
  if [[ ! "$object" -nt "$root/src/$source.cpp" ]]; then
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$root/src/$source.cpp" -o "$object" &
    pids+=($!)
  fi
  case "$source" in
    core/* | integrators/*) library_objects+=("$object") ;;
    *) objects+=("$object") ;;
  esac
done
for pid in "${pids[@]}"; do wait "$pid"; done
# The core and the integrators compiled here go in as an archive too, so that only the members
# the parser needs are linked (not, say, the adjoint of whole runs, which needs the backends).
if [[ ${#library_objects[@]} -gt 0 ]]; then
  rm -f "$build/libfuzz_numerics.a"
  ar rcs "$build/libfuzz_numerics.a" "${library_objects[@]}"
  archives=("$build/libfuzz_numerics.a")
fi
"$cxx" "${flags[@]}" -fsanitize=fuzzer "$here/fuzz_options.cpp" "${objects[@]}" "${archives[@]}" \
  -lboost_program_options "${hdf5_libs[@]}" -o "$build/fuzz_options"
cd "$build"
# Every seed first, then fuzzing from them; new inputs go to BUILD_DIR/corpus.
./fuzz_options -runs=0 "$here/corpus"
./fuzz_options -max_total_time="$seconds" -max_len=2048 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$build/corpus" "$here/corpus"
