#!/usr/bin/env bash
# `make mutants`: do the tests catch the bugs they claim to? Each patch in mutants/ plants
# one small bug. For each, in a scratch copy of the tree: apply it, rebuild the test
# binaries its header names ("# tests: test_a test_b"), run them, and undo it. A mutant
# whose tests all pass survived. Exits 1 when a mutant survives or a patch no longer
# applies (the code it mutates moved: mend the patch).
#
# The build compiles the kernels for this CPU's SIMD target only (HWY_COMPILE_ONLY_STATIC
# with -march=native): every mutant is in code that all targets share, and one target
# instead of five makes each rebuild minutes shorter.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tree=$root/build/mutants/tree
build=$root/build/mutants/build
jobs=${JOBS:-$(nproc)}

mkdir -p "$tree" "$build"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$tree"
cmake -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="-march=native -DHWY_COMPILE_ONLY_STATIC" >/dev/null

caught=0
survived=()
broken=()
for patch in "$root"/mutants/*.patch; do
  name=$(basename "$patch" .patch)
  tests=$(sed -n 's/^# tests: //p' "$patch")
  if ! (cd "$tree" && patch -s -p1 --dry-run <"$patch" >/dev/null); then
    echo "mutant $name: patch does not apply"
    broken+=("$name")
    continue
  fi
  (cd "$tree" && patch -s -p1 <"$patch")
  # shellcheck disable=SC2086
  if ! cmake --build "$build" -j "$jobs" --target $tests >"$build/$name.log" 2>&1; then
    echo "mutant $name: does not build (see $build/$name.log)"
    broken+=("$name")
  else
    passed=true
    for t in $tests; do
      if ! "$build/tests/$t" --gtest_brief=1 >>"$build/$name.log" 2>&1; then
        passed=false
        break
      fi
    done
    if $passed; then
      echo "mutant $name: SURVIVED ($tests all pass)"
      survived+=("$name")
    else
      echo "mutant $name: caught by $t"
      caught=$((caught + 1))
    fi
  fi
  (cd "$tree" && patch -s -R -p1 <"$patch")
done

echo "mutants: $caught caught, ${#survived[@]} survived, ${#broken[@]} broken"
[ ${#survived[@]} -eq 0 ] && [ ${#broken[@]} -eq 0 ]
