#!/usr/bin/env bash
# The aarch64 wheel on its own under emulation (`make test-wheel-aarch64`): a fresh venv on an
# arm64 root that holds only Debian's base runtime (libc6, libgcc-s1, libstdc++6, zlib1g) and
# the arm64 python3.11 with its standard library, extracted from Debian's arm64 packages into
# build/wheel-aarch64/root. pip, run by that Python under qemu-user, installs PyPI's aarch64
# NumPy and the wheel; then `import attn`, attn.attention against NumPy, and `attn demo` by
# the wheel's program. The root has no libhwy, libgomp, libpng16, FreeType or brotli, so
# passing shows that the wheel carries them. It runs chrooted into that root (root is
# needed), so that nothing of this machine's own arm64 libraries (qemu -L falls back to them)
# is seen.
# Usage: scripts/test-wheel-aarch64.sh WHEEL (an attn-*-linux_aarch64.whl)
set -euo pipefail
fail() { echo "test-wheel-aarch64: $*" >&2; exit 1; }
[ $# -eq 1 ] || fail "expected one argument, the attn-*-linux_aarch64.whl to check"
wheel=$(realpath -e "$1") || fail "no wheel at $1"
[[ $(basename "$wheel") == attn-*-linux_aarch64.whl ]] ||
  fail "$1 is not an attn linux_aarch64 wheel"
[ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null ||
  fail "needs root that may make a mount namespace (unshare -m): it chroots into the arm64 root"
qemu=$(command -v qemu-aarch64-static) ||
  fail "no qemu-aarch64-static (scripts/install-deps.sh aarch64)"
cd "$(dirname "$0")/.."
work=$PWD/build/wheel-aarch64
root=$work/root

timed() {
  local name=$1 start=$SECONDS
  shift
  "$@" || return
  echo "test-wheel-aarch64: $name: $((SECONDS - start)) s"
}

# PyPI's aarch64 NumPy for CPython 3.11, the version pip picks, fetched once by the pip of a
# venv of Debian's python3.11 (Debian's python3 comes without pip).
numpy_wheel() {
  mkdir -p "$work/numpy"
  if ! compgen -G "$work/numpy/numpy-*-cp311-*aarch64.whl" >/dev/null; then
    [ -x "$work/download-env/bin/python" ] || python3.11 -m venv "$work/download-env"
    "$work/download-env/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
      --only-binary=:all: --platform manylinux2014_aarch64 --python-version 3.11 \
      --implementation cp --abi cp311 -d "$work/numpy" numpy
  fi
}

# The arm64 root: Debian's base runtime; the interpreter, its standard library and the
# libraries those load (the Depends of those three); Debian's pip as a wheel (arch all),
# which runs from the wheel file itself. Made afresh each time from the kept .debs.
arm64_packages=(
  libc6 libgcc-s1 libstdc++6 zlib1g
  python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
  libexpat1 libssl3 libbz2-1.0 libcrypt1 libdb5.3 libffi8 liblzma5 libncursesw6 libnsl2
  libreadline8 libsqlite3-0 libtinfo6 libtirpc3 libuuid1
)
all_packages=(python3-pip-whl)
make_root() {
  mkdir -p "$work/debs"
  local package missing=()
  for package in "${arm64_packages[@]/%/:arm64}" "${all_packages[@]}"; do
    compgen -G "$work/debs/${package%:arm64}_*.deb" >/dev/null || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    # As root, apt downloads as root: its _apt user may not write into build/.
    (cd "$work/debs" && apt-get download -qq -o APT::Sandbox::User=root "${missing[@]}")
  fi
  rm -rf "$root"
  mkdir -p "$root"
  for package in "${arm64_packages[@]}" "${all_packages[@]}"; do
    dpkg -x "$(compgen -G "$work/debs/${package}_*.deb" | head -n 1)" "$root"
  done
  local extra
  extra=$(find "$root" -name 'libhwy*' -o -name 'libgomp*' -o -name 'libpng*' \
    -o -name 'libfreetype*' -o -name 'libbrotli*')
  [ -z "$extra" ] || fail "the arm64 root holds libraries the wheel must carry: $extra"
  # qemu-user itself (static) and the files pip installs from; no binfmt_misc is needed.
  install -D "$qemu" "$root/usr/bin/qemu-aarch64-static"
  mkdir -p "$root/wheels" "$root/proc" "$root/dev" "$root/tmp"
  cp "$wheel" "$work"/numpy/numpy-*-cp311-*aarch64.whl "$root/wheels/"
}

# Inside the root, in a private mount namespace that holds /proc and /dev for it: each
# command under qemu-user, since an aarch64 program cannot exec another one there.
check() {
  unshare -m bash -euo pipefail -c '
    root=$1; shift
    mount --rbind /proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/tmp"
    env -i PATH=/usr/bin:/bin HOME=/tmp PYTHONNOUSERSITE=1 "$(command -v chroot)" "$root" "$@"
  ' check "$root" "$@"
}
emulated() { check /usr/bin/qemu-aarch64-static "$@"; }

site=/venv/lib/python3.11/site-packages
attention_against_numpy='
import os, numpy as np, attn
print("attn from", os.path.dirname(attn.__file__), "numpy", np.__version__)
rng = np.random.default_rng(0)
q, k, v = rng.standard_normal((3, 2, 4, 33, 64)).astype(np.float32)
s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(64)
w = np.exp(s - s.max(-1, keepdims=True))
want = (w / w.sum(-1, keepdims=True)) @ v
error = float(np.abs(attn.attention(q, k, v) - want).max())
print("max abs error vs NumPy:", error, "on", attn.explain(q, k, v)["plan"].split(" (")[0])
assert error < 1e-5, error
'

timed "aarch64 NumPy wheel" numpy_wheel
timed "arm64 root (base runtime and Python)" make_root
timed "fresh venv" emulated /usr/bin/python3.11 -m venv --without-pip /venv
pip_wheel=$(cd "$root" && compgen -G "usr/share/python-wheels/pip-*.whl" | head -n 1)
timed "pip install numpy and the wheel" emulated /venv/bin/python "/$pip_wheel/pip" install -q \
  --disable-pip-version-check --no-index --find-links /wheels numpy "/wheels/$(basename "$wheel")"
# The command pip puts in bin/ execs the package's attn/bin/attn, which an emulated process
# cannot (no binfmt_misc), so the demo runs that program itself; the script must be there.
[ "$(head -n 1 "$root/venv/bin/attn" 2>/dev/null)" = "#!/venv/bin/python" ] ||
  fail "pip put no attn command for the venv's python in its bin/"
timed "import attn, attn.attention against NumPy" emulated /venv/bin/python -c \
  "$attention_against_numpy"
# The demo's four parts on stdout; on stderr its notice that part 1 runs the float64 reference.
demo=$work/demo
run_demo() { emulated "$site/attn/bin/attn" demo >"$demo.out" 2>"$demo.err"; }
timed "attn demo" run_demo || fail "attn demo failed: $(cat "$demo.out" "$demo.err")"
grep '^Part [1-4]\.\|^  time\|^  checksum' "$demo.out"
[ "$(grep -c '^Part [1-4]\.' "$demo.out")" -eq 4 ] || fail "attn demo printed not its four parts"
echo "test-wheel-aarch64: passed; the wheel's libraries: $(ls "$root$site/attn/lib" | tr '\n' ' ')"
