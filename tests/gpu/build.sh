#!/usr/bin/env bash
# Prepares build-gpu/, the folder that tests/gpu/run.sh runs on a machine with an NVIDIA GPU
# but none of Debian's -dev packages (the device machine of docs/cuda.md): the mfattn binary
# and the unit tests of a build with the CUDA backend, and beside them in build-gpu/lib every
# shared library they load that is not part of the C library or the driver (libgomp, and any
# other ldd names). HDF5 and the CUDA runtime are linked statically already.
#
#   tests/gpu/build.sh            # builds build/ (as tests/run.sh does) if needed, then build-gpu/
#
# The folder stays well under the device tool's 64 MiB carry limit (the binaries are
# stripped); the script prints its size. nvcc must be found (docs/cuda.md).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
source tests/install_deps.sh
install_deps
# sm_90 machine code and PTX, optimised, whatever tests/run.sh chose for build/ on a machine
# without a GPU.
configured=$(cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMFATTN_CUDA_ARCHITECTURES="90-real;90-virtual" \
  -DMFATTN_CUDA_OPTIMIZE=ON)
grep -q "CUDA backend: ON" <<< "$configured" ||
  { echo "tests/gpu/build.sh: nvcc was not found, so build/ has no CUDA backend (docs/cuda.md)" >&2; exit 2; }
cmake --build build -j "$(nproc)" --target mfattn mfattn_tests
out=build-gpu
rm -rf "$out"
mkdir -p "$out/lib"
cp build/mfattn build/tests/mfattn_tests "$out/"
strip "$out/mfattn" "$out/mfattn_tests"
# Libraries every Linux with glibc has, and the driver, stay behind.
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libcuda)\.'
for binary in "$out/mfattn" "$out/mfattn_tests"; do
  ldd "$binary" | awk '$3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    [[ "$name" =~ $system ]] || cp -L "$path" "$out/lib/"
  done
done
echo "build-gpu/: $(du -sh "$out" | cut -f1) ($(ls "$out/lib" | tr '\n' ' '))"
