#!/usr/bin/env bash
# Installs what is missing (Debian), builds mfattn, and runs every test: the C++ unit and
# integration tests (CTest), a sanitizer build of the unit tests, and the Python tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
# Each phase's wall time, so that CI's log shows where the suite's budget goes.
suite_start=$SECONDS
phase() { echo "[tests/run.sh $((SECONDS - suite_start)) s] $*"; }
# The jobs that run beside other phases stop with the script, whatever ends it.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
source "$here/tests/install_deps.sh"
phase "installing what is missing"
install_deps
phase "main build"

jobs=$(nproc 2>/dev/null || echo 2)
# The CUDA device code (docs/cuda.md): with a GPU here, sm_90 machine code and PTX, as every
# build; without one, PTX only. nvcc's front end and optimiser (cicc) still compile every
# kernel, so the suite still catches any error in them; only ptxas's assembly into sm_90 machine
# code, which no GPU here could run, is left to the GPU machine's build (tests/gpu/build.sh).
# That assembly took 2.5 of the main build's 8 minutes on two cores. Without a GPU the device code
# is not optimised either (MFATTN_CUDA_OPTIMIZE=OFF: cicc at -O0 still checks all of it, and its
# two files took 3.8 and 2.7 minutes of the build's critical path at -O3, 15 s at -O0).
cuda_architectures="90-real;90-virtual"
cuda_optimize=ON
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  cuda_architectures="90-virtual"
  cuda_optimize=OFF
fi
# A new build folder is made for Ninja: unlike CMake's Makefiles, which build a library's
# objects only once the libraries it links are built, Ninja compiles every object as soon as
# a core is free, so one long compile (a CUDA unit, a pair loop's) no longer leaves the other
# core idle at each library. A folder configured before keeps its generator.
generator_for() { [ -f "$1/CMakeCache.txt" ] || echo "-GNinja"; }
cmake -S . -B build $(generator_for build) -DCMAKE_BUILD_TYPE=Release -DMFATTN_CUDA_ARCHITECTURES="$cuda_architectures" \
  -DMFATTN_CUDA_OPTIMIZE="$cuda_optimize" >/dev/null
cmake --build build -j "$jobs"
# One test at a time: each test already uses every core through OpenMP. Open MPI is installed
# above, so the MPI sweep test must run rather than skip.
export MFATTN_REQUIRE_MPI=1
# Arm: the numerical core cross-built for aarch64 and its exactness checks run under
# qemu-aarch64 with the NEON kernels (tests/aarch64/README.md; about 86 s alone). It builds
# beside the CTest and kernel-set phases, whose tests leave the second core idle through their
# serial stretches, and its result is checked after them.
aarch64_pid=""
if [ "${MFATTN_SKIP_AARCH64:-0}" != 1 ]; then
  nice -n 5 tests/aarch64/run.sh > build-aarch64.log 2>&1 &
  aarch64_pid=$!
