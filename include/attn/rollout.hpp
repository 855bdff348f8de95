// attn::rollout: attention rollout (Abnar & Zuidema, ACL 2020, "Quantifying Attention Flow in
// Transformers"): how much each position's representation after layer l draws from each
// input token, through every layer's attention and its residual connection. One layer's
// weights say what a position mixes from the layer's inputs; rollout multiplies them down
// the stack, so a picture of an upper layer shows input tokens, not mixtures of them.
#pragma once

#include "attn/tensor.hpp"

namespace attn {

// weights: [layers, H, L, L], one text's self-attention weights in every layer (each row a
// query's weights over the keys), any float dtype. residual: the identity's share, 0.5 in
// the paper (the residual connection), in [0, 1]. Returns float64 [layers, 1, L, L]:
//   A_l = residual I + (1 - residual) mean over heads of weights[l], each row divided by its
//         sum where that is above 0
//   R_0 = A_0,   R_l = A_l R_(l-1)
// so row i of R_l sums to 1 (for rows that see some key). Throws attn::Error naming weights
// or residual.
Tensor rollout(const TensorView& weights, double residual = 0.5);

}  // namespace attn
