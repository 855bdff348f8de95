#!/usr/bin/env bash
# The aarch64 wheel (`make wheel-aarch64`), cross-built from this tree by pip and
# scikit-build-core with pyproject.toml's configuration and the aarch64 toolchain
# (cmake/toolchains/aarch64-linux-gnu.cmake). python/CMakeLists.txt bundles the arm64 copies
# of the libraries beyond Debian's base runtime unchanged: file(GET_RUNTIME_DEPENDENCIES)
# takes only libraries of the files' own ELF machine, from the folders ldconfig lists, which
# include /usr/lib/aarch64-linux-gnu once libc6:arm64 is installed. Prints the wheel's path.
# Usage: scripts/wheel-aarch64.sh [output folder, from the repository's root;
#                                   default build/wheel-aarch64/dist]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -le 1 ] ||
  { echo "wheel-aarch64: expected at most one argument, the output folder" >&2; exit 2; }
dist=${1:-build/wheel-aarch64/dist}
work=build/wheel-aarch64

# Debian's python3.11 builds it: Debian 12's arm64 interpreter is 3.11 too, and its headers
# (/usr/include/python3.11/pyconfig.h) include the arm64 pyconfig.h of libpython3.11-dev:arm64
# when the compiler targets aarch64.
python=/usr/bin/python3.11
[ -x "$python" ] ||
  { echo "wheel-aarch64: $python is missing (scripts/install-deps.sh)" >&2; exit 1; }
[ -f /usr/include/aarch64-linux-gnu/python3.11/pyconfig.h ] ||
  { echo "wheel-aarch64: no arm64 Python headers (scripts/install-deps.sh aarch64)" >&2; exit 1; }

# scikit-build-core and nanobind at the versions of requirements/python-build.txt, in a venv
# of their own, with a pip that knows -C (Debian's 23.0 does not): the wheel needs nothing
# else of the development environment.
build_env=$work/build-env
[ -x "$build_env/bin/python" ] || "$python" -m venv "$build_env"
pip=("$build_env/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" -r requirements/python-build.txt

# scikit-build-core's cross-compiling settings: the wheel's platform tag from
# _PYTHON_HOST_PLATFORM, the extension's suffix from SETUPTOOLS_EXT_SUFFIX. No MPI: attn._dist
# would link the arm64 libmpi of the machine it runs on, which needs an arm64 mpi4py beside it.
# The toolchain confines find_package to the arm64 folders; nanobind's CMake files are in the
# build venv, named here.
nanobind_dir=$("$build_env/bin/python" -m nanobind --cmake_dir)
mkdir -p "$dist"
rm -f "$dist"/attn-*-linux_aarch64.whl
_PYTHON_HOST_PLATFORM=linux-aarch64 SETUPTOOLS_EXT_SUFFIX=.cpython-311-aarch64-linux-gnu.so \
  CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}" \
  "$build_env/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
  --no-build-isolation -w "$dist" -C build-dir="$work/cmake" \
  -C cmake.toolchain-file=cmake/toolchains/aarch64-linux-gnu.cmake \
  -C cmake.define.nanobind_DIR="$nanobind_dir" \
  -C cmake.define.ATTN_BUILD_DIST=OFF -C cmake.define.ATTN_WERROR=ON .
wheels=("$dist"/attn-*-linux_aarch64.whl)
[ -f "${wheels[0]}" ] ||
  { echo "wheel-aarch64: pip made no linux_aarch64 wheel in $dist" >&2; exit 1; }
echo "wheel-aarch64: built in $SECONDS s" >&2
echo "${wheels[0]}"