fi
phase "ctest (the aarch64 cross build beside it)"
(cd build && ctest --output-on-failure -j 1)
# The unit tests again under every other CPU kernel set this CPU runs (the Release binary
# carries several and ctest ran the best one): the backends' exactness tests (reference
# agreement, null-token bits, thread counts) then cover each instruction-set path. The long
# numerical runs do not depend on the kernels' ISA beyond rounding and are left out, and so
# are the CUDA backend's tests (its host side takes no CPU kernel) and the suites that run no
# pair loop (the spectral zonal solver, analyze, files, options, numbers'
# texts, random numbers). The kernel sets run side by side (each test is short and mostly
# serial), each into its own log.
runnable=($(build/mfattn --version | sed -n 's/^cpu kernels this CPU runs: //p'))
if [ ${#runnable[@]} -gt 1 ]; then
  phase "unit tests with MFATTN_CPU_KERNELS=${runnable[*]:1} (side by side)"
  kernel_pids=()
  for kernels in "${runnable[@]:1}"; do
    MFATTN_CPU_KERNELS=$kernels build/tests/mfattn_tests --gtest_brief=1 \
      --gtest_filter='-Collapse.*:Noise.*:Resume.*:Sweep.*:Cuda*:MeanfieldZonal.*:Analyze.*:H5md.*:Config.*:NumberText.*:Rng.*:Info.*' \
      > "build/kernels-$kernels.log" 2>&1 &
    kernel_pids+=($!)
  done
  kernels_failed=0
  for i in "${!kernel_pids[@]}"; do
    log="build/kernels-${runnable[$((i + 1))]}.log"
    if wait "${kernel_pids[$i]}"; then tail -n 2 "$log"; else cat "$log"; kernels_failed=1; fi
  done
  [ "$kernels_failed" = 0 ] || { echo "unit tests under another kernel set failed" >&2; exit 1; }
fi

if [ -n "$aarch64_pid" ]; then
  phase "aarch64 cross build and qemu checks (the rest of it)"
  if ! wait "$aarch64_pid"; then
    tail -40 build-aarch64.log; echo "tests/aarch64/run.sh failed (build-aarch64.log)" >&2; exit 1
  fi
  tail -n 2 build-aarch64.log
fi

if [ "${MFATTN_SKIP_SANITIZE:-0}" != 1 ]; then
  # AddressSanitizer + UndefinedBehaviorSanitizer build of the unit and CLI tests (portable
  # ISA, no CUDA). Left out, because they take minutes under the sanitizers and the Release
  # build runs them: the long numerical runs whose point is the physics, not a code path
  # another test misses (baseline collapse, 4000-replica Brownian motion, the equiangular rho
  # ODEs, energy monotonicity over whole runs, per-prompt prefix clustering at n = 256, the
  # cosine and distance-bias outcomes, the 400-token null-token trajectories, which the
  # kernel-set reruns take again, the CUDA backend's agreement grids, whose code paths its
  # null-token test takes, and the registry's 784-system conformance grid, whose CPU paths
  # the CpuBackend, Auxiliary and Prefix agreement tests take); the SIGKILL-and-resume run and the sweep's SIGKILL-and-rerun
  # test; the mpirun sweep test (Open MPI's own allocations fail LeakSanitizer); and the
  # mean-field solvers' long solves (1024-cell growth-rate and convergence tables, monotonicity
  # over whole runs, rope's reduction, S^2's time evolution, the labelled S^2 rate against a
  # brute-force pair sum, a slow mode's rate over 20 frames: their code paths are the other
  # mean-field tests').
  # Built by clang where it is installed (the tests' own packages include it): under the
  # sanitizers it compiles the template-heavy pair loops in a fraction of GCC's time. Every
  # file at -O0 but the numerical libraries (core, backends, integrators, observers,
  # meanfield: -O1,
  # MFATTN_NUMERICS_COMPILE_OPTIONS), so that the loops the tests run keep a useful speed;
  # -g1 (line tables only) still names file and line in every report. (GCC at -O1 took
  # 6 minutes for this build, clang as here 2.)
  sanitizer_skips=(
    'Collapse.*' 'Noise.*' 'Energy.*' 'Reductions.Equiangular*'
    'Auxiliary.EnergyAscendsForEveryGradientFlowKernel'
    'Auxiliary.CosineKeepsAGreatCircleAndDistanceBiasCollapses'
    'Prefix.PerPromptPrefixGivesAtLeastAsManyClustersAsPrompts'
    'Prefix.EnergyCountsPrefixRowsAndAscends'
    'Resume.KilledRunKeepsFlushedFramesAndResumesExactly'
    'Sweep.KilledSweepCompletesOnRerunAndRunsEachCaseOnce' 'Sweep.MpiRanksRunEveryCaseOnce'
    'NullTokens.InsertionLeavesTrajectoriesBitIdentical' 'CudaEmulation.AgreesWithReference*'
    'EveryRegisteredBackend/*' 'MeanfieldZonal.GrowthRatesAreTheGegenbauerFormula'
    'MeanfieldCircle.SecondOrderInTheNumberOfCells' 'MeanfieldCircle.MassPositivityAndTheEnergyOfTheGradientFlow'
    'MeanfieldCircle.RopeWithTransportedValuesIsTheLabelFreeSolutionInTheGaugeCoordinate'
    'MeanfieldSphere.LinearGrowthRatesFromEvolution' 'MeanfieldSphereLabels.RateIsTheWeakFormOfThePairSum'
    'MeanfieldCircle.ASlowModeGrowsAtTheRateOfTheOperator'
    'FourierEvaluation.MatchesTheDirectSumOnRandomSystemsOfTheCircle'
    'FourierEvaluation.MatchesTheDirectSumOnZonalSystemsOfTheSphere'
  )
  sanitizer_compiler=()
  for cxx in clang++-14 clang++; do
    if command -v "$cxx" >/dev/null; then
      sanitizer_compiler=(-DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="${cxx/++/}")
      break
    fi
  done
  phase "sanitizer build"
  cmake -S . -B build-sanitize $(generator_for build-sanitize) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMFATTN_SANITIZE=ON \
    -DMFATTN_CPU_DISPATCH=OFF -DMFATTN_CUDA=OFF -DMFATTN_PYTHON=OFF "${sanitizer_compiler[@]}" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" \
    -DMFATTN_NUMERICS_COMPILE_OPTIONS=-O1 >/dev/null
  cmake --build build-sanitize -j "$jobs" --target mfattn_tests mfattn
  # Shards side by side, two per core: under the sanitizers most tests keep one core busy (one
  # process took 145 s, two shards 93 s, four 77 s: the longer tests then share a core with
  # the shorter ones). Each shard's log is shown when it fails.
  phase "sanitizer tests"
  shards=$((2 * jobs))
  shard_pids=()
  for ((shard = 0; shard < shards; ++shard)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard \
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      build-sanitize/tests/mfattn_tests --gtest_brief=1 \
      --gtest_filter="-$(IFS=:; echo "${sanitizer_skips[*]}")" > "build-sanitize/shard$shard.log" 2>&1 &
    shard_pids+=($!)
  done
  sanitizer_failed=0
  for ((shard = 0; shard < shards; ++shard)); do
    if ! wait "${shard_pids[$shard]}"; then
      cat "build-sanitize/shard$shard.log"
      sanitizer_failed=1
    fi
    tail -n 3 "build-sanitize/shard$shard.log"
  done
  [ "$sanitizer_failed" = 0 ] || { echo "sanitizer tests failed" >&2; exit 1; }
  # The portable build's mfattn, for the native-versus-portable comparison in pytest.
  export MFATTN_PORTABLE_BINARY="$here/build-sanitize/mfattn"
fi

# The option parser's fuzz target (clang, libFuzzer + ASan + UBSan): every committed corpus
# input, then 30 s of fuzzing from them (fuzz/README.md has the long run's figures). It runs
# on one core beside pytest (mostly one core too), and its result is checked after pytest.
# It links the sanitizer build's core and integrators where that build ran (fuzz/README.md).
fuzz_pid=""
if [ "${MFATTN_SKIP_FUZZ:-0}" != 1 ]; then
  fuzz_libs=""
  [ "${MFATTN_SKIP_SANITIZE:-0}" != 1 ] && fuzz_libs="$here/build-sanitize"
  MFATTN_FUZZ_SANITIZED_LIBS="$fuzz_libs" nice -n 5 fuzz/run_short.sh 30 "$here/build-fuzz" > build-fuzz.log 2>&1 &
  fuzz_pid=$!
fi

phase "pytest (fuzzing beside it)"
# One pytest worker per core (pytest-xdist, installed above): most tests wait on a
# single-threaded mfattn process or on matplotlib, so two workers take about 120 s where one
# took 190 s. Every test keeps to its own tmp_path, so the order and the pairing do not matter.
pytest_workers=()
if /usr/bin/python3 -c "import xdist" 2>/dev/null; then
  pytest_workers=(-n "$jobs")
fi
pytest_status=0
if ls tests/python/test_*.py >/dev/null 2>&1; then
  MFATTN_BINARY="$here/build/mfattn" MPLBACKEND=Agg /usr/bin/python3 -m pytest -q "${pytest_workers[@]}" tests/python ||
    pytest_status=$?
fi

if [ -n "$fuzz_pid" ]; then
  if ! wait "$fuzz_pid"; then
    tail -40 build-fuzz.log; echo "fuzz/run_short.sh: a finding (see build-fuzz/)" >&2; exit 1
  fi
  grep -E "^stat::number_of_executed_units|Done [0-9]+ runs" build-fuzz.log | tail -2
fi
[ "$pytest_status" = 0 ] || { echo "pytest failed" >&2; exit "$pytest_status"; }
phase "done"
