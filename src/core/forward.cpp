// attn::forward: validate once, then hand the Problem to the fast kernel or the reference.
#include <cstdlib>
#include <cstring>
#include <string>

#include "attn/attention.hpp"
#include "core/problem.hpp"
#include "cpu/forward.hpp"
#include "reference/reference.hpp"

namespace attn {
namespace {

Backend backend_from_environment(Backend requested) {
  const char* forced = std::getenv("ATTN_BACKEND");
  if (forced != nullptr && std::strcmp(forced, "reference") == 0) return Backend::reference;
  return requested;
}

void run(const core::Problem& problem, Backend requested) {
  const Backend backend = backend_from_environment(requested);
  if (backend == Backend::reference) {
    reference::forward(problem);
    return;
  }
  const std::string missing = cpu::unsupported(problem);
  if (missing.empty()) {
    cpu::forward(problem);
  } else if (backend == Backend::fast) {
    throw Error("backend: expected a request the fast CPU kernel supports, given " + missing +
                "; use backend automatic or reference");
  } else {
    reference::forward(problem);
  }
}

}  // namespace

void forward_into(const TensorView& q, const TensorView& k, const TensorView& v,
                  const Options& options, const Outputs& outputs) {
  core::Problem problem = core::make_problem(q, k, v, options);
  core::attach_outputs(problem, outputs);
  run(problem, options.backend);
}

Result forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const Options& options, Want want) {
  core::Problem problem = core::make_problem(q, k, v, options);
  const Index batch = problem.batch, heads = problem.heads_q, len_q = problem.total_q;
  const DType stats_dtype = q.dtype == DType::f64 ? DType::f64 : DType::f32;
  Result result;
  result.context = Tensor(q.dtype, {batch, heads, len_q, problem.dim_v});
  Outputs outputs{result.context.mutable_view(), std::nullopt, std::nullopt};
  if (want.lse) {
    result.lse = Tensor(stats_dtype, {batch, heads, len_q, 1});
    outputs.lse = result.lse.mutable_view();
  }
  if (want.weights) {
    result.weights = Tensor(stats_dtype, {batch, heads, len_q, problem.total_k});
    outputs.weights = result.weights.mutable_view();
  }
  core::attach_outputs(problem, outputs);
  run(problem, options.backend);
  return result;
}

}  // namespace attn
