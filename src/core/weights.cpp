// attn::weights: validate the problem and the selection once, then hand the request to the
// fast weights pass or the reference.
#include "attn/weights.hpp"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "core/backend.hpp"
#include "core/problem.hpp"
#include "core/weight_request.hpp"
#include "cpu/forward.hpp"
#include "cpu/weights.hpp"
#include "reference/weights.hpp"

namespace attn {
namespace core {
namespace {

// The listed indices, each checked against [0, count), or every index when none is listed.
std::vector<Index> chosen(const std::vector<Index>& listed, Index count, const char* argument,
                          const char* what) {
  if (listed.empty()) {
    std::vector<Index> all(static_cast<std::size_t>(count));
    std::iota(all.begin(), all.end(), Index{0});
    return all;
  }
  for (std::size_t at = 0; at < listed.size(); ++at) {
    if (listed[at] < 0 || listed[at] >= count) {
      throw Error(std::string(argument) + ": expected " + what + " in [0, " +
                  std::to_string(count) + "), given " + std::to_string(listed[at]) +
                  " at position " + std::to_string(at));
    }
  }
  return listed;
}

}  // namespace

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
  request.heads = chosen({}, p.heads_q, "heads", "query heads");
  request.rows = chosen({}, p.total_q, "rows", "query rows");
  request.weights = weights;
  return request;
}

}  // namespace core

WeightsResult weights(const TensorView& q, const TensorView& k, const Options& options,
                      const WeightSelection& selection) {
  // k stands in for v, which the weights never read: it has the shape v must have.
  const core::Problem problem = core::make_problem(q, k, k, options);
  core::WeightRequest request;
  request.heads = core::chosen(selection.heads, problem.heads_q, "selection.heads", "query heads");
  request.rows = core::chosen(selection.rows, problem.total_q, "selection.rows", "query rows");
  if (selection.top_k && *selection.top_k < 1) {
    throw Error("selection.top_k: expected a count of at least 1 (or none for every key), given " +
                std::to_string(*selection.top_k));
  }
  request.top_k = selection.top_k;

  const Dims shape{problem.batch, static_cast<Index>(request.heads.size()),
                   static_cast<Index>(request.rows.size()),
                   selection.top_k ? *selection.top_k : problem.total_k};
  WeightsResult result;
  result.weights = Tensor(q.dtype == DType::f64 ? DType::f64 : DType::f32, shape);
  request.weights = result.weights.mutable_view();
  if (selection.top_k) {
    result.indices.assign(static_cast<std::size_t>(result.weights.numel()), -1);
    request.indices = result.indices.data();
  }

  const Backend backend = core::resolve_backend(options.backend);
  if (backend == Backend::reference) {
    reference::weights(problem, request);
    return result;
  }
  const std::string missing = cpu::unsupported(problem);
  if (missing.empty()) {
    cpu::weights(problem, request);
  } else if (backend == Backend::fast) {
    throw Error("backend: expected a request the fast CPU kernel supports, given " + missing +
                "; use backend automatic or reference");
  } else {
    reference::weights(problem, request);
  }
  return result;
}

}  // namespace attn
