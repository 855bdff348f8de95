// attn::contributions: attn::weights, each column scaled by its value vector's norm.
#include "attn/contributions.hpp"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/argument_checks.hpp"
#include "core/element_type.hpp"
#include "core/problem.hpp"
#include "core/rows.hpp"
#include "core/weight_request.hpp"

namespace attn {
namespace {

using core::fail;

// The float64 norm of every key's value vector of batch entry b, KV head head_kv:
// ||v_j||, or ||v_j W_O^head|| with a projection. value: scratch of Dv doubles.
void key_norms(const TensorView& v, const TensorView* projection, Index b, Index head_kv,
               Index head, std::vector<double>& value, std::vector<double>& norms) {
  const Index dim_v = v.shape[3];
  for (Index j = 0; j < v.shape[2]; ++j) {
    for (Index d = 0; d < dim_v; ++d)
      value[static_cast<std::size_t>(d)] = core::load_element(v, b, head_kv, j, d);
    double sum = 0.0;
    if (projection == nullptr) {
      for (Index d = 0; d < dim_v; ++d)
        sum += value[static_cast<std::size_t>(d)] * value[static_cast<std::size_t>(d)];
    } else {
      for (Index e = 0; e < projection->shape[3]; ++e) {
        double u = 0.0;
        for (Index d = 0; d < dim_v; ++d)
          u += value[static_cast<std::size_t>(d)] * core::load_element(*projection, 0, head, d, e);
        sum += u * u;
      }
    }
    norms[static_cast<std::size_t>(j)] = std::sqrt(sum);
  }
}

void check_projection(const TensorView& projection, const core::Problem& problem) {
  const Dims& shape = projection.shape;
  if (shape[0] != 1 || shape[1] != problem.heads_q || shape[2] != problem.dim_v || shape[3] < 1) {
    fail("output_projection",
         "shape [1, " + std::to_string(problem.heads_q) + ", " + std::to_string(problem.dim_v) +
             ", E] (W_O by query head, E >= 1)",
         format_dims(shape));
  }
  if (projection.dtype == DType::boolean) {
    fail("output_projection", "a float dtype", dtype_name(projection.dtype));
  }
}

}  // namespace

Tensor contributions(const TensorView& q, const TensorView& k, const TensorView& v,
                     const Options& options, const WeightSelection& selection,
                     const TensorView* output_projection) {
  const core::Problem problem = core::make_problem(q, k, v, options);
  if (selection.top_k) {
    fail("selection.top_k", "none (contributions take every key)",
         std::to_string(*selection.top_k));
  }
  if (output_projection != nullptr) check_projection(*output_projection, problem);
  WeightsResult result = weights(q, k, options, selection);
  Tensor out = std::move(result.weights);
  const Dims shape = out.shape();
  const std::vector<Index> heads =
      selection.heads.empty() ? core::all_indices(problem.heads_q) : selection.heads;
  const MutableTensorView view = out.mutable_view();
  std::vector<double> value(static_cast<std::size_t>(problem.dim_v)),
      norms(static_cast<std::size_t>(shape[3]));
  // Without a projection a key's norm is its KV head's, the same for the heads of a group:
  // computed again only when the next head reads another KV head.
  Index norms_of = -1;
  for (Index b = 0; b < shape[0]; ++b, norms_of = -1) {
    for (Index h = 0; h < shape[1]; ++h) {
      const Index head = heads[static_cast<std::size_t>(h)];
      const Index head_kv = head / problem.group_size();
      const Index source = output_projection == nullptr ? head_kv : head;
      if (source != norms_of) key_norms(v, output_projection, b, head_kv, head, value, norms);
      norms_of = source;
      for (Index i = 0; i < shape[2]; ++i) {
        if (out.dtype() == DType::f64) {
          double* row = core::row_of<double>(view, b, h, i);
          for (Index j = 0; j < shape[3]; ++j) row[j] *= norms[static_cast<std::size_t>(j)];
        } else {
          float* row = core::row_of<float>(view, b, h, i);
          for (Index j = 0; j < shape[3]; ++j)
            row[j] = static_cast<float>(row[j] * norms[static_cast<std::size_t>(j)]);
        }
      }
    }
  }
  return out;
}

}  // namespace attn
