#!/usr/bin/env bash
# The aarch64 build's tests under qemu-user, each target once (ATTN_TEST_TARGETS,
# tests/support/targets.hpp) at the vector length a CPU runs it at or the one that costs
# least to emulate:
# - 512 bits: SVE, as on A64FX.
# - 256 bits: SVE_256, as on Neoverse V1 (Graviton3).
# - 128 bits: SVE2_128, as on Neoverse V2 (Graviton4, Grace); NEON; and the scalable SVE2 and
#   SVE, whose code must hold at any length (a block sum once held only at 512 bits). qemu
#   runs 128-bit SVE 5-7 times faster than 256-bit.
# - `test-aarch64.sh BUILD` (`make test-aarch64`): at 512 bits every test; at 256 and 128 the
#   kernel tests. The tests that start another program (the attn command, Chromium, a CMake
#   consumer) are left out: qemu-user runs one aarch64 process, not those.
# - `test-aarch64.sh BUILD quick` (`make test-aarch64-quick`, which CI runs): at 256 and 128
#   bits the kernels' quick case list against float64 and their bitwise promises (any thread
#   count gives the same bits; weights are forward's), at 512 bits a sample of it (below).
set -euo pipefail
build=${1:-build/aarch64}
mode=${2:-all}
jobs=${JOBS:-$(nproc)}
case "$mode" in
  all | quick) ;;
  *) echo "test-aarch64: expected the mode all or quick, given \"$mode\"" >&2; exit 2 ;;
esac
not_emulated='^(consumer_find_package|test_cli|test_viz_browser)$'
kernel_tests='^test_(cpu_forward|backward|dropout|decode|paged|weights|weights_forward|contraction|cpu_softmax|cpu_vector_exp|cpu_widen|float8|explain|state)(:|$)'

# The binaries that every selection runs whole: decode's two tests, then the short ones.
whole_tests=(
  "test_decode Decode.EveryTargetDecodesEveryStorageDtype:Decode.SpeculativeStepsOverSplitSequencesAreExactAndThreadCountFree"
  "test_cpu_softmax *"
  "test_dropout DropoutKernels.*"
  "test_contraction *"
  "test_cpu_vector_exp *"
  "test_cpu_widen *"
  "test_float8 *"
  "test_state *"
)

# The quick selection: each test binary with its gtest filter, the longest first (test_paged
# in three parts), so that the last binaries to start are short ones.
quick_tests=(
  "test_paged Paged.MatchesTheReferenceForEveryLayoutDtypePageSizeAndOption"
  "test_paged Paged.ScaledCodesMatchTheReferenceOnEveryTarget"
  "test_paged Paged.EachSequencesBitsAreItsOwnOnEveryTarget:Paged.PrefillRunsGiveTheBitsOfOneQueryAtATimeForEveryTailOfD"
  "test_weights Cases/*:WeightsThreads.*"
  "test_backward Cases/*:FastBackwardThreads.*"
  "test_weights_forward Cases/*"
  "test_cpu_forward Cases/*:FastForwardThreads.*"
  "${whole_tests[@]}"
)

# At 512 bits, where SVE alone runs (A64FX is the one CPU that runs it there, and the 128-bit
# stage runs the same SVE code over every case), a sample: an entry's third field N runs
# gtest's shard 0 of N, a third of each case list that holds 2 of the 6 narrow-row cases of
# every tail of d (tests/support/cases.cpp) for each test of the binary; of paged attention,
# its tails of d.
sampled_tests=(
  "test_weights Cases/*:WeightsThreads.* 3"
  "test_backward Cases/*:FastBackwardThreads.* 3"
  "test_paged Paged.PrefillRunsGiveTheBitsOfOneQueryAtATimeForEveryTailOfD"
  "test_weights_forward Cases/* 3"
  "test_cpu_forward Cases/*:FastForwardThreads.* 3"
  "${whole_tests[@]}"
)

emulate() {
  local bits=$1 targets=$2
  shift 2
  QEMU_CPU="max,sve-default-vector-length=$((bits / 8))" ATTN_TEST_TARGETS="$targets" "$@"
}

# One binary of the quick selection; its output is printed only when it fails.
run_one() {
  local bits=$1 targets=$2 name=$3 filter=$4 shards=${5:-1} log start=$SECONDS status=0
  log=$(mktemp)
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=0 emulate "$bits" "$targets" \
    qemu-aarch64-static -L / "$build/tests/$name" --gtest_brief=1 --gtest_filter="$filter" \
    >"$log" 2>&1 || status=$?
  if [ "$status" -eq 0 ]; then
    echo "  $name: $(grep -o '[0-9]* tests\? from .* ran' "$log") ($((SECONDS - start)) s)"
  else
    echo "  $name FAILED (exit status $status):"
    cat "$log"
  fi
  rm -f "$log"
  return "$status"
}

# A selection (quick_tests or sampled_tests, named by the third argument) at one vector
# length, `jobs` binaries at a time (each emulates one thread but in the thread-count tests).
run_quick() {
  local bits=$1 targets=$2 running=0 failed=0 entry name filter shards
  local -n selection=$3
  for entry in "${selection[@]}"; do
    read -r name filter shards <<<"$entry"
    run_one "$bits" "$targets" "$name" "$filter" "$shards" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      wait -n || failed=1
      running=$((running - 1))
    fi
  done
  while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
  done
  return "$failed"
}

run() {
  local bits=$1 targets=$2 select=$3 list=${4:-quick_tests}
  echo "test-aarch64: SVE vector length ${bits} bits${targets:+, targets ${targets}}"
  if [ "$mode" = quick ]; then
    run_quick "$bits" "$targets" "$list"
  else
    emulate "$bits" "$targets" ctest --test-dir "$build" -j "$jobs" --output-on-failure \
      -E "$not_emulated" $select
  fi
  emulate "$bits" "$targets" qemu-aarch64-static -L / "$build/tests/test_explain" \
    --gtest_filter='Explain.NamesTheSimdTargetThatRuns' | grep '^SIMD targets'
}

if [ "$mode" = quick ]; then
  quick_binaries=()
  for entry in "${quick_tests[@]}"; do quick_binaries+=("${entry%% *}"); done
  cmake --build "$build" -j "$jobs" --target "${quick_binaries[@]}" test_explain
fi
# SCALAR is left out: an aarch64 CPU always has NEON, so Highway never dispatches to it there,
# and its code is the portable C++ that make test runs natively on x86.
run 512 "SVE" "" sampled_tests
run 256 "SVE_256" "-R $kernel_tests"
run 128 "SVE2_128 SVE2 SVE NEON" "-R $kernel_tests"
