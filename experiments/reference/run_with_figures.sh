# Sourced by phase_diagram.sh and sphere.sh: runs `run_reference.py <experiment> ARGS` and
# draws the figures of its --out-dir (data/reference of this checkout unless ARGS give another;
# a relative --out-dir is taken from the folder the script was called from).
#
# The binary: MFATTN_BINARY when set, else this checkout's build/mfattn when it exists. Nothing
# is installed or built unless --build is given: then the set-up's packages are installed where
# missing and build/ is built (as experiments/run_collapse.sh does). Without a binary and
# without --build: one line saying so, exit 2. --help prints run_reference.py's options.
set -euo pipefail
caller="$PWD"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
# run_reference.py reads the runs' files with the package mfattn's loader (analysis/mfattn).
export PYTHONPATH="$here/analysis${PYTHONPATH:+:$PYTHONPATH}"

run_with_figures() {
  local experiment="$1"
  shift
  local out="$here/data/reference" args=() build=0 help=0 i value
  local given=("$@")
  for ((i = 0; i < ${#given[@]}; i++)); do
    case "${given[$i]}" in
      --build) build=1 ;;
      -h | --help) help=1; args+=("${given[$i]}") ;;
      --out-dir | --out-dir=*)
        if [[ ${given[$i]} == --out-dir ]]; then
          ((i + 1 < ${#given[@]})) || { echo "${0##*/}: --out-dir needs a folder" >&2; exit 2; }
          value="${given[$((i + 1))]}"
          i=$((i + 1))
        else
          value="${given[$i]#--out-dir=}"
        fi
        [[ $value == /* ]] || value="$caller/$value"
        out="$value" ;;
      *) args+=("${given[$i]}") ;;
    esac
  done
  if [[ $help == 1 ]]; then
    exec /usr/bin/python3 experiments/reference/run_reference.py "$experiment" "${args[@]}"
  fi
  if [[ -z ${MFATTN_BINARY:-} ]]; then
    if [[ $build == 1 ]]; then
      source "$here/tests/install_deps.sh"
      install_deps
      cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
      cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target mfattn
    elif [[ ! -x $here/build/mfattn ]]; then
      echo "${0##*/}: no mfattn binary ($here/build/mfattn is missing): give --build to install" \
           "what is missing and build it in this checkout, or set MFATTN_BINARY=PATH" >&2
      exit 2
    fi
    export MFATTN_BINARY="$here/build/mfattn"
  fi
  /usr/bin/python3 experiments/reference/run_reference.py "$experiment" "${args[@]}" --out-dir "$out"
  MPLBACKEND=Agg /usr/bin/python3 analysis/plot_reference.py "$out"
}
