#include "cpu/plan/support.hpp"

#include <string>

namespace attn::cpu {

std::string unsupported(const core::Problem& problem) {
  for (const TensorView* input : {&problem.q, &problem.k, &problem.v}) {
    if (input->dtype == DType::f64) return "float64 inputs (it computes in float32)";
  }
  constexpr Index kMaxRows = Index{1} << 30;  // key positions and distances fit in int32
  if (problem.total_q >= kMaxRows || problem.total_k >= kMaxRows) {
    return "sequences of 2^30 rows or more";
  }
  // The position bias's values are indexed in int32 lanes.
  if (static_cast<Index>(problem.bias_by_offset.values.size()) >= (Index{1} << 31)) {
    return "a position bias of 2^31 values or more by offset";
  }
  return {};
}

std::string unsupported(const core::BackwardProblem& problem) {
  for (const TensorView* input : {&problem.out, &problem.dout}) {
    if (input->dtype == DType::f64) return "float64 inputs (it computes in float32)";
  }
  return unsupported(problem.forward);
}

}  // namespace attn::cpu
