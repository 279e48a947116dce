# Sourced by phase_diagram.sh and sphere.sh: builds mfattn unless MFATTN_BINARY names one,
# runs `run_reference.py <experiment> ARGS` and draws the figures of its --out-dir
# (data/reference unless ARGS give another).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"

run_with_figures() {
  local experiment="$1"
  shift
  if [[ -z ${MFATTN_BINARY:-} ]]; then
    source "$here/tests/install_deps.sh"
    install_deps
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target mfattn
    export MFATTN_BINARY="$here/build/mfattn"
  fi
  local out="$here/data/reference" args=("$@") i
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
      --out-dir) out="${args[$((i + 1))]}" ;;
      --out-dir=*) out="${args[$i]#--out-dir=}" ;;
    esac
  done
  /usr/bin/python3 experiments/reference/run_reference.py "$experiment" --out-dir "$out" "$@"
  MPLBACKEND=Agg /usr/bin/python3 analysis/plot_reference.py "$out"
}
