#include "reference/weights.hpp"

#include <algorithm>
#include <vector>

#include "core/rows.hpp"
#include "reference/reference.hpp"

namespace attn::reference {
namespace {

// The row's shown keys, best first: larger weight, then lower key index. A NaN row (all
// its weights NaN) ranks by key index alone.
std::vector<Index> ranked_keys(const RowScratch& scratch) {
  std::vector<Index> keys;
  for (std::size_t j = 0; j < scratch.shown.size(); ++j) {
    if (scratch.shown[j]) keys.push_back(static_cast<Index>(j));
  }
  const std::vector<double>& w = scratch.weights;
  std::stable_sort(keys.begin(), keys.end(), [&](Index a, Index b) { return w[a] > w[b]; });
  return keys;
}

}  // namespace

void weights(const core::Problem& p, const core::WeightRequest& request) {
  const MutableTensorView& out = request.weights;
  const Index columns = out.shape[3];
  std::vector<double> row(static_cast<std::size_t>(columns));
  RowScratch scratch;
  for (const core::WeightRow& w : core::weight_rows(p, request)) {
    const core::Segment& seg = p.segments[static_cast<std::size_t>(w.segment)];
    row_weights(p, seg, w.head, w.i, scratch);
    std::fill(row.begin(), row.end(), 0.0);
    if (!request.top_k) {
      // Packed sequences: the row covers all packed keys, zero outside this sequence.
      for (Index j = 0; j < seg.len_k; ++j) row[seg.k_begin + j] = scratch.weights[j];
      core::store_row(out, seg.batch, w.out_head, w.out_row, row.data());
      continue;
    }
    const std::vector<Index> keys = ranked_keys(scratch);
    const Index at = ((seg.batch * out.shape[1] + w.out_head) * out.shape[2] + w.out_row) * columns;
    for (Index t = 0; t < columns; ++t) {
      const bool present = t < static_cast<Index>(keys.size());
      row[t] = present ? scratch.weights[keys[t]] : 0.0;
      request.indices[at + t] = present ? seg.k_begin + keys[t] : -1;
    }
    core::store_row(out, seg.batch, w.out_head, w.out_row, row.data());
  }
}

}  // namespace attn::reference
