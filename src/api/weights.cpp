// attn::weights: validate the problem and the selection once, then hand the request to the
// fast weights pass or the reference.
#include "attn/weights.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "api/backend.hpp"
#include "core/argument_checks.hpp"
#include "core/memory.hpp"
#include "core/problem.hpp"
#include "core/weight_request.hpp"
#include "cpu/plan/support.hpp"
#include "cpu/weights/weights.hpp"
#include "reference/weights.hpp"

namespace attn {
namespace {

using core::fail;

// The listed indices, each checked against [0, count), or every index when none is listed.
std::vector<Index> chosen(const std::vector<Index>& listed, Index count, const char* argument,
                          const char* what) {
  if (listed.empty()) return core::all_indices(count);
  for (std::size_t at = 0; at < listed.size(); ++at) {
    if (listed[at] < 0 || listed[at] >= count) {
      fail(argument, std::string(what) + " in [0, " + std::to_string(count) + ")",
           std::to_string(listed[at]) + " at position " + std::to_string(at));
    }
  }
  return listed;
}

struct Request {
  core::Problem problem;
  core::WeightRequest request;
  Dims shape{};  // of the weights
};

Request make_request(const TensorView& q, const TensorView& k, const Options& options,
                     const WeightSelection& selection) {
  // k stands in for v, which the weights never read: it has the shape v must have.
  Request r{core::make_problem(q, k, k, options), {}, {}};
  r.request.heads = chosen(selection.heads, r.problem.heads_q, "selection.heads", "query heads");
  r.request.rows = chosen(selection.rows, r.problem.total_q, "selection.rows", "query rows");
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
  if (api::use_fast_kernel(requested, cpu::unsupported(problem))) {
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
