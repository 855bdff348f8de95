// Runs a test body once per SIMD target compiled into the kernels that this CPU supports.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/bf16_dot.hpp"
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
// that target; a body taking an argument is given the target (an HWY_* bit). On a CPU with
// AVX512-BF16 the plain AVX-512 target (HWY_AVX3) runs twice, with the CPU model's answer to
// "does vdpbf16ps pay?" (cpu::bf16_dot_pays) and with the other, so that both the vdpbf16ps
// kernels and their float32 twins run on every such CPU: Debian's Highway (1.0.3) compiles
// no other AVX-512 target to take one of the two.
template <class Body>
void for_each_target(Body&& body) {
  const std::vector<std::int64_t> targets = cpu::compiled_targets();
  ASSERT_FALSE(targets.empty());
  const bool model_pays = cpu::bf16_dot_pays();
  int ran = 0;
  for (const std::int64_t target : targets) {
    if (!target_wanted(target)) continue;
    ++ran;
    const bool both = target == HWY_AVX3 && cpu::has_bf16_dot();
    for (const bool pays : {model_pays, !model_pays}) {
      if (pays != model_pays && !both) continue;
      SCOPED_TRACE(std::string("target ") + hwy::TargetName(target) +
                   (cpu::has_bf16_dot() ? (pays ? ", vdpbf16ps" : ", no vdpbf16ps") : ""));
      hwy::SetSupportedTargetsForTest(target);
      cpu::set_bf16_dot_pays_for_test(pays);
      if constexpr (std::is_invocable_v<Body&, std::int64_t>) {
        body(target);
      } else {
        body();
      }
      cpu::set_bf16_dot_pays_for_test(std::nullopt);
      hwy::SetSupportedTargetsForTest(0);
    }
  }
  ASSERT_GT(ran, 0) << "ATTN_TEST_TARGETS names no target this CPU runs";
}

}  // namespace attn::testing
