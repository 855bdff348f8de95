// What the fast kernels serve: forward, the weights pass and backward alike; everything else
// goes to the float64 reference, and attn::explain says why.
#pragma once

#include <string>

#include "core/problem.hpp"

namespace attn::cpu {

// Empty when the fast kernels serve the problem; else what they do not support, e.g.
// "float64 inputs (it computes in float32)".
std::string unsupported(const core::Problem& problem);

}  // namespace attn::cpu
