// The float64 reference against hand-computed values and independent naive formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "attn/attn.hpp"

namespace attn {
namespace {

// The lesson's example: three words with 2-d embeddings, keys = values = embeddings,
// the query is the second word, plain dot scores. Hand-computed:
//   scores = [1*0 + 0*1, 0*0 + 1*1, 1*0 + 1*1] = [0, 1, 1]
//   alpha = [1, e, e] / (1 + 2e) = [0.155362, 0.422319, 0.422319]
//   C = 0.155362 * [1, 0] + 0.422319 * [0, 1] + 0.422319 * [1, 1] = [0.577681, 0.844638]
TEST(Reference, LessonThreeWordExample) {
  const double embeddings[] = {1, 0, 0, 1, 1, 1};
  const double query[] = {0, 1};
  const TensorView q(query, DType::f64, {1, 1, 1, 2});
  const TensorView kv(embeddings, DType::f64, {1, 1, 3, 2});
  Options options;
  options.scale = 1.0;
  const Result r = forward(q, kv, kv, options, {.lse = true, .weights = true});
  const double e = std::exp(1.0), total = 1 + 2 * e;
  const double* alpha = r.weights.data_as<double>();
  EXPECT_NEAR(alpha[0], 1 / total, 1e-15);
  EXPECT_NEAR(alpha[1], e / total, 1e-15);
  EXPECT_NEAR(alpha[2], e / total, 1e-15);
  const double* c = r.context.data_as<double>();
  EXPECT_NEAR(c[0], (1 + e) / total, 1e-15);
  EXPECT_NEAR(c[1], 2 * e / total, 1e-15);
  EXPECT_NEAR(r.lse.data_as<double>()[0], std::log(total), 1e-15);
}

}  // namespace
}  // namespace attn
