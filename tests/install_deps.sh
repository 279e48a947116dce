# Sourced by tests/run.sh and experiments/run_collapse.sh: installs the Debian packages that
# mfattn needs when they are missing (apt-get as root, else prints the command).
mfattn_packages=(cmake g++ make ninja-build libeigen3-dev libhdf5-dev libboost-program-options-dev
  libgtest-dev libomp-dev python3-h5py python3-numpy python3-scipy python3-pytest python3-pytest-xdist
  python3-matplotlib python3-mdanalysis python3-torch chromium libopenblas0-pthread openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev binutils pybind11-dev python3-dev libfftw3-dev libsharp-dev zlib1g-dev pkg-config
  ffmpeg python3-pil)

# On a freshly booted machine another apt-get (unattended-upgrades, cloud-init) often holds
# the dpkg and list locks: every apt-get call waits for them (up to MFATTN_APT_LOCK_TIMEOUT
# seconds, default 600) instead of failing at once.
mfattn_apt_get() {
  apt-get -o DPkg::Lock::Timeout="${MFATTN_APT_LOCK_TIMEOUT:-600}" "$@"
}

install_deps() {
  local missing=()
  for p in "${mfattn_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ]; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    mfattn_apt_get update -qq
    mfattn_apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "missing packages; run: sudo apt-get -o DPkg::Lock::Timeout=600 install ${missing[*]}" >&2
    return 1
  fi
}
