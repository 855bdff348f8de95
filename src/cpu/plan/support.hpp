// What the fast kernels serve: forward, the weights pass and backward alike; everything else
// goes to the float64 reference, and attn::explain says why.
#pragma once

#include <string>

#include "core/backward_problem.hpp"
#include "core/problem.hpp"

namespace attn::cpu {

// Empty when the fast kernels serve the problem; else what they do not support, e.g.
// "float64 inputs (it computes in float32)".
std::string unsupported(const core::Problem& problem);
// The same for a backward request: its forward problem's, and float64 out or dout.
std::string unsupported(const core::BackwardProblem& problem);

}  // namespace attn::cpu
