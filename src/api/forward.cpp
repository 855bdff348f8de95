// attn::forward: validate once, then hand the Problem to the fast kernel (and the weights
// pass, when weights are asked for) or the reference.
#include <string>

#include "api/backend.hpp"
#include "attn/attention.hpp"
#include "core/problem.hpp"
#include "core/rows.hpp"
#include "core/weight_request.hpp"
#include "cpu/forward/forward.hpp"
#include "cpu/plan/support.hpp"
#include "cpu/weights/weights.hpp"
#include "reference/reference.hpp"

namespace attn {
namespace {

// Weights in a dtype the kernel does not keep (cpu::keeps_weights) go through the weights
// pass with the kernel's lse (kept in float64): it walks the chunks forward walked by the
// same scorer, so the weights are the ones the context was made with, and equal
// attn::weights' bits.
void fast_forward_then_weights(const core::Problem& problem) {
  Tensor lse(DType::f64, {problem.batch, problem.heads_q, problem.total_q, 1});
  core::Problem with_lse = problem;
  with_lse.outputs.lse = lse.mutable_view();
  with_lse.outputs.weights.reset();
  cpu::forward(with_lse);
  if (problem.outputs.lse) {
    double value = 0.0;
    for (Index b = 0; b < problem.batch; ++b)
      for (Index h = 0; h < problem.heads_q; ++h)
        for (Index s = 0; s < problem.total_q; ++s) {
          core::load_row(lse.view(), b, h, s, &value);
          core::store_row(*problem.outputs.lse, b, h, s, &value);
        }
  }
  core::WeightRequest request = core::whole_request(problem, *problem.outputs.weights);
  request.lse = lse.view();
  cpu::weights(problem, request);
}

void run(const core::Problem& problem, Backend requested) {
  if (!api::use_fast_kernel(requested, cpu::unsupported(problem))) {
    reference::forward(problem);
  } else if (problem.outputs.weights && !cpu::keeps_weights(problem)) {
    fast_forward_then_weights(problem);
  } else {
    cpu::forward(problem);
  }
}

// The whole request, checked.
core::Problem checked_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                              const Options& options, const Outputs& outputs) {
  core::Problem problem = core::make_problem(q, k, v, options);
  core::attach_outputs(problem, outputs);
  return problem;
}

}  // namespace

void forward_into(const TensorView& q, const TensorView& k, const TensorView& v,
                  const Options& options, const Outputs& outputs) {
  run(checked_problem(q, k, v, options, outputs), options.backend);
}

void check_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                   const Options& options, const Outputs& outputs) {
  checked_problem(q, k, v, options, outputs);
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
