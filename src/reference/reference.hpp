// The float64 oracle for attention: plain loops, double accumulation, no SIMD, no threads.
// It is the specification in code: every fast path is tested against it, and it is the
// path attn::forward takes when the fast kernel does not support a request.
#pragma once

#include "core/problem.hpp"

namespace attn::reference {

// Fills problem.outputs (context, and lse / weights when present).
void forward(const core::Problem& problem);

}  // namespace attn::reference
