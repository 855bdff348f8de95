// attn::forward: the one entry point for attention, served by the fast kernel or the
// reference.
#pragma once

#include <optional>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Where results go. context: [B, Hq, Lq, Dv] in any float dtype. lse (log-sum-exp of each
// row's visible scores, sinks included): [B, Hq, Lq, 1], f32 or f64. weights (alpha, rows
// sum to 1 less the sinks' share): [B, Hq, Lq, Lk], any float dtype. For packed varlen
// inputs B = 1 and weights is [1, Hq, total_q, total_k], zero outside each sequence's block.
struct Outputs {
  MutableTensorView context;
  std::optional<MutableTensorView> lse;
  std::optional<MutableTensorView> weights;
};

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]; Hq a multiple of Hkv (GQA/MQA).
// Inputs may be f16, bf16, f32 or f64, each with its own strides (last dim contiguous).
void forward_into(const TensorView& q, const TensorView& k, const TensorView& v,
                  const Options& options, const Outputs& outputs);

// The argument checks of forward_into alone: throws the attn::Error that forward_into
// would throw for these arguments (shapes, dtypes, strides, option values, outputs), else
// returns without reading the data. For a caller that splits one request into several
// calls and wants errors to name the whole request.
void check_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                   const Options& options, const Outputs& outputs);

struct Want {
  bool lse = false;
  bool weights = false;
};

// context has q's dtype; lse and weights are f64 when q is f64, else f32. Members not
// asked for are empty tensors.
struct Result {
  Tensor context;
  Tensor lse;
  Tensor weights;
};

Result forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const Options& options = {}, Want want = {});

}  // namespace attn
