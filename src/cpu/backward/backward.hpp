// The fast CPU backward kernel (FlashAttention-2's backward on the shared tile core): one
// pass over key blocks, dQ summed into per-part partials, no atomics (docs/architecture.md).
#pragma once

#include "core/backward_problem.hpp"

namespace attn::cpu {

// Fills dq, dk, dv (and dsinks). Requires unsupported(problem) empty (cpu/plan/support.hpp).
// Bitwise identical results for any thread count.
void backward(const core::BackwardProblem& problem);

}  // namespace attn::cpu
