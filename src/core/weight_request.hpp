// A validated request for attention weights: which rows of which heads, and where they go.
// Both the fast kernel and the reference serve it, for attn::weights and for attn::forward
// when it is asked for weights.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/problem.hpp"

namespace attn::core {

struct WeightRequest {
  std::vector<Index> heads;  // output axis 1 -> query head
  std::vector<Index> rows;   // output axis 2 -> query row, in [0, total_q)
  std::optional<Index> top_k;
  // [B, heads, rows, total_k], or [B, heads, rows, top_k]; any float dtype, last dim
  // contiguous.
  MutableTensorView weights;
  std::int64_t* indices = nullptr;  // top_k: [B, heads, rows, top_k], contiguous
  // [B, Hq, total_q, 1] f64: the forward kernel's lse, to normalise with; absent, the
  // weights pass computes its own.
  std::optional<TensorView> lse;
};

// 0, 1, ..., count - 1: every head or every row.
std::vector<Index> all_indices(Index count);

// One output row: query `head` at row i (relative to the segment) of segment `segment`,
// written to weights[batch of the segment, out_head, out_row, :].
struct WeightRow {
  Index segment = 0, head = 0, i = 0, out_head = 0, out_row = 0;
};

// Every output row of the request, grouped by segment, then by KV head, then by query
// position, so consecutive rows share keys.
std::vector<WeightRow> weight_rows(const Problem& problem, const WeightRequest& request);

// A request for every head and row of the problem, densely, into `weights`.
WeightRequest whole_request(const Problem& problem, const MutableTensorView& weights);

}  // namespace attn::core
