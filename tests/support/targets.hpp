// Runs a test body once per SIMD target compiled into the kernels that this CPU supports.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/forward/forward.hpp"

namespace attn::testing {

// Whether ATTN_TEST_TARGETS (names as Highway spells them, space-separated: "SVE_256
// SVE2_128") lets a test run `target`; unset, every target runs. Under emulation, where
// each target costs minutes, a second vector length runs only the targets it adds
// (scripts/test-aarch64.sh).
inline bool target_wanted(std::int64_t target) {
  const char* wanted = std::getenv("ATTN_TEST_TARGETS");
  if (wanted == nullptr || wanted[0] == '\0') return true;
  const std::string list = std::string(" ") + wanted + " ";
  return list.find(std::string(" ") + hwy::TargetName(target) + " ") != std::string::npos;
}

// Runs the body once per compiled target this CPU supports (and target_wanted), forcing
// that target; a body taking an argument is given the target (an HWY_* bit).
template <class Body>
void for_each_target(Body&& body) {
  const std::vector<std::int64_t> targets = cpu::compiled_targets();
  ASSERT_FALSE(targets.empty());
  int ran = 0;
  for (const std::int64_t target : targets) {
    if (!target_wanted(target)) continue;
    ++ran;
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    if constexpr (std::is_invocable_v<Body&, std::int64_t>) {
      body(target);
    } else {
      body();
    }
    hwy::SetSupportedTargetsForTest(0);
  }
  ASSERT_GT(ran, 0) << "ATTN_TEST_TARGETS names no target this CPU runs";
}

}  // namespace attn::testing
