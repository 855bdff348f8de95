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

// AVX-512 rounds n with vrndscaleps and scales by vscalefps; AVX2 adds and subtracts 1.5 *
// 2^23 and builds 2^n from the sum's bits. Both fuse their multiply-adds, so they must give
// the same bits: every 2039th float, and around each tie of x log2 e (k + 1/2, where the
// two roundings could part). On a CPU without AVX-512 only AVX2 runs here (the emulated
// suite, tests/python/test_emulated_tile_core.py, runs the AVX-512 exp against float64).
TEST(VectorExp, Avx512GivesAvx2sBits) {
  std::vector<float> in;
  for (std::uint32_t bits = 0; bits < 0x7f800000u; bits += 2039) {
    float x = 0.0f;
    std::memcpy(&x, &bits, sizeof x);
    if (x > 100.0f) break;
    in.push_back(x);
    in.push_back(-x);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (int k = -127; k <= 127; ++k) {
    float x = static_cast<float>((k + 0.5) / std::log2(std::exp(1.0)));
    for (int i = 0; i < 4; ++i) x = std::nextafter(x, -inf);
    for (int i = 0; i < 9; ++i, x = std::nextafter(x, inf)) in.push_back(x);
  }
  std::vector<float> want(in.size()), got(in.size());
  bool have_want = false;
  for (const std::int64_t target : cpu::compiled_targets()) {
    if (target > HWY_AVX2) continue;  // SSE4 and the emulated targets round the product first
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    cpu::exp_array(in.data(), (have_want ? got : want).data(), in.size());
    hwy::SetSupportedTargetsForTest(0);
    if (have_want) {
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
    }
    have_want = true;
  }
}

}  // namespace
}  // namespace attn
