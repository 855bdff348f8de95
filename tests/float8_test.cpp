// fp8 cache elements (core/float8.hpp): every code's value, rounding to nearest with ties to
// even and saturation, against the formats' definitions and a search over every code; and
// the kernels' widening of fp8 rows (cpu/tile/stored_rows-inl.h) on every target.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/float8.hpp"
#include "cpu/tile/widen.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::for_each_target;

// The value of a code by the OCP 8-bit float definitions, NaN for codes that hold no finite
// number: sign, E exponent bits with bias 2^(E-1) - 1, 7 - E fraction bits; exponent 0 is
// subnormal. E4M3 has no infinities (only S.1111.111 is NaN); E5M2 keeps exponent 31 for
// infinities and NaN.
template <class F>
double definition(std::uint8_t bits) {
  constexpr int kExponentBits = 7 - F::kMantissaBits, kFraction = F::kMantissaBits;
  const int bias = (1 << (kExponentBits - 1)) - 1;
  const int exponent = (bits >> kFraction) & ((1 << kExponentBits) - 1);
  const int fraction = bits & ((1 << kFraction) - 1);
  const double sign = (bits & 0x80) != 0 ? -1.0 : 1.0;
  const int top = (1 << kExponentBits) - 1;
  if (kExponentBits == 4 ? (exponent == top && fraction == (1 << kFraction) - 1)
                         : exponent == top) {
    return std::nan("");
  }
  if (exponent == 0) return sign * std::ldexp(fraction, 1 - bias - kFraction);
  return sign * std::ldexp((1 << kFraction) + fraction, exponent - bias - kFraction);
}

template <class F>
std::vector<std::uint8_t> finite_codes() {
  std::vector<std::uint8_t> codes;
  for (int bits = 0; bits < 256; ++bits) {
    if (!std::isnan(definition<F>(static_cast<std::uint8_t>(bits)))) {
      codes.push_back(static_cast<std::uint8_t>(bits));
    }
  }
  return codes;
}

template <class F>
std::uint8_t narrow(double x) {
  if constexpr (F::kMantissaBits == 3) {
    return to_float8_e4m3(x).bits;
  } else {
    return to_float8_e5m2(x).bits;
  }
}

// The code nearest x by a search over every finite code: ties to the even code, magnitudes
// past the largest finite code saturating, the sign of x kept on zero.
template <class F>
std::uint8_t nearest_code(double x) {
  if (std::abs(x) >= definition<F>(F::kLargestCode)) {
    return static_cast<std::uint8_t>((std::signbit(x) ? 0x80 : 0) | F::kLargestCode);
  }
  int best = -1;
  double best_distance = INFINITY;
  for (const std::uint8_t code : finite_codes<F>()) {
    if (((code & 0x80) != 0) != std::signbit(x)) continue;
    const double distance = std::abs(definition<F>(code) - x);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<std::uint8_t>(best);
}

template <class F>
void expect_every_code_exact() {
  const std::vector<std::uint8_t> codes = finite_codes<F>();
  EXPECT_EQ(codes.size(), F::kMantissaBits == 3 ? 254u : 248u);
  for (const std::uint8_t code : codes) {
    const double want = definition<F>(code);
    EXPECT_EQ(static_cast<double>(to_float(F{code})), want) << "code " << int{code};
    EXPECT_EQ(narrow<F>(want), code) << "code " << int{code};
  }
  EXPECT_EQ(static_cast<double>(to_float(F{F::kLargestCode})),
            F::kMantissaBits == 3 ? 448.0 : 57344.0);
}

TEST(Float8, EveryE4m3CodeWidensToItsDefinitionAndBack) {
  expect_every_code_exact<float8_e4m3>();
}

TEST(Float8, EveryE5m2CodeWidensToItsDefinitionAndBack) {
  expect_every_code_exact<float8_e5m2>();
}

// Every midpoint between neighbouring codes (a tie), a hair either side of it, values past
// the largest code, below half the smallest subnormal, and random magnitudes over the whole
// range, against the search.
template <class F>
void expect_rounding_of_the_search() {
  std::vector<double> xs;
  std::vector<double> values;
  for (const std::uint8_t code : finite_codes<F>()) {
    if ((code & 0x80) == 0) values.push_back(definition<F>(code));
  }
  std::sort(values.begin(), values.end());
  for (std::size_t i = 0; i + 1 < values.size(); ++i) {
    const double mid = (values[i] + values[i + 1]) / 2;
    for (const double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, INFINITY)}) {
      xs.push_back(x);
    }
  }
  const double largest = values.back();
  for (const double x : {largest * 1.03, largest * 1.2, 1e30, values[1] / 2.5, 1e-30, 0.0}) {
    xs.push_back(x);
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> exponent(-20.0, 18.0);
  for (int i = 0; i < 2000; ++i) xs.push_back(std::exp2(exponent(rng)));
  for (const double x : xs) {
    for (const double signed_x : {x, -x}) {
      ASSERT_EQ(int{narrow<F>(signed_x)}, int{nearest_code<F>(signed_x)}) << "x " << signed_x;
    }
  }
}

TEST(Float8, E4m3RoundsToTheNearestCodeTiesToEvenAndSaturates) {
  expect_rounding_of_the_search<float8_e4m3>();
}

TEST(Float8, E5m2RoundsToTheNearestCodeTiesToEvenAndSaturates) {
  expect_rounding_of_the_search<float8_e5m2>();
}

// The kernels' widening of every finite code, in rows of every length up to 70 (each tail of
// the vector width) and from each start, on every target this CPU runs.
template <class F>
void expect_rows_widened_exactly() {
  const std::vector<std::uint8_t> codes = finite_codes<F>();
  std::vector<F> in;
  for (const std::uint8_t code : codes) in.push_back(F{code});
  for_each_target([&] {
    for (std::size_t start = 0; start < 8; ++start) {
      for (std::size_t n = 1; n <= 70; ++n) {
        std::vector<float> out(n + 1, -1.0f);
        const std::size_t first = (start * 37 + n) % (in.size() - n);
        cpu::widen_array(in.data() + first, out.data(), n);
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]),
                    std::bit_cast<std::uint32_t>(to_float(in[first + i])))
              << "code " << int{in[first + i].bits} << ", row of " << n;
        }
        ASSERT_EQ(out[n], -1.0f) << "wrote past a row of " << n;
      }
    }
    std::vector<float> all(in.size());
    cpu::widen_array(in.data(), all.data(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(static_cast<double>(all[i]), definition<F>(in[i].bits));
    }
  });
}

TEST(Float8, KernelsWidenEveryE4m3CodeOnEveryTarget) {
  expect_rows_widened_exactly<float8_e4m3>();
}

TEST(Float8, KernelsWidenEveryE5m2CodeOnEveryTarget) {
  expect_rows_widened_exactly<float8_e5m2>();
}

}  // namespace
}  // namespace attn
