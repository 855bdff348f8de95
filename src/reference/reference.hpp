// The float64 oracle for attention: plain loops, double accumulation, no SIMD, no threads.
// It is the specification in code: every fast path is tested against it, and it is the
// path attn::forward takes when the fast kernel does not support a request.
#pragma once

#include <vector>

#include "core/problem.hpp"

namespace attn::reference {

// Buffers for row_weights, reused from row to row.
struct RowScratch {
  std::vector<double> q_row, k_row;
  std::vector<double> weights;  // [len_k of the segment]
  std::vector<char> shown;      // [len_k of the segment]: 1 where the key takes weight
  std::vector<double> packed;   // [total_k]: the row's weights over all packed keys
  // [len_k of the segment]: d score_j / d (scale q.k_j), for the backward pass
  std::vector<double> score_slopes;
};

// alpha of query row i (relative to seg) of `head` against the segment's keys:
// scratch.weights[j] for j < seg.len_k, 0 where scratch.shown[j] is 0. Returns the row's
// lse (sinks included; -inf when no key and no sink is visible, and then every weight is 0).
double row_weights(const core::Problem& problem, const core::Segment& seg, Index head, Index i,
                   RowScratch& scratch);

// Fills problem.outputs (context, and lse / weights when present).
void forward(const core::Problem& problem);

}  // namespace attn::reference
