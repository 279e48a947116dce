#!/usr/bin/env bash
# Cross-compiles mfattn's numerical core for aarch64 (NEON kernels) with Debian's
# g++-aarch64-linux-gnu and runs tests/aarch64/kernel_check.cpp under qemu-aarch64.
# Exit status 0 only when every check passes. See tests/aarch64/README.md.
#
#   tests/aarch64/run.sh            # from anywhere; build output in <repo>/build-aarch64
#   JOBS=4 tests/aarch64/run.sh     # parallel compiles (default: nproc)
set -euo pipefail

start=$(date +%s.%N)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$repo/build-aarch64"
jobs=${JOBS:-$(nproc)}
elapsed() { awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }
say() { echo "[aarch64 $(elapsed)s] $*"; }

# --- packages ------------------------------------------------------------------------------
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || need+=(qemu-user)
[ -f /usr/include/eigen3/Eigen/Dense ] || need+=(libeigen3-dev)
# Waits for another apt/dpkg run (up to 10 minutes) instead of failing on its lock: apt's own
# lock timeout for dpkg, and retries for `apt-get update`, whose lists lock it does not cover.
apt_get() {
  local sudo_cmd=() try
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  local log
  log=$(mktemp)
  for try in $(seq 1 120); do
    if "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@" 2>&1 |
       tee "$log"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
      rm -f "$log"
      return 0
    fi
    grep -qi "lock" "$log" || { rm -f "$log"; return 1; }  # a real failure: no retry
    say "apt-get $1: lock busy, retrying in 5 s ($try/120)"
    sleep 5
  done
  rm -f "$log"
  return 1
}
if [ ${#need[@]} -gt 0 ]; then
  say "installing: ${need[*]}"
  apt_get update -qq
  apt_get install -y --no-install-recommends "${need[@]}"
fi
CXX=aarch64-linux-gnu-g++
QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
$CXX -print-file-name=libgomp.a | grep -q / || { echo "FAIL: no libgomp for aarch64"; exit 1; }

# --- build ---------------------------------------------------------------------------------
# The numerical core only: no src/app, src/io, src/sweep, src/analyze, src/cli (HDF5, Boost),
# src/observers or src/oattn (unused by the checks); src/backends/cuda/*.cpp because
# make_backend (backend_common.cpp) refers to make_cuda_backend (the CUDA backend's host side
# and host emulation, without the device loops).
# The directories are globbed as CMakeLists.txt globs them, so a new source file of the core is
# built here too; the longest compiles go first, so that the parallel jobs end together.
longest=(
  src/backends/cpu/one_sided_sweep.cpp src/backends/cpu/cpu_backend.cpp src/core/gauge.cpp
  src/backends/cpu/symmetric_pairs.cpp src/integrators/integrators.cpp tests/aarch64/kernel_check.cpp
)
sources=("${longest[@]}")
cd "$repo"
for s in src/backends/cpu/*.cpp src/backends/reference/*.cpp src/backends/*.cpp src/core/*.cpp \
         src/integrators/*.cpp src/backends/cuda/*.cpp src/backends/fourier/*.cpp; do
  [[ " ${longest[*]} " == *" $s "* ]] || sources+=("$s")
done
# The flags of CMakeLists.txt that matter (Release uses -O3). -O1 keeps the build short: 163
# CPU-seconds against -O2's 214, and the kernels' vector types (GCC's vector extensions) are
# NEON instructions at any -O level (the check below counts them).
common=(-std=c++20 -O1 -fopenmp -DEIGEN_DONT_PARALLELIZE -Wall -Wextra -Wpedantic
        -Wno-maybe-uninitialized -I"$repo/include" -I"$repo/src" -isystem /usr/include/eigen3)
flags_for() {
  case "$1" in
    src/core/rng.cpp | src/core/init.cpp | src/core/gauge.cpp) echo "-ffp-contract=off" ;;
    src/backends/cpu/cpu_dispatch.cpp | src/backends/cpu/kernel_set.cpp) ;;
    src/backends/cpu/*.cpp) echo "-fno-math-errno" ;;  # the pair loops' files, as CMakeLists.txt
  esac
}
mkdir -p "$build/obj"
flags_id=$(printf '%s\n' "${common[@]}" "$($CXX --version | head -1)" | md5sum | cut -c1-12)

# Recompiles one source when its object is missing, older than the source or one of the
# headers it read (-MMD list), or was built with other flags.
compile() {
  local src=$1 obj="$build/obj/$(echo "$1" | tr / _).o"
  local dep="${obj%.o}.d" stamp="${obj%.o}.flags" extra
  extra=$(flags_for "$src")
  local id="$flags_id $extra"
  if [ -f "$obj" ] && [ -f "$dep" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$id" ]; then
    local stale=0 f
    for f in $(sed -e 's/\\$//' -e 's/^[^:]*://' "$dep"); do
      [ "$f" -nt "$obj" ] && { stale=1; break; }
    done
    [ $stale -eq 0 ] && return 0
  fi
  # shellcheck disable=SC2086
  if ! $CXX "${common[@]}" $extra -MMD -MF "$dep" -c "$repo/$src" -o "$obj" 2>"$obj.log"; then
    cat "$obj.log" >&2
    return 1
  fi
  cat "$obj.log" >&2
  echo "$id" >"$stamp"
}
export -f compile flags_for
export CXX build repo flags_id
export common_str="${common[*]}"

say "compiling ${#sources[@]} sources with $CXX ($($CXX -dumpfullversion)), -O1, $jobs jobs"
# Bash arrays do not cross into the xargs children: rebuild common there from a string.
printf '%s\n' "${sources[@]}" |
  xargs -P "$jobs" -I{} bash -c 'read -ra common <<<"$common_str"; compile "$1"' _ {} ||
  { echo "FAIL: build"; exit 1; }

objects=()
for s in "${sources[@]}"; do objects+=("$build/obj/$(echo "$s" | tr / _).o"); done
binary="$build/kernel_check"
# Static: qemu then needs no sysroot (-L) to load it. (The linker's note that libgomp's
# OpenACC profiling hook would dlopen at run time is expected; shown only on failure.)
$CXX -static -fopenmp "${objects[@]}" -o "$binary" 2>"$build/link.log" ||
  { cat "$build/link.log"; echo "FAIL: link"; exit 1; }
if command -v file >/dev/null; then
  file "$binary" | grep -q "ARM aarch64" || { echo "FAIL: $binary is not an aarch64 binary"; exit 1; }
fi
say "built $binary"

# --- run -----------------------------------------------------------------------------------
status=0
# The kernel objects really hold NEON code: two-double vector arithmetic (fadd/fmul/fmla on
# vN.2d registers), thousands of instructions in the pair loops.
objdump_tool=$(command -v aarch64-linux-gnu-objdump || true)
if [ -n "$objdump_tool" ]; then
  neon=$("$objdump_tool" -d "$build/obj/src_backends_cpu_one_sided_sweep.cpp.o" \
           "$build/obj/src_backends_cpu_symmetric_pairs.cpp.o" |
         grep -cE '\bf(add|sub|mul|mla|mls|div|max|min|sqrt)\s+v[0-9]+\.2d' || true)
  if [ "$neon" -ge 1000 ]; then
    echo "PASS neon-instructions: $neon two-double NEON arithmetic instructions in one_sided_sweep.o + symmetric_pairs.o (>= 1000)"
  else
    echo "FAIL neon-instructions: only $neon two-double NEON arithmetic instructions in the kernel objects"
    status=1
  fi
fi
say "running under $QEMU"
# The check is that the automatic choice is NEON: a kernel set forced for x86 work would fail it.
unset MFATTN_CPU_KERNELS
"$QEMU" -L /usr/aarch64-linux-gnu "$binary" || status=1
say "done (exit $status); total $(elapsed) s"
exit $status
