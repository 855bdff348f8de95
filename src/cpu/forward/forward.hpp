// The fast CPU forward kernel: flash-style tiles merged by the online softmax
// (docs/architecture.md), SIMD through Highway with run-time target choice, threads through
// OpenMP, on the plan's items and chunks (cpu/plan/plan.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace attn::cpu {

// Whether the forward kernel writes the weights output itself: when it is float32 (its rows
// hold the shaped scores until each row's lse is known). Other dtypes go to cpu::weights
// with the kernel's lse, which walks the same chunks by the same scorer.
inline bool keeps_weights(const core::Problem& problem) {
  return problem.outputs.weights && problem.outputs.weights->dtype == DType::f32;
}

// Fills problem.outputs.context and, when present, problem.outputs.lse and a float32
// problem.outputs.weights (any other weights output must be absent). Requires
// unsupported(problem) empty (cpu/plan/support.hpp). Bitwise identical results for any
// thread count.
void forward(const core::Problem& problem);

// The plan forward runs the problem by on this CPU's best target (Plan::describe).
std::string describe_plan(const core::Problem& problem);

// Highway targets (HWY_AVX2, ...) compiled into the kernel that this CPU can run, for
// tests that force each one with hwy::SetSupportedTargetsForTest.
std::vector<std::int64_t> compiled_targets();

}  // namespace attn::cpu
