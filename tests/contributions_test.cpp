// attn::contributions against float64: alpha_ij ||v_j|| from attn::weights' bits and float64
// norms, the product rounded once; with an output projection, the norm of alpha_ij v_j W_O^h
// formed whole in float64; bad arguments named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "core/rows.hpp"
#include "support/error_message.hpp"

namespace attn {
namespace {

Tensor random_tensor(const Dims& shape, std::mt19937& rng) {
  Tensor t(DType::f32, shape);
  std::normal_distribution<float> normal;
  for (Index i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
  return t;
}

TEST(Contributions, AreTheWeightsTimesTheValueNormsRoundedOnce) {
  std::mt19937 rng(3);
  const Tensor q = random_tensor({2, 4, 9, 16}, rng), k = random_tensor({2, 2, 11, 16}, rng),
               v = random_tensor({2, 2, 11, 5}, rng);
  Options options;
  options.causal = true;
  const WeightSelection selection{{3, 1}, {8, 0, 4}, std::nullopt};
  const Tensor got = contributions(q.view(), k.view(), v.view(), options, selection);
  const Tensor alpha = weights(q.view(), k.view(), options, selection).weights;
  ASSERT_EQ(got.shape(), alpha.shape());
  const Index heads[] = {3, 1};
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < 3; ++i)
        for (Index j = 0; j < 11; ++j) {
          double norm = 0.0;
          for (Index d = 0; d < 5; ++d) {
            const double x = core::load_element(v.view(), b, heads[h] / 2, j, d);
            norm += x * x;
          }
          const double weight = core::load_element(alpha.view(), b, h, i, j);
          EXPECT_EQ(core::load_element(got.view(), b, h, i, j),
                    static_cast<float>(weight * std::sqrt(norm)));
        }
}

TEST(Contributions, WithAnOutputProjectionAreTheNormsOfTheWholeProduct) {
  std::mt19937 rng(5);
  const Tensor q = random_tensor({1, 2, 3, 8}, rng), k = random_tensor({1, 1, 4, 8}, rng),
               v = random_tensor({1, 1, 4, 6}, rng), w_o = random_tensor({1, 2, 6, 7}, rng);
  const TensorView projection = w_o.view();
  const Tensor got = contributions(q.view(), k.view(), v.view(), {}, {}, &projection);
  const Tensor alpha = weights(q.view(), k.view()).weights;
  for (Index h = 0; h < 2; ++h)
    for (Index i = 0; i < 3; ++i)
      for (Index j = 0; j < 4; ++j) {
        const double weight = core::load_element(alpha.view(), 0, h, i, j);
        double sum = 0.0;
        for (Index e = 0; e < 7; ++e) {
          double u = 0.0;
          for (Index d = 0; d < 6; ++d)
            u += weight * core::load_element(v.view(), 0, 0, j, d) *
                 core::load_element(projection, 0, h, d, e);
          sum += u * u;
        }
        EXPECT_NEAR(core::load_element(got.view(), 0, h, i, j), std::sqrt(sum),
                    2e-7 * std::sqrt(sum));
      }
}

TEST(Contributions, BadArgumentsAreNamed) {
  std::mt19937 rng(7);
  const Tensor q = random_tensor({1, 2, 3, 8}, rng), k = random_tensor({1, 1, 4, 8}, rng),
               v = random_tensor({1, 1, 4, 6}, rng), wrong = random_tensor({1, 2, 5, 7}, rng);
  const TensorView projection = wrong.view();
  EXPECT_THAT(testing::error_message(
                  [&] { contributions(q.view(), k.view(), v.view(), {}, {}, &projection); }),
              ::testing::StartsWith("output_projection: expected shape [1, 2, 6, E]"));
  WeightSelection top;
  top.top_k = 2;
  EXPECT_THAT(testing::error_message([&] { contributions(q.view(), k.view(), v.view(), {}, top); }),
              ::testing::StartsWith("selection.top_k: expected none"));
}

}  // namespace
}  // namespace attn
