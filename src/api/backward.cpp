// attn::backward: validate once, then hand the request to the fast kernel or the reference.
#include "attn/backward.hpp"

#include "api/backend.hpp"
#include "core/backward_problem.hpp"
#include "cpu/backward/backward.hpp"
#include "cpu/plan/support.hpp"
#include "reference/backward.hpp"

namespace attn {
namespace {

void run(const core::BackwardProblem& problem, Backend requested) {
  if (api::use_fast_kernel(requested, cpu::unsupported(problem))) {
    cpu::backward(problem);
  } else {
    reference::backward(problem);
  }
}

}  // namespace

void backward_into(const BackwardInputs& inputs, const Options& options,
                   const Gradients& gradients) {
  run(core::make_backward_problem(inputs, options, gradients), options.backend);
}

BackwardResult backward(const BackwardInputs& inputs, const Options& options) {
  // q, k, v and the options are checked before the gradients are allocated; the rest with
  // them.
  core::Problem shapes = core::make_problem(inputs.q, inputs.k, inputs.v, options);
  BackwardResult result;
  result.dq = Tensor(inputs.q.dtype, inputs.q.shape);
  result.dk = Tensor(inputs.k.dtype, inputs.k.shape);
  result.dv = Tensor(inputs.v.dtype, inputs.v.shape);
  Gradients gradients{result.dq.mutable_view(), result.dk.mutable_view(), result.dv.mutable_view(),
                      std::nullopt, std::nullopt};
  if (!shapes.sinks.empty()) {
    result.dsinks =
        Tensor(inputs.q.dtype == DType::f64 ? DType::f64 : DType::f32, {1, shapes.heads_q, 1, 1});
    gradients.dsinks = result.dsinks.mutable_view();
  }
  if (const std::optional<PositionBias>& bias = shapes.rule.position_bias) {
    result.dposition_bias =
        Tensor(inputs.q.dtype == DType::f64 ? DType::f64 : DType::f32,
               {1, static_cast<Index>(bias->table.size()) / bias->columns, 1, bias->columns});
    gradients.dposition_bias = result.dposition_bias.mutable_view();
  }
  run(core::make_backward_problem(inputs, options, gradients), options.backend);
  return result;
}

}  // namespace attn
