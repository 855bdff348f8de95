// 8-bit floating-point storage types of a KV cache, as vLLM's fp8 caches and PyTorch's
// float8_e4m3fn / float8_e5m2: E4M3 (no infinities; largest finite 448) and E5M2 (IEEE-like;
// largest finite 57344). Like float16, they only carry bits in and out of memory: a cache
// stores only finite values of them, so the kernels' exact widening (cpu/tile/stored_rows-inl.h)
// never meets an infinity or a NaN code.
#pragma once

#include <bit>
#include <cstdint>

namespace attn {

template <int kExponentBits>
struct Float8 {
  static constexpr int kMantissaBits = 7 - kExponentBits;
  static constexpr int kBias = (1 << (kExponentBits - 1)) - 1;
  // The code of the largest finite magnitude: E4M3 keeps exponent 15 for finite values
  // (only mantissa 111 there is NaN), E5M2 keeps exponent 31 for infinities and NaN.
  static constexpr std::uint8_t kLargestCode = kExponentBits == 4 ? 0x7e : 0x7b;
  std::uint8_t bits = 0;
};

using float8_e4m3 = Float8<4>;
using float8_e5m2 = Float8<5>;

// Exact (every finite code is a float32); by bits, inline, so that kernels built without a
// C library (tests/emulated) read fp8 rows too.
template <int kExponentBits>
inline float to_float(Float8<kExponentBits> value) {
  using F = Float8<kExponentBits>;
  constexpr int kMantissa = F::kMantissaBits;
  constexpr float kSubnormalStep = kExponentBits == 4 ? 0x1p-9f : 0x1p-16f;  // 2^(1-bias-M)
  const int exponent = (value.bits & 0x7f) >> kMantissa;
  const int mantissa = value.bits & ((1 << kMantissa) - 1);
  const float magnitude =
      exponent == 0 ? static_cast<float>(mantissa) * kSubnormalStep
                    : std::bit_cast<float>(static_cast<std::uint32_t>(
                          ((exponent - F::kBias + 127) << 23) | (mantissa << (23 - kMantissa))));
  return (value.bits & 0x80) != 0 ? -magnitude : magnitude;
}
// x rounded to the nearest code, ties to even, magnitudes past the largest finite one
// saturating to it (as vLLM's fp8 quantisation clamps); x must be finite.
float8_e4m3 to_float8_e4m3(double x);
float8_e5m2 to_float8_e5m2(double x);

}  // namespace attn
