// 16-bit floating-point storage types. Arithmetic always happens in float32 or wider; these
// types only carry bits in and out of memory.
#pragma once

#include <cstdint>

namespace attn {

struct float16 {
  std::uint16_t bits = 0;
};

struct bfloat16 {
  std::uint16_t bits = 0;
};

// Round-to-nearest-even conversions; NaN and infinities are preserved.
float to_float(float16 value);
float to_float(bfloat16 value);
float16 to_float16(float value);
bfloat16 to_bfloat16(float value);

}  // namespace attn
