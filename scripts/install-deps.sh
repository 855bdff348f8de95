#!/usr/bin/env bash
# Installs the Debian packages attn builds with. Idempotent, and silent when everything is
# already there.
set -euo pipefail

packages=(
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
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
