// The fast CPU forward kernel: flash-style tiles merged by the online softmax
// (docs/architecture.md), SIMD through Highway with run-time target choice, threads through OpenMP.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace attn::cpu {

// Whether the forward kernel writes the weights output itself: when it is float32, the
// kernel keeps each tile's shaped scores and writes them as weights when each row ends
// (what the weights pass gives from its lse, from the same scores, without scoring
// again). Other dtypes go through the weights pass.
inline bool keeps_weights(const core::Problem& problem) {
  return problem.outputs.weights && problem.outputs.weights->dtype == DType::f32;
}

// Empty when the fast kernel serves the problem; else what it does not support, e.g.
// "weights output in float16". Float64 inputs go to the reference, which computes in
// float64.
std::string unsupported(const core::Problem& problem);
inline bool supports(const core::Problem& problem) {
  return unsupported(problem).empty();
}

// Fills problem.outputs.context and, when present, problem.outputs.lse and (float32)
// problem.outputs.weights. Requires supports(problem). Bitwise identical results for any
// thread count.
void forward(const core::Problem& problem);

// Highway targets (HWY_AVX2, ...) compiled into the kernel that this CPU can run, for
// tests that force each one with hwy::SetSupportedTargetsForTest.
std::vector<std::int64_t> compiled_targets();

}  // namespace attn::cpu
