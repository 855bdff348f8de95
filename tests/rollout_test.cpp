// attn::rollout against its definition written out here (Abnar & Zuidema 2020): the heads'
// mean mixed with the identity, rows normalised, multiplied down the layers.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/error_message.hpp"

namespace attn {
namespace {

using testing::error_message;
using Matrix = std::vector<std::vector<double>>;

// Random self-attention weights [layers, H, L, L]: each row a softmax; row 0 of layer 1
// all zeros (a row that sees nothing).
Tensor random_weights(Index layers, Index heads, Index n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 2.0);
  Tensor w(DType::f32, {layers, heads, n, n});
  float* data = w.data_as<float>();
  for (Index row = 0; row < layers * heads * n; ++row) {
    std::vector<double> e(static_cast<std::size_t>(n));
    double sum = 0.0;
    for (double& x : e) sum += x = std::exp(normal(rng));
    for (Index j = 0; j < n; ++j) data[row * n + j] = static_cast<float>(e[j] / sum);
  }
  for (Index h = 0; h < heads; ++h)
    for (Index j = 0; j < n; ++j) data[((1 * heads + h) * n + 0) * n + j] = 0.0f;
  return w;
}

Matrix mixed_layer(const Tensor& w, Index l, double residual) {
  const Dims& s = w.shape();
  const Index heads = s[1], n = s[2];
  Matrix a(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(n), 0.0));
  for (Index i = 0; i < n; ++i) {
    double sum = 0.0;
    for (Index j = 0; j < n; ++j) {
      double mean = 0.0;
      for (Index h = 0; h < heads; ++h)
        mean += w.data_as<float>()[((l * heads + h) * n + i) * n + j];
      a[i][j] = residual * (i == j) + (1.0 - residual) * mean / static_cast<double>(heads);
      sum += a[i][j];
    }
    if (sum > 0.0) {
      for (double& x : a[i]) x /= sum;  // a row that sees nothing stays 0 (residual 0)
    }
  }
  return a;
}

Matrix product(const Matrix& a, const Matrix& b) {
  const std::size_t n = a.size();
  Matrix c(n, std::vector<double>(n, 0.0));
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t j = 0; j < n; ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

TEST(Rollout, IsTheProductOfTheMixedLayersFromTheirDefinition) {
  const Index layers = 4, heads = 3, n = 7;
  const Tensor w = random_weights(layers, heads, n, 11);
  for (const double residual : {0.0, 0.5, 0.8}) {
    SCOPED_TRACE(residual);
    const Tensor got = rollout(w.view(), residual);
    ASSERT_EQ(got.dtype(), DType::f64);
    ASSERT_EQ(got.shape(), (Dims{layers, 1, n, n}));
    Matrix want = mixed_layer(w, 0, residual);
    for (Index l = 0; l < layers; ++l) {
      if (l > 0) want = product(mixed_layer(w, l, residual), want);
      for (Index i = 0; i < n; ++i) {
        double sum = 0.0;
        for (Index j = 0; j < n; ++j) {
          const double x = got.data_as<double>()[(l * n + i) * n + j];
          EXPECT_NEAR(x, want[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)], 1e-12);
          sum += x;
        }
        if (residual > 0.0) {
          EXPECT_NEAR(sum, 1.0, 1e-12);  // without the identity a row that sees nothing is 0
        }
      }
    }
  }
}

TEST(Rollout, TheIdentityAloneGivesTheIdentity) {
  const Tensor got = rollout(random_weights(2, 2, 5, 3).view(), 1.0);
  for (Index l = 0; l < 2; ++l)
    for (Index i = 0; i < 5; ++i)
      for (Index j = 0; j < 5; ++j)
        EXPECT_EQ(got.data_as<double>()[(l * 5 + i) * 5 + j], i == j ? 1.0 : 0.0);
}

TEST(Rollout, RefusesBadArgumentsNamingThem) {
  const Tensor square = random_weights(1, 1, 3, 1);
  Tensor wide(DType::f32, {1, 1, 3, 4});
  EXPECT_EQ(
      error_message([&] { rollout(wide.view()); }).rfind("weights: expected [layers, H, L, L]", 0),
      0u);
  EXPECT_EQ(error_message([&] {
              rollout(square.view(), 1.5);
            }).rfind("residual: expected a share in [0, 1], given 1.5", 0),
            0u);
}

}  // namespace
}  // namespace attn
