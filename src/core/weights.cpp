// attn::weights: validate the problem and the selection once, then hand the request to the
// fast weights pass or the reference.
#include "attn/weights.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>

#include "core/argument_checks.hpp"
#include "core/backend.hpp"
#include "core/memory.hpp"
#include "core/problem.hpp"
#include "core/weight_request.hpp"
#include "cpu/forward.hpp"
#include "cpu/weights.hpp"
#include "reference/weights.hpp"

namespace attn {
namespace core {
namespace {

// 0, 1, ..., count - 1.
std::vector<Index> all_indices(Index count) {
  std::vector<Index> all(static_cast<std::size_t>(count));
  std::iota(all.begin(), all.end(), Index{0});
  return all;
}

// The listed indices, each checked against [0, count), or every index when none is listed.
std::vector<Index> chosen(const std::vector<Index>& listed, Index count, const char* argument,
                          const char* what) {
  if (listed.empty()) return all_indices(count);
  for (std::size_t at = 0; at < listed.size(); ++at) {
    if (listed[at] < 0 || listed[at] >= count) {
      fail(argument, std::string(what) + " in [0, " + std::to_string(count) + ")",
           std::to_string(listed[at]) + " at position " + std::to_string(at));
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
  request.heads = all_indices(p.heads_q);
  request.rows = all_indices(p.total_q);
  request.weights = weights;
  return request;
}

}  // namespace core

namespace {

using core::fail;

struct Request {
  core::Problem problem;
  core::WeightRequest request;
  Dims shape{};  // of the weights
};

Request make_request(const TensorView& q, const TensorView& k, const Options& options,
                     const WeightSelection& selection) {
  // k stands in for v, which the weights never read: it has the shape v must have.
  Request r{core::make_problem(q, k, k, options), {}, {}};
  r.request.heads =
      core::chosen(selection.heads, r.problem.heads_q, "selection.heads", "query heads");
  r.request.rows = core::chosen(selection.rows, r.problem.total_q, "selection.rows", "query rows");
  if (selection.top_k && *selection.top_k < 1) {
    fail("selection.top_k", "a count of at least 1 (or none for every key)",
         std::to_string(*selection.top_k));
  }
  // Columns past Lk would hold only padding: a larger top_k is capped, not allocated.
  if (selection.top_k) {
    r.request.top_k = std::min(*selection.top_k, std::max<Index>(r.problem.total_k, 1));
  }
  r.shape = {r.problem.batch, static_cast<Index>(r.request.heads.size()),
             static_cast<Index>(r.request.rows.size()),
             r.request.top_k ? *r.request.top_k : r.problem.total_k};
  return r;
}

void check_outputs(const Request& r, const MutableTensorView& weights,
                   const std::int64_t* indices) {
  core::check_output("weights", weights, r.shape);
  if (r.request.top_k && weights.numel() > 0 && indices == nullptr) {
    fail("indices", "storage for " + format_dims(r.shape) + " int64 (top_k is set)",
         "a null pointer");
  }
  if (!r.request.top_k && indices != nullptr) {
    fail("indices", "a null pointer (no top_k)", "storage");
  }
}

void run(const core::Problem& problem, const core::WeightRequest& request, Backend requested) {
  if (core::use_fast_kernel(requested, cpu::unsupported(problem))) {
    cpu::weights(problem, request);
  } else {
    reference::weights(problem, request);
  }
}

}  // namespace

void weights_into(const TensorView& q, const TensorView& k, const Options& options,
                  const WeightSelection& selection, const MutableTensorView& weights,
                  std::int64_t* indices) {
  Request r = make_request(q, k, options, selection);
  check_outputs(r, weights, indices);
  r.request.weights = weights;
  r.request.indices = indices;
  run(r.problem, r.request, options.backend);
}

WeightsResult weights(const TensorView& q, const TensorView& k, const Options& options,
                      const WeightSelection& selection) {
  Request r = make_request(q, k, options, selection);
  // The full matrix of a long sequence is easily more than the machine holds.
  const std::uint64_t bytes =
      core::bytes_of(r.shape, (q.dtype == DType::f64 ? 8 : 4) + (r.request.top_k ? 8 : 0));
  core::check_memory("weights " + format_dims(r.shape), bytes,
                     "select heads or rows, or ask for the top_k largest of each row");
  WeightsResult result;
  result.weights = Tensor(q.dtype == DType::f64 ? DType::f64 : DType::f32, r.shape);
  r.request.weights = result.weights.mutable_view();
  if (selection.top_k) {
    result.indices.assign(static_cast<std::size_t>(result.weights.numel()), -1);
    r.request.indices = result.indices.data();
  }
  run(r.problem, r.request, options.backend);
  return result;
}

}  // namespace attn
