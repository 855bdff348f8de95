// float16 and bfloat16 conversions: every bit pattern, every rounding tie, overflow,
// subnormals and NaN, against values computed from the formats' definitions.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "attn/half.hpp"
#include "core/rows.hpp"

namespace attn {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// The value of a binary16 bit pattern by its definition: sign, 5 exponent bits with bias
// 15, 10 fraction bits; exponent 0 is subnormal (no implicit 1), exponent 31 inf or NaN.
double float16_value(std::uint16_t bits) {
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int fraction = bits & 0x3ff;
  if (exponent == 31) return fraction ? std::nan("") : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(fraction, -24);
  return sign * std::ldexp(1024 + fraction, exponent - 25);
}

bool is_float16_nan(std::uint16_t bits) {
  return (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu);
}
bool is_bfloat16_nan(std::uint16_t bits) {
  return (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu);
}

std::uint16_t half_bits(float x) {
  return to_float16(x).bits;
}
std::uint16_t brain_bits(float x) {
  return to_bfloat16(x).bits;
}

TEST(Float16, EveryPatternWidensExactly) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float got = to_float(float16{b});
    const double want = float16_value(b);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << std::hex << bits;
      EXPECT_EQ(std::signbit(got), (bits & 0x8000u) != 0) << std::hex << bits;
    }
  }
}

TEST(Float16, EveryPatternRoundTrips) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const std::uint16_t back = half_bits(to_float(float16{b}));
    if (is_float16_nan(b)) {
      EXPECT_TRUE(is_float16_nan(back)) << std::hex << bits;
      EXPECT_EQ(back & 0x8000u, b & 0x8000u) << std::hex << bits;
    } else {
      EXPECT_EQ(back, b) << std::hex << bits;
    }
  }
}

// Between each pair of neighbouring finite values (subnormal and normal, both signs): the
// exact midpoint goes to the one with an even last bit, anything off it to the nearer one.
TEST(Float16, TiesRoundToEven) {
  for (std::uint16_t low = 0; low < 0x7bffu; ++low) {
    const auto high = static_cast<std::uint16_t>(low + 1);
    const float a = to_float(float16{low}), b = to_float(float16{high});
    const float middle = (a + b) / 2;  // exact: float has 13 more fraction bits
    const std::uint16_t even = (low & 1u) ? high : low;
    EXPECT_EQ(half_bits(middle), even) << std::hex << low;
    EXPECT_EQ(half_bits(std::nextafter(middle, 0.0f)), low) << std::hex << low;
    EXPECT_EQ(half_bits(std::nextafter(middle, kInfinity)), high) << std::hex << low;
    EXPECT_EQ(half_bits(-middle), even | 0x8000u) << std::hex << low;
  }
}

TEST(Float16, OverflowGoesToInfinity) {
  EXPECT_EQ(half_bits(65504.0f), 0x7bffu);                        // largest finite
  EXPECT_EQ(half_bits(std::nextafter(65520.0f, 0.0f)), 0x7bffu);  // below the midpoint
  EXPECT_EQ(half_bits(65520.0f), 0x7c00u);  // midpoint to 2^16: ties to even, which is inf
  EXPECT_EQ(half_bits(1e6f), 0x7c00u);
  EXPECT_EQ(half_bits(std::numeric_limits<float>::max()), 0x7c00u);
  EXPECT_EQ(half_bits(-1e6f), 0xfc00u);
  EXPECT_EQ(half_bits(kInfinity), 0x7c00u);
  EXPECT_EQ(half_bits(-kInfinity), 0xfc00u);
}

TEST(Float16, Subnormals) {
  EXPECT_EQ(half_bits(0x1p-24f), 0x0001u);                        // smallest subnormal
  EXPECT_EQ(half_bits(0x1p-25f), 0x0000u);                        // tie with 0: even is 0
  EXPECT_EQ(half_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001u);  // just above the tie
  EXPECT_EQ(half_bits(3 * 0x1p-25f), 0x0002u);                    // tie between 1 and 2
  EXPECT_EQ(half_bits(0x1p-26f), 0x0000u);
  EXPECT_EQ(half_bits(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(half_bits(-std::numeric_limits<float>::denorm_min()), 0x8000u);  // keeps sign
  EXPECT_EQ(half_bits(1023 * 0x1p-24f), 0x03ffu);                            // largest subnormal
  EXPECT_EQ(half_bits(0x1p-14f), 0x0400u);                                   // smallest normal
  EXPECT_EQ(half_bits(-0.0f), 0x8000u);
}

TEST(Float16, NaNStaysNaN) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(is_float16_nan(half_bits(quiet)));
  EXPECT_TRUE(is_float16_nan(half_bits(-quiet)));
  EXPECT_EQ(half_bits(-quiet) & 0x8000u, 0x8000u);
  // Payload only in the low bits that float16 drops: still NaN, not infinity.
  EXPECT_TRUE(is_float16_nan(half_bits(std::bit_cast<float>(0x7f800001u))));
  EXPECT_TRUE(std::isnan(to_float(float16{0x7c01u})));
}

TEST(BFloat16, EveryPatternIsTheTopHalfOfAFloat) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float widened = to_float(bfloat16{b});
    if (is_bfloat16_nan(b)) {
      EXPECT_TRUE(std::isnan(widened)) << std::hex << bits;
      EXPECT_TRUE(is_bfloat16_nan(brain_bits(widened))) << std::hex << bits;
    } else {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(widened), bits << 16) << std::hex << bits;
      EXPECT_EQ(brain_bits(widened), b) << std::hex << bits;
    }
  }
}

