// A validated backward request: the forward's Problem (q, k, v and the options) and what
// the backward pass reads and writes besides.
#pragma once

#include <optional>

#include "attn/backward.hpp"
#include "core/problem.hpp"

namespace attn::core {

struct BackwardProblem {
  Problem forward;  // q, k, v, options; forward.outputs is unused
  TensorView out, lse, dout;
  MutableTensorView dq, dk, dv;
  std::optional<MutableTensorView> dsinks;  // exactly when forward.sinks is not empty
  // [1, heads of the table, 1, columns]: exactly when forward.rule.position_bias is given
  std::optional<MutableTensorView> dposition_bias;
};

// Checks everything forward's make_problem does, then out, lse, dout and the gradients;
// throws attn::Error naming the argument.
BackwardProblem make_backward_problem(const BackwardInputs& inputs, const Options& options,
                                      const Gradients& gradients);

}  // namespace attn::core
