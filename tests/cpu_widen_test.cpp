// The kernels' widening of float16 and bfloat16 to float32 (to_floats-inl.h): every bit
// pattern, on every compiled target this CPU runs, against the scalar conversion of
// attn/half.hpp. Infinities and NaN stay what they are on targets without a hardware
// conversion too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attn/half.hpp"
#include "cpu/tile/widen.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::for_each_target;

constexpr std::size_t kPatterns = 1 << 16;

std::uint32_t bits_of(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// NaN for NaN (any payload), else the same bits (so -0 stays -0).
template <class Half>
void expect_every_pattern_widened_exactly() {
  std::vector<Half> in(kPatterns);
  for (std::size_t i = 0; i < kPatterns; ++i) in[i].bits = static_cast<std::uint16_t>(i);
  for_each_target([&] {
    std::vector<float> out(kPatterns, 0.0f);
    cpu::widen_array(in.data(), out.data(), kPatterns);
    int wrong = 0;
    for (std::size_t i = 0; i < kPatterns && wrong < 5; ++i) {
      const float want = to_float(in[i]);
      const bool same = std::isnan(want) ? std::isnan(out[i]) : bits_of(out[i]) == bits_of(want);
      if (!same) {
        ++wrong;
        ADD_FAILURE() << "bits 0x" << std::hex << i << ": got " << out[i] << ", want " << want;
      }
    }
  });
}

TEST(Widen, EveryFloat16PatternOnEveryTarget) {
  expect_every_pattern_widened_exactly<float16>();
}

TEST(Widen, EveryBfloat16PatternOnEveryTarget) {
  expect_every_pattern_widened_exactly<bfloat16>();
}

}  // namespace
}  // namespace attn
