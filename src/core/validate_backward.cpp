// Argument checking for attn::backward: forward's checks on q, k, v and the options, then
// the tensors only the backward pass has.
#include <string>

#include "core/argument_checks.hpp"
#include "core/backward_problem.hpp"

namespace attn::core {
namespace {

// An input of a known shape: a floating-point dtype, that shape, readable rows.
void check_input_shaped(const char* name, const TensorView& t, const Dims& shape) {
  check_float_dtype(name, t.dtype);
  if (t.shape != shape) fail(name, "shape " + format_dims(shape), format_dims(t.shape));
  check_storage(name, t);
}

void check_statistics_dtype(const char* name, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64) {
    fail(name, "dtype float32 or float64", dtype_name(dtype));
  }
}

}  // namespace

BackwardProblem make_backward_problem(const BackwardInputs& inputs, const Options& options,
                                      const Gradients& gradients) {
  BackwardProblem b;
  b.forward = make_problem(inputs.q, inputs.k, inputs.v, options);
  const Problem& p = b.forward;
  const Dims out_shape{p.batch, p.heads_q, p.total_q, p.dim_v};
  const Dims lse_shape{p.batch, p.heads_q, p.total_q, 1};
  check_input_shaped("out", inputs.out, out_shape);
  check_input_shaped("lse", inputs.lse, lse_shape);
  check_statistics_dtype("lse", inputs.lse.dtype);
  check_input_shaped("dout", inputs.dout, out_shape);
  check_output("dq", gradients.dq, inputs.q.shape);
  check_output("dk", gradients.dk, inputs.k.shape);
  check_output("dv", gradients.dv, inputs.v.shape);
  if (p.sinks.empty() && gradients.dsinks) {
    fail("dsinks", "none (no sinks in the options)",
         "shape " + format_dims(gradients.dsinks->shape));
  }
  if (!p.sinks.empty()) {
    if (!gradients.dsinks) {
      fail("dsinks", "shape [1, " + std::to_string(p.heads_q) + ", 1, 1] (sinks are given)",
           "none");
    }
    check_output("dsinks", *gradients.dsinks, {1, p.heads_q, 1, 1});
    check_statistics_dtype("dsinks", gradients.dsinks->dtype);
  }
  const std::optional<PositionBias>& bias = p.rule.position_bias;
  if (!bias && gradients.dposition_bias) {
    fail("dposition_bias", "none (no position_bias in the options)",
         "shape " + format_dims(gradients.dposition_bias->shape));
  }
  if (bias) {
    const Dims shape{1, static_cast<Index>(bias->table.size()) / bias->columns, 1, bias->columns};
    if (!gradients.dposition_bias) {
      fail("dposition_bias", "shape " + format_dims(shape) + " (position_bias is given)", "none");
    }
    check_output("dposition_bias", *gradients.dposition_bias, shape);
    check_statistics_dtype("dposition_bias", gradients.dposition_bias->dtype);
  }
  b.out = inputs.out;
  b.lse = inputs.lse;
  b.dout = inputs.dout;
  b.dq = gradients.dq;
  b.dk = gradients.dk;
  b.dv = gradients.dv;
  b.dsinks = gradients.dsinks;
  b.dposition_bias = gradients.dposition_bias;
  return b;
}

}  // namespace attn::core
