// The kernels' widening of 16-bit rows (to_floats-inl.h) and of fp8 cache rows
// (stored_rows-inl.h) to float32 over an array, for tests.
#pragma once

#include <cstddef>

#include "attn/half.hpp"
#include "core/float8.hpp"

namespace attn::cpu {

// out[i] = in[i] as float32 on the best Highway target (or the one a test forces).
void widen_array(const float16* in, float* out, std::size_t count);
void widen_array(const bfloat16* in, float* out, std::size_t count);
void widen_array(const float8_e4m3* in, float* out, std::size_t count);
void widen_array(const float8_e5m2* in, float* out, std::size_t count);

}  // namespace attn::cpu
