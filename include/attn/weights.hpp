// attn::weights: the softmax weights alpha that attn::forward blends values with, exactly,
// for the same options, without v. All of them, chosen heads or query rows, or the k
// largest per query row; the fast kernel never holds the whole Lq x Lk matrix for top-k.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Which weights to compute. Empty heads / rows mean every one, in order; otherwise the
// listed ones, in the order listed (repeats allowed).
struct WeightSelection {
  std::vector<Index> heads;  // query heads, each in [0, Hq)
  std::vector<Index> rows;   // query rows, each in [0, Lq) (packed varlen: [0, total_q))
  // Absent: every key. k >= 1: the k largest weights of each row, largest first, ties
  // broken by the lower key index; a k above Lk is taken as Lk (more columns would be
  // padding only).
  std::optional<Index> top_k;
};

struct WeightsResult {
  // Without top_k: [B, heads, rows, Lk], rows summing to 1 less the sinks' share, zero for
  // hidden keys (packed varlen: B = 1, Lk = total_k, zero outside the row's sequence).
  // With top_k = k: [B, heads, rows, k]. f64 when q is f64, else f32. A row that sees no
  // key is all zeros; a row with a NaN score among the keys it sees has NaN weights.
  Tensor weights;
  // top_k only: the key index of each entry of weights, row-major over its shape (packed
  // varlen: an index into total_k); -1, with weight 0, past the keys the row sees.
  std::vector<std::int64_t> indices;
};

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]; options as for attn::forward (which see), except
// that no value tensor is needed. Backend::automatic runs the fast kernel for f16, bf16
// and f32 inputs and the float64 reference for f64 ones. The weights are
// exp(s_ij - lse_i) from the kernel's own scores and log-sum-exp, as forward computes them.
// Throws attn::Error naming the argument on bad input, e.g. "selection.heads", and
// attn::OutOfMemory, before allocating, when the result would not fit in memory.
WeightsResult weights(const TensorView& q, const TensorView& k, const Options& options = {},
                      const WeightSelection& selection = {});

// As weights(), into the caller's storage. weights: the shape weights() gives, any float
// dtype, any strides with the last dim contiguous. indices: with top_k only, contiguous
// [B, heads, rows, k] (nullptr without top_k).
void weights_into(const TensorView& q, const TensorView& k, const Options& options,
                  const WeightSelection& selection, const MutableTensorView& weights,
                  std::int64_t* indices = nullptr);

}  // namespace attn