TEST(BFloat16, TiesRoundToEven) {
  for (std::uint32_t low = 0; low < 0x7f7fu; ++low) {
    const std::uint32_t high = low + 1;
    const float middle = std::bit_cast<float>((low << 16) | 0x8000u);
    const std::uint32_t even = (low & 1u) ? high : low;
    EXPECT_EQ(brain_bits(middle), even) << std::hex << low;
    EXPECT_EQ(brain_bits(std::nextafter(middle, 0.0f)), low) << std::hex << low;
    EXPECT_EQ(brain_bits(std::nextafter(middle, kInfinity)), high) << std::hex << low;
    EXPECT_EQ(brain_bits(-middle), even | 0x8000u) << std::hex << low;
  }
}

TEST(BFloat16, OverflowGoesToInfinity) {
  EXPECT_EQ(brain_bits(std::bit_cast<float>(0x7f7f0000u)), 0x7f7fu);  // largest finite
  EXPECT_EQ(brain_bits(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(brain_bits(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(brain_bits(-std::numeric_limits<float>::max()), 0xff80u);
  EXPECT_EQ(brain_bits(kInfinity), 0x7f80u);
  EXPECT_EQ(brain_bits(-kInfinity), 0xff80u);
}

TEST(BFloat16, Subnormals) {
  EXPECT_EQ(brain_bits(std::numeric_limits<float>::denorm_min()), 0x0000u);  // tie-free: down
  EXPECT_EQ(brain_bits(std::bit_cast<float>(0x00008000u)), 0x0000u);         // tie with 0
  EXPECT_EQ(brain_bits(std::bit_cast<float>(0x00018000u)), 0x0002u);         // tie, 1 is odd
  EXPECT_EQ(brain_bits(std::bit_cast<float>(0x00010000u)), 0x0001u);         // exact
  EXPECT_EQ(brain_bits(-0.0f), 0x8000u);
}

TEST(BFloat16, NaNStaysNaN) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(is_bfloat16_nan(brain_bits(quiet)));
  EXPECT_EQ(brain_bits(-quiet) & 0x8000u, 0x8000u);
  // Payload only in the low 16 bits: truncating would give infinity.
  EXPECT_TRUE(is_bfloat16_nan(brain_bits(std::bit_cast<float>(0x7f800001u))));
  EXPECT_TRUE(is_bfloat16_nan(brain_bits(std::bit_cast<float>(0xff80ffffu))));
}

// A double stored into a float16/bfloat16 tensor, as the reference stores its results.
template <class Half>
std::uint16_t stored_bits(double value) {
  Half out{};
  core::store_row(MutableTensorView(&out, dtype_of<Half>(), {1, 1, 1, 1}), 0, 0, 0, &value);
  return out.bits;
}

// The correctly rounded 16-bit pattern for `value`: of the patterns next to the one found
// through float, the nearest, ties to the even pattern.
template <class Half>
std::uint16_t nearest_bits(double value) {
  const std::uint16_t guess = stored_bits<Half>(value);
  std::uint16_t best = guess;
  for (const int step : {-1, 1}) {
    const auto candidate = static_cast<std::uint16_t>(guess + step);
    if ((candidate & 0x7fffu) == 0 && (guess & 0x7fffu) == 0) continue;  // across zero
    const double distance = std::abs(to_float(Half{candidate}) - value);
    const double best_distance = std::abs(to_float(Half{best}) - value);
    if (distance < best_distance || (distance == best_distance && !(candidate & 1u))) {
      best = candidate;
    }
  }
  return best;
}

// Rounding a double to float and then to float16 rounds twice and can miss by one unit
// just above a tie: 1 + 2^-11 + 2^-40 becomes the float 1 + 2^-11 (a float16 tie), then 1.
TEST(StoredDoubles, RoundOnceNotTwice) {
  EXPECT_EQ(stored_bits<float16>(1 + 0x1p-11 + 0x1p-40), 0x3c01u);
  EXPECT_EQ(stored_bits<float16>(1 + 0x1p-11 - 0x1p-40), 0x3c00u);
  EXPECT_EQ(stored_bits<float16>(1 + 0x1p-11), 0x3c00u);  // an exact tie goes to even
  EXPECT_EQ(stored_bits<bfloat16>(1 + 0x1p-8 + 0x1p-40), 0x3f81u);
  EXPECT_EQ(stored_bits<bfloat16>(1 + 0x1p-8), 0x3f80u);
  EXPECT_EQ(stored_bits<float16>(1e300), 0x7c00u);
  EXPECT_EQ(stored_bits<bfloat16>(-1e300), 0xff80u);
  EXPECT_TRUE(is_float16_nan(stored_bits<float16>(NAN)));
}

TEST(StoredDoubles, RandomValuesAreCorrectlyRounded) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::uniform_int_distribution<int> exponent(-26, 14);  // |value| < 2^15: no overflow
  for (int i = 0; i < 20000; ++i) {
    const double value = std::ldexp(mantissa(rng), exponent(rng));
    EXPECT_EQ(stored_bits<float16>(value), nearest_bits<float16>(value)) << value;
    EXPECT_EQ(stored_bits<bfloat16>(value), nearest_bits<bfloat16>(value)) << value;
  }
}

}  // namespace
}  // namespace attn
