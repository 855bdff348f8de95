// The kernels' widening of 16-bit rows to float32 (to_floats-inl.h) over an array, for
// tests.
#pragma once

#include <cstddef>

#include "attn/half.hpp"

namespace attn::cpu {

// out[i] = in[i] as float32 on the best Highway target (or the one a test forces).
void widen_array(const float16* in, float* out, std::size_t count);
void widen_array(const bfloat16* in, float* out, std::size_t count);

}  // namespace attn::cpu
