// Weights with selections from the float64 reference, one requested row at a time: the
// oracle the fast weights pass is tested against, and the path for f64 inputs.
#pragma once

#include "core/problem.hpp"
#include "core/weight_request.hpp"

namespace attn::reference {

// Fills request.weights (and request.indices for top-k: by weight, then lower key index).
// Ignores request.lse: every row's softmax is its own, in float64.
void weights(const core::Problem& problem, const core::WeightRequest& request);

}  // namespace attn::reference
