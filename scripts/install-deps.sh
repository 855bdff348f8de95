#!/usr/bin/env bash
# Installs the Debian packages attn builds with; `install-deps.sh aarch64` those of the
# aarch64 build and its tests under emulation (`make test-aarch64`): Debian's cross compiler,
# qemu-user, and the arm64 -dev and runtime packages (multiarch: the headers are shared, the
# libraries go to /usr/lib/aarch64-linux-gnu). Idempotent, and silent when everything is
# already there. `install-deps.sh arm-instructions`: qemu-user with plugins (the static build
# has none) and glib's headers, for the insn plugin of bench/arm-instructions.sh.
set -euo pipefail

host_packages=(
  g++ make cmake git pkg-config ccache
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libcli11-dev nlohmann-json3-dev libpng-dev libfreetype-dev fonts-dejavu-core
  libopenblas-dev patchelf
  libopenmpi-dev openmpi-bin
  libexpat1-dev chromium
  python3 python3-venv python3-dev
  clang-format patch
  clang-14 libclang-rt-14-dev libomp-14-dev
)
aarch64_packages=(
  g++-aarch64-linux-gnu qemu-user-static
  libhwy-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libbenchmark-dev:arm64
  libpng-dev:arm64 libfreetype-dev:arm64 libexpat1-dev:arm64 libgomp1:arm64
  libpython3.11-dev:arm64
)
arm_instructions_packages=(qemu-user libglib2.0-dev pkg-config)
case "${1:-host}" in
  host) packages=("${host_packages[@]}") ;;
  aarch64) packages=("${aarch64_packages[@]}") ;;
  arm-instructions) packages=("${arm_instructions_packages[@]}") ;;
  *) echo "install-deps: expected no argument, aarch64 or arm-instructions, given \"$1\"" >&2; exit 2 ;;
esac

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
if [ "${1:-host}" = aarch64 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo dpkg --add-architecture arm64
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
