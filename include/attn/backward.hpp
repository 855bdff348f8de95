// attn::backward: the gradients of attn::forward (dq, dk, dv, and dsinks with sinks) from
// the forward's output and log-sum-exp and the gradient of the output, recomputing the
// weights rather than storing them (FlashAttention-2's backward).
#pragma once

#include <optional>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// What forward saw and gave, and the gradient of its output.
// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]  (as forward's)
// out: [B, Hq, Lq, Dv] forward's context  lse: [B, Hq, Lq, 1] forward's lse (f32 or f64)
// dout: [B, Hq, Lq, Dv] the gradient of the loss with respect to out
struct BackwardInputs {
  TensorView q, k, v, out, lse, dout;
};

// Where the gradients go: dq, dk, dv of q's, k's and v's shapes, any float dtype, any
// strides with the last dim contiguous. dsinks: [1, Hq, 1, 1], f32 or f64, summed over
// batch and rows; required exactly when options.sinks is given. dposition_bias: [1, heads of
// the table (Hq or 1), 1, columns], f32 or f64, the gradient of options.position_bias's
// table, summed over batch, rows and keys (and heads, for a table shared by all); required
// exactly when a position bias is given.
struct Gradients {
  MutableTensorView dq, dk, dv;
  std::optional<MutableTensorView> dsinks;
  std::optional<MutableTensorView> dposition_bias;
};

// The options are forward's (which see). No gradient flows into a mask, ALiBi slopes or
// the scale; the sinks' and the position bias table's do, when their outputs are given. With
// GQA/MQA, dk and dv sum over the query heads of each group. The result is the same bytes for any
// thread count and on every run. Throws attn::Error naming the argument on bad input, as
// forward_into does.
void backward_into(const BackwardInputs& inputs, const Options& options,
                   const Gradients& gradients);

// dq, dk, dv in the dtypes of q, k, v; dsinks: [1, Hq, 1, 1] and dposition_bias: [1, heads
// of the table, 1, columns], f64 when q is f64, else f32; empty tensors without sinks or
// position bias.
struct BackwardResult {
  Tensor dq, dk, dv, dsinks, dposition_bias;
};

BackwardResult backward(const BackwardInputs& inputs, const Options& options = {});

}  // namespace attn
