#include "core/float8.hpp"

#include <algorithm>
#include <cmath>

namespace attn {
namespace {

template <class F>
F narrow(double x) {
  constexpr int kMantissa = F::kMantissaBits, kSmallestExponent = 1 - F::kBias;
  const auto sign = static_cast<std::uint8_t>(std::signbit(x) ? 0x80 : 0);
  const double magnitude = std::abs(x);
  if (magnitude >= to_float(F{F::kLargestCode})) {
    return F{static_cast<std::uint8_t>(sign | F::kLargestCode)};
  }
  // The spacing of codes in magnitude's binade (or the subnormals'), so that rounding is one
  // exact division by a power of two and one nearbyint (ties to even).
  const int exponent =
      magnitude == 0.0 ? kSmallestExponent : std::max(std::ilogb(magnitude), kSmallestExponent);
  const auto steps = static_cast<int>(std::nearbyint(std::ldexp(magnitude, kMantissa - exponent)));
  // A subnormal's code is its step count; a normal's is its biased exponent and mantissa, a
  // count that rounded up to 2^(M+1) carrying into the exponent.
  const int code = magnitude < std::ldexp(1.0, kSmallestExponent)
                       ? steps
                       : ((exponent + F::kBias) << kMantissa) + steps - (1 << kMantissa);
  return F{static_cast<std::uint8_t>(sign | code)};
}

}  // namespace

float8_e4m3 to_float8_e4m3(double x) {
  return narrow<float8_e4m3>(x);
}

float8_e5m2 to_float8_e5m2(double x) {
  return narrow<float8_e5m2>(x);
}

}  // namespace attn
