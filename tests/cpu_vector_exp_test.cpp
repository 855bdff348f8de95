// The kernels' vector exp: its documented max error (vector_exp-inl.h) over its whole
// valid range, and its edges, on every compiled target this CPU runs.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/forward/forward.hpp"
#include "cpu/tile/vector_exp.hpp"

namespace attn {
namespace {

constexpr float kLowest = -87.33654f, kHighest = 88.0f;
constexpr double kMaxUlp = 2.0;

// Error in units of the last place of the float nearest the exact value.
double ulp_error(float got, double want) {
  const float nearest = static_cast<float>(want);
  const double ulp = std::nextafter(nearest, std::numeric_limits<float>::infinity()) - nearest;
  return std::abs(static_cast<double>(got) - want) / ulp;
}

TEST(VectorExp, WithinTwoUlpOverTheValidRange) {
  // Every 2039th float bit pattern on each side of 0 (about a million points, dense near
  // 0 as the floats are), plus the ends of the range.
  std::vector<float> in;
  const auto sweep = [&](float end, float sign) {
    std::uint32_t last = 0;
    std::memcpy(&last, &end, sizeof last);
    last &= 0x7fffffffu;
    for (std::uint32_t bits = 0; bits < last; bits += 2039) {
      float x = 0.0f;
      std::memcpy(&x, &bits, sizeof x);
      in.push_back(sign * x);
    }
  };
  sweep(kLowest, -1.0f);
  sweep(kHighest, 1.0f);
  in.push_back(kLowest);
  in.push_back(kHighest);
  std::vector<float> out(in.size());
  for (const std::int64_t target : cpu::compiled_targets()) {
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    cpu::exp_array(in.data(), out.data(), in.size());
    double worst = 0.0;
    float worst_at = 0.0f;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const double e = ulp_error(out[i], std::exp(static_cast<double>(in[i])));
      if (e > worst) worst = e, worst_at = in[i];
    }
    EXPECT_LE(worst, kMaxUlp) << "at x = " << worst_at;
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(VectorExp, EdgesOfTheRange) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {-inf,    -1e30f,
                                 -100.0f, std::nextafter(kLowest, -inf),
                                 0.0f,    std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> out(in.size());
  for (const std::int64_t target : cpu::compiled_targets()) {
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    cpu::exp_array(in.data(), out.data(), in.size());
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(out[i], 0.0f) << "exp(" << in[i] << ")";
    EXPECT_EQ(out[4], 1.0f);
    EXPECT_TRUE(std::isnan(out[5]));
    hwy::SetSupportedTargetsForTest(0);
  }
}

}  // namespace
}  // namespace attn
