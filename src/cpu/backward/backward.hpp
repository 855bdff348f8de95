// The fast CPU backward kernel (FlashAttention-2's backward on the shared tile core): one
// pass over key blocks, dQ summed into per-part partials, no atomics (docs/architecture.md).
#pragma once

#include <string>

#include "core/backward_problem.hpp"

namespace attn::cpu {

// Empty when the fast kernel serves the request; else what it does not support (float64
// inputs go to the reference).
std::string backward_unsupported(const core::BackwardProblem& problem);

// Fills dq, dk, dv (and dsinks). Requires backward_unsupported(problem) to be empty.
// Bitwise identical results for any thread count.
void backward(const core::BackwardProblem& problem);

}  // namespace attn::cpu
