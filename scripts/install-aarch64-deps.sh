#!/usr/bin/env bash
# Installs what the aarch64 build and its tests under emulation need (`make test-aarch64`):
# Debian's cross compiler, qemu-user, and the arm64 -dev packages of the libraries attn builds
# with (multiarch: the headers are shared, the libraries go to /usr/lib/aarch64-linux-gnu).
# Idempotent, and silent when everything is already there.
set -euo pipefail

packages=(
  g++-aarch64-linux-gnu qemu-user-static
  libhwy-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libbenchmark-dev:arm64
  libpng-dev:arm64 libfreetype-dev:arm64 libexpat1-dev:arm64 libgomp1:arm64
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
  command -v sudo >/dev/null || { echo "install-aarch64-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-aarch64-deps: installing ${missing[*]}"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo dpkg --add-architecture arm64
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
