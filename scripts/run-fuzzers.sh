#!/usr/bin/env bash
# run-fuzzers.sh BUILD_DIR SECONDS NAME...: runs each fuzzer BUILD_DIR/fuzz/fuzz_NAME for
# SECONDS from its seeds (fuzz/corpus/NAME) and the inputs it kept from earlier runs
# (BUILD_DIR/corpus/NAME), then prints its executions. A crash, a sanitizer report, an
# input slower than 30 s or a leak stops here with the fuzzer's report, the input that did
# it saved under BUILD_DIR/crashes/, and a failing exit status.
set -euo pipefail
build=$1 seconds=$2
shift 2
mkdir -p "$build/crashes"
for name in "$@"; do
  mkdir -p "$build/corpus/$name"
  log="$build/fuzz_$name.log"
  if ! "$build/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=30 -print_final_stats=1 \
      -artifact_prefix="$build/crashes/$name-" "$build/corpus/$name" "fuzz/corpus/$name" \
      >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz_$name: FAILED (log: $log)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  echo "fuzz_$name: ${seconds} s, $runs runs, $speed runs/s, no failure"
done
