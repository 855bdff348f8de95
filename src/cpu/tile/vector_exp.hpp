// The kernels' vector exp (vector_exp-inl.h) over an array, for tests and benches.
#pragma once

#include <cstddef>

namespace attn::cpu {

// out[i] = exp(in[i]) on the best Highway target (or the one a test forces).
void exp_array(const float* in, float* out, std::size_t count);

}  // namespace attn::cpu
