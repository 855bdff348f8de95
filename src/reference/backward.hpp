// The float64 backward oracle: plain loops, double accumulation, no SIMD, no threads.
#pragma once

#include "core/backward_problem.hpp"

namespace attn::reference {

// Fills dq, dk, dv (and dsinks when sinks are given) with the exact gradient of
// reference::forward. P and D come from q, k, v and dout in float64, so out and lse are
// only checked, never read: the result is the gradient of the function itself.
void backward(const core::BackwardProblem& problem);

}  // namespace attn::reference
