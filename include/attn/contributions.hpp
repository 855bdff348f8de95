// attn::contributions: what each input adds to a query's context vector, beyond its weight
// (Kobayashi et al., EMNLP 2020, "Attention is not only a weight"): the norm of alpha_ij v_j,
// which is alpha_ij ||v_j||, or with an output projection the norm of alpha_ij v_j W_O^h for
// query head h. A large weight on a small value vector contributes little. The weights are
// attn::weights' bits (the fused kernel; no Lq x Lk x Dv array is formed), each key's norm is
// computed in float64, and their product is rounded once.
#pragma once

#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "attn/weights.hpp"

namespace attn {

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]; options and selection as for
// attn::weights, without top_k (a row's largest contributions need not be its largest
// weights). output_projection: nullptr, or [1, Hq, Dv, E], head h's rows of W_O (a layer's
// out_proj.weight [E, Hq * Dv], transposed and split by head). Returns [B, heads, rows, Lk]
// (packed varlen: as attn::weights), f64 when q is f64, else f32; zero where the weight is.
// Throws attn::Error naming the argument on bad input, attn::OutOfMemory before allocating
// a result that would not fit.
Tensor contributions(const TensorView& q, const TensorView& k, const TensorView& v,
                     const Options& options = {}, const WeightSelection& selection = {},
                     const TensorView* output_projection = nullptr);

}  // namespace attn
