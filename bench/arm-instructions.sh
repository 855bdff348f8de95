#!/usr/bin/env bash
# Instructions of one attn::forward (f32, batch 1, one head, Lq = Lk = LENGTH, D = DIM) on
# each ARM target, counted under qemu-user by qemu's own insn plugin (built here from Debian's
# qemu source, against the plugin header of the same source), for `make arm-instructions`.
# Where no ARM clock is at hand, these counts are where tuning on real hardware starts:
# qemu counts guest instructions exactly, but says nothing of their latency.
# Each target is counted twice, with 0 and with 1 forward, so the set-up drops out.
set -euo pipefail
build=${1:-build/aarch64}
length=${LENGTH:-2048}
dim=${DIM:-128}
plugin_dir=build/qemu-plugin
plugin=$plugin_dir/libinsn.so

# qemu's source from Debian's archive (deb-src), through a private sources list so that the
# system's apt configuration stays as it is.
if [ ! -f "$plugin" ]; then
  mkdir -p "$plugin_dir/lists/partial"
  sources=$(realpath "$plugin_dir")/sources.list
  echo "deb-src http://deb.debian.org/debian bookworm main" >"$sources"
  apt_private=(-o Dir::Etc::SourceList="$sources" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$(realpath "$plugin_dir")/lists")
  apt-get "${apt_private[@]}" update -qq
  # As root, apt warns that its _apt user cannot write here; it downloads all the same.
  (cd "$plugin_dir" && apt-get "${apt_private[@]}" source --download-only -qq qemu 2>&1 |
    { grep -v 'unsandboxed as root' || true; })
  tarball=$(ls "$plugin_dir"/qemu_*.orig.tar.xz)
  tar -xJf "$tarball" -C "$plugin_dir" --strip-components=1 --wildcards \
    '*/include/qemu/qemu-plugin.h' '*/tests/plugin/insn.c'
  gcc -shared -fPIC -O2 -I "$plugin_dir/include/qemu" $(pkg-config --cflags glib-2.0) \
    -o "$plugin" "$plugin_dir/tests/plugin/insn.c" $(pkg-config --libs glib-2.0)
fi

# The instructions of the whole process running `runs` forwards on `target` at `bits`;
# nothing where the program failed.
count() {
  local bits=$1 target=$2 runs=$3
  ATTN_NUM_THREADS=1 QEMU_CPU="max,sve-default-vector-length=$((bits / 8))" \
    qemu-aarch64 -L / -plugin "$plugin" -d plugin \
    "$build/bench/attn_forward_runs" --target "$target" --length "$length" --dim "$dim" \
    --runs "$runs" 2>&1 | sed -n 's/^total insns: //p' || true
}

flops=$((4 * length * length * dim))
echo "attn::forward, f32, L = $length, D = $dim, one head, one thread ($flops flops)"
printf '%-9s %6s %16s %14s\n' target bits instructions flops/instr
for run in "512 SCALAR" "512 NEON" "512 SVE" "512 SVE2" "256 SVE_256" "128 SVE2_128"; do
  set -- $run
  setup=$(count "$1" "$2" 0)
  total=$(count "$1" "$2" 1)
  [ -n "$setup" ] && [ -n "$total" ] ||
    { echo "arm-instructions: attn_forward_runs --target $2 gave no count" >&2; exit 1; }
  forward=$((total - setup))
  printf '%-9s %6s %16s %14s\n' "$2" "$1" "$forward" \
    "$(awk -v f="$flops" -v i="$forward" 'BEGIN { printf "%.2f", f / i }')"
done
