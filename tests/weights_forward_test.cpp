// attn::weights computes its scores with the code the forward kernel uses (the shared tile
// core, src/cpu/tile/), so its weights times V give back forward's context: on every
// case and every SIMD target compiled in that this CPU runs, sum_j alpha_ij v_j (in
// float64) equals attn::forward's context to the rounding of the context's dtype. (bf16 q
// and k on AVX512-BF16: forward's scores are dot products of the same exact products,
// summed in another order, which that rounding covers.)
#include <gtest/gtest.h>

#include <string>

#include "attn/attn.hpp"
#include "core/rows.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::Case;

// C'[b, h, i] = sum_j alpha[b, h, i, j] v[b, h / group, j] in float64.
Tensor weighted_values(const TensorView& alpha, const TensorView& v) {
  const Index batch = alpha.shape[0], heads = alpha.shape[1], len_q = alpha.shape[2];
  const Index len_k = alpha.shape[3], dim_v = v.shape[3], group = heads / v.shape[1];
  Tensor out(DType::f64, {batch, heads, len_q, dim_v});
  double* o = out.data_as<double>();
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < len_q; ++i, o += dim_v) {
        for (Index j = 0; j < len_k; ++j) {
          const double weight = core::load_element(alpha, b, h, i, j);
          if (weight == 0.0) continue;
          for (Index d = 0; d < dim_v; ++d)
            o[d] += weight * core::load_element(v, b, h / group, j, d);
        }
      }
  return out;
}

// The context's own rounding, squared and relative: fp32 for f32 (and the weights' own fp32
// rounding), the half types' for f16 and bf16 contexts.
double nmse_bound(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-24;
    case DType::f16:
      return 1e-6;
    case DType::bf16:
      return 1e-4;
    default:
      return 1e-11;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& param) {
  return param.param.name();
}

class WeightsTimesValues : public ::testing::TestWithParam<Case> {};

TEST_P(WeightsTimesValues, GiveForwardsContextOnEveryTarget) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  testing::for_each_target([&] {
    const Result forward_result = forward(in.q, in.k, in.v, in.options);
    const WeightsResult alpha = weights(in.q, in.k, in.options);
    const Tensor blended = weighted_values(alpha.weights.view(), in.v);
    const testing::Comparison c = testing::compare(forward_result.context.view(), blended.view());
    EXPECT_TRUE(c.hard_failure.empty()) << testing::describe(c);
    EXPECT_LT(c.nmse, nmse_bound(in.q.dtype)) << testing::describe(c);
  });
}

INSTANTIATE_TEST_SUITE_P(Cases, WeightsTimesValues, ::testing::ValuesIn(testing::case_list()),
                         case_name);

}  // namespace
}  // namespace attn
