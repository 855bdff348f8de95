#!/usr/bin/env bash
# The aarch64 build's suite under qemu-user (`make test-aarch64`): Highway picks its targets
# from the emulated CPU's SVE vector length, so the suite runs once at 512 bits (NEON, SVE,
# SVE2 and SCALAR, every test), then the kernel tests at 256 bits for SVE_256 and at 128 bits
# for SVE2_128, each of those on the target it adds only (ATTN_TEST_TARGETS,
# tests/support/targets.hpp). The tests that start another program (the attn command,
# Chromium, a CMake consumer) are left out: qemu-user runs one aarch64 process, not those.
set -euo pipefail
build=${1:-build/aarch64}
jobs=${JOBS:-$(nproc)}
not_emulated='^(consumer_find_package|test_cli|test_viz_browser)$'
kernel_tests='^test_(cpu_forward|backward|dropout|decode|paged|weights|weights_forward|contraction|cpu_vector_exp|cpu_widen|explain|state)(:|$)'

run() {
  local bits=$1 targets=$2 select=$3
  echo "test-aarch64: SVE vector length ${bits} bits${targets:+, targets ${targets}}"
  QEMU_CPU="max,sve-default-vector-length=$((bits / 8))" ATTN_TEST_TARGETS="$targets" \
    ctest --test-dir "$build" -j "$jobs" --output-on-failure -E "$not_emulated" $select
  QEMU_CPU="max,sve-default-vector-length=$((bits / 8))" ATTN_TEST_TARGETS="$targets" \
    qemu-aarch64-static -L / "$build/tests/test_explain" --gtest_filter='Explain.NamesTheSimdTargetThatRuns' |
    grep '^SIMD targets'
}

run 512 "" ""
run 256 "SVE_256" "-R $kernel_tests"
run 128 "SVE2_128" "-R $kernel_tests"
