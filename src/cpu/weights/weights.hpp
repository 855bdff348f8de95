// The fast weights pass: alpha_ij = exp(s_ij - lse_i) from the same scores as the forward
// kernel, streamed over key tiles.
#pragma once

#include "core/problem.hpp"
#include "core/weight_request.hpp"

namespace attn::cpu {

// Fills request.weights (and request.indices for top-k). Requires supports(problem): f16,
// bf16 or f32 inputs. Results are bitwise identical for any thread count, and a row's bits
// do not depend on which other rows are requested.
void weights(const core::Problem& problem, const core::WeightRequest& request);

}  // namespace attn::cpu
