// Runs a test body once per SIMD target compiled into the kernels that this CPU supports.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/forward/forward.hpp"

namespace attn::testing {

// Runs the body once per compiled target this CPU supports, forcing that target; a body
// taking an argument is given the target (an HWY_* bit).
template <class Body>
void for_each_target(Body&& body) {
  const std::vector<std::int64_t> targets = cpu::compiled_targets();
  ASSERT_FALSE(targets.empty());
  for (const std::int64_t target : targets) {
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    if constexpr (std::is_invocable_v<Body&, std::int64_t>) {
      body(target);
    } else {
      body();
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

}  // namespace attn::testing
