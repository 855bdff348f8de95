// Scalar float16/bfloat16 conversions (IEEE 754 binary16; bfloat16 is the top half of a
// float32). The fast kernels convert whole vectors through Highway; these serve I/O and
// the reference.
#include <bit>
#include <cstdint>

#include "attn/half.hpp"

namespace attn {

float to_float(float16 value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (value.bits >> 10) & 0x1fu;
  std::uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal half: value = mantissa * 2^-24, exact in float32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

float to_float(bfloat16 value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

float16 to_float16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf or NaN; keep NaN quiet and non-zero
    const std::uint16_t payload = magnitude > 0x7f800000u ? 0x200u : 0u;
    return float16{static_cast<std::uint16_t>(sign | 0x7c00u | payload)};
  }
  if (magnitude >= 0x477ff000u) return float16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (magnitude < 0x38800000u) {
    // Result is subnormal or zero: scale so that rounding to an integer is the rounding to
    // the nearest multiple of 2^-24 (ties to even, by the FPU's default rounding).
    const float scaled = std::bit_cast<float>(magnitude) * 0x1p24f;
    const auto rounded = static_cast<std::uint32_t>(__builtin_rintf(scaled));
    return float16{static_cast<std::uint16_t>(sign | rounded)};
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rebiased = magnitude - (112u << 23);
  const std::uint32_t round_bit = (rebiased >> 13) & 1u;
  const std::uint32_t rounded = (rebiased + 0xfffu + round_bit) >> 13;
  return float16{static_cast<std::uint16_t>(sign | rounded)};
}

bfloat16 to_bfloat16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return bfloat16{static_cast<std::uint16_t>((bits >> 16) | 0x40u)};
  }
  const std::uint32_t round_bit = (bits >> 16) & 1u;
  return bfloat16{static_cast<std::uint16_t>((bits + 0x7fffu + round_bit) >> 16)};
}

}  // namespace attn
