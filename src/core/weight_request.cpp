// The rows a weights request asks for, in the order the kernels walk them.
#include "core/weight_request.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

namespace attn::core {

std::vector<Index> all_indices(Index count) {
  std::vector<Index> all(static_cast<std::size_t>(count));
  std::iota(all.begin(), all.end(), Index{0});
  return all;
}

std::vector<WeightRow> weight_rows(const Problem& p, const WeightRequest& request) {
  // Requested rows by query row, keeping their output position.
  std::vector<std::pair<Index, Index>> by_row;
  for (std::size_t at = 0; at < request.rows.size(); ++at) {
    by_row.emplace_back(request.rows[at], static_cast<Index>(at));
  }
  std::stable_sort(by_row.begin(), by_row.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  // Requested heads of each KV head's group, in output order.
  std::vector<std::vector<std::pair<Index, Index>>> group_heads(
      static_cast<std::size_t>(p.heads_kv));
  for (std::size_t at = 0; at < request.heads.size(); ++at) {
    const Index head = request.heads[at];
    group_heads[static_cast<std::size_t>(head / p.group_size())].emplace_back(
        head, static_cast<Index>(at));
  }
  std::vector<WeightRow> rows;
  for (std::size_t s = 0; s < p.segments.size(); ++s) {
    const Segment& seg = p.segments[s];
    const auto below = [](const std::pair<Index, Index>& entry, Index row) {
      return entry.first < row;
    };
    const auto first = std::lower_bound(by_row.begin(), by_row.end(), seg.q_begin, below);
    const auto end = std::lower_bound(first, by_row.end(), seg.q_begin + seg.len_q, below);
    for (const auto& heads : group_heads) {
      for (auto it = first; it != end; ++it) {
        for (const auto& [head, out_head] : heads) {
          rows.push_back(
              {static_cast<Index>(s), head, it->first - seg.q_begin, out_head, it->second});
        }
      }
    }
  }
  return rows;
}

WeightRequest whole_request(const Problem& p, const MutableTensorView& weights) {
  WeightRequest request;
  request.heads = all_indices(p.heads_q);
  request.rows = all_indices(p.total_q);
  request.weights = weights;
  return request;
}

}  // namespace attn::core
