// The position bias (attn/position_bias.hpp): its columns against values worked by hand
// from T5's formula, the reference's table gradient against central differences of the
// reference forward, the fast backward's gradient bits on any thread count, and every
// argument error. The fast kernels meet the reference over the case lists (cases.cpp).
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

using testing::error_message;
using ::testing::HasSubstr;

PositionBias bias_of_kind(BiasBuckets buckets, Index columns, Index offset, Index max_distance) {
  PositionBias bias;
  bias.buckets = buckets;
  bias.columns = columns;
  bias.offset = offset;
  bias.max_distance = max_distance;
  bias.table.assign(static_cast<std::size_t>(columns), 0.0f);
  return bias;
}

TEST(BiasColumn, ClippedClampsTheDistancePlusOffset) {
  const PositionBias bias = bias_of_kind(BiasBuckets::clipped, 5, 2, 0);
  EXPECT_EQ(bias_column(bias, -10), 0);
  EXPECT_EQ(bias_column(bias, -2), 0);
  EXPECT_EQ(bias_column(bias, -1), 1);
  EXPECT_EQ(bias_column(bias, 0), 2);
  EXPECT_EQ(bias_column(bias, 2), 4);
  EXPECT_EQ(bias_column(bias, 10), 4);
}

// T5 (32 buckets, max distance 128), relative position r = key - query = -d. Bidirectional:
// 16 per side, 8 exact; r = 20 > 0 takes 16 + 8 + floor(log(20 / 8) / log(16) * 8) = 26.
TEST(BiasColumn, T5BidirectionalAsT5Computes) {
  const PositionBias bias = bias_of_kind(BiasBuckets::t5, 32, 0, 128);
  EXPECT_EQ(bias_column(bias, 0), 0);
  EXPECT_EQ(bias_column(bias, 5), 5);
  EXPECT_EQ(bias_column(bias, -3), 19);
  EXPECT_EQ(bias_column(bias, -20), 26);
  // d = 20: 8 + floor(log(2.5) / log(16) * 8) = 10; d = 200 saturates at 15.
  EXPECT_EQ(bias_column(bias, 20), 10);
  EXPECT_EQ(bias_column(bias, 200), 15);
  EXPECT_EQ(bias_column(bias, -100000), 31);
}

// One-directional: 32 buckets, 16 exact; keys after the query all take bucket 0.
TEST(BiasColumn, T5CausalAsT5Computes) {
  const PositionBias bias = bias_of_kind(BiasBuckets::t5_causal, 32, 0, 128);
  EXPECT_EQ(bias_column(bias, -5), 0);
  EXPECT_EQ(bias_column(bias, 0), 0);
  EXPECT_EQ(bias_column(bias, 15), 15);
  // 16 + floor(log(20 / 16) / log(8) * 16) = 17
  EXPECT_EQ(bias_column(bias, 20), 17);
  EXPECT_EQ(bias_column(bias, 127), 31);
  EXPECT_EQ(bias_column(bias, 1000000), 31);
}

TEST(BiasColumn, T5BucketsNeverDecreaseWithDistanceAndEndAtTheLast) {
  for (const Index columns : {4, 8, 32, 33}) {
    const PositionBias bias = bias_of_kind(BiasBuckets::t5, columns, 0, 64);
    Index last = 0;
    for (Index d = 0; d < 300; ++d) {
      const Index c = bias_column(bias, d);
      EXPECT_GE(c, last) << "columns " << columns << ", distance " << d;
      EXPECT_LT(c, columns / 2);
      last = c;
    }
    EXPECT_EQ(last, columns / 2 - 1);
  }
}

// A small problem whose forward and backward run on the float64 reference.
struct Small {
  Small(BiasBuckets buckets, bool shared, bool causal) {
    std::mt19937_64 rng(7);
    std::normal_distribution<double> normal(0.0, 1.0);
    auto fill = [&](Tensor& t, const Dims& shape) {
      t = Tensor(DType::f64, shape);
      for (Index i = 0; i < t.view().numel(); ++i) t.data_as<double>()[i] = normal(rng);
    };
    fill(q, {2, 4, 6, 5});
    fill(k, {2, 2, 9, 5});
    fill(v, {2, 2, 9, 3});
    fill(dout, {2, 4, 6, 3});
    PositionBias bias = bias_of_kind(buckets, buckets == BiasBuckets::clipped ? 7 : 8, 3, 5);
    bias.table.clear();
    for (Index i = 0; i < (shared ? 1 : 4) * bias.columns; ++i) bias.table.push_back(normal(rng));
    options.position_bias = bias;
    options.causal = causal;
    options.causal_align = CausalAlign::bottom_right;
    options.softcap = 4.0;
    options.backend = Backend::reference;
  }

  // sum(out * dout) in float64.
  double loss(const Options& o) const {
    const Tensor out = forward(q.view(), k.view(), v.view(), o).context;
    double sum = 0.0;
    for (Index i = 0; i < out.view().numel(); ++i)
      sum += out.data_as<double>()[i] * dout.data_as<double>()[i];
    return sum;
  }

  Tensor q, k, v, dout;
  Options options;
};

class ReferenceBiasGradient : public ::testing::TestWithParam<std::tuple<BiasBuckets, bool, bool>> {
};

TEST_P(ReferenceBiasGradient, MatchesCentralDifferences) {
  const auto [buckets, shared, causal] = GetParam();
  const Small s(buckets, shared, causal);
  const Result f = forward(s.q.view(), s.k.view(), s.v.view(), s.options, {true, false});
  const BackwardResult g =
      backward({s.q.view(), s.k.view(), s.v.view(), f.context.view(), f.lse.view(), s.dout.view()},
               s.options);
  const PositionBias& bias = *s.options.position_bias;
  ASSERT_EQ(g.dposition_bias.shape(),
            (Dims{1, static_cast<Index>(bias.table.size()) / bias.columns, 1, bias.columns}));
  constexpr double kStep = 1e-4;  // the table is float64, as the reference's sums
  double largest = 0.0;
  for (std::size_t i = 0; i < bias.table.size(); ++i) {
    Options up = s.options, down = s.options;
    up.position_bias->table[i] += kStep;
    down.position_bias->table[i] -= kStep;
    const double want = (s.loss(up) - s.loss(down)) / (2 * kStep);
    const double got = g.dposition_bias.data_as<double>()[i];
    EXPECT_NEAR(got, want, 1e-7 * (1.0 + std::abs(want))) << "entry " << i;
    largest = std::max(largest, std::abs(want));
  }
  EXPECT_GT(largest, 1e-3) << "the gradient must not be all but zero";
}

INSTANTIATE_TEST_SUITE_P(Kinds, ReferenceBiasGradient,
                         ::testing::Combine(::testing::Values(BiasBuckets::clipped, BiasBuckets::t5,
                                                              BiasBuckets::t5_causal),
                                            ::testing::Bool(), ::testing::Bool()));

// The fast backward's table gradient is the same bytes on 1 and 2 threads, packed or not.
TEST(FastBiasGradient, SameBitsOnAnyThreadCount) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](const Dims& shape) {
    Tensor t(DType::f32, shape);
    for (Index i = 0; i < t.view().numel(); ++i)
      t.data_as<float>()[i] = static_cast<float>(normal(rng));
    return t;
  };
  const Tensor q = random({1, 4, 300, 32}), k = random({1, 2, 300, 32}),
               v = random({1, 2, 300, 32}), dout = random({1, 4, 300, 32});
  for (const bool packed : {false, true}) {
    Options o;
    o.causal = true;
    o.position_bias = bias_of_kind(BiasBuckets::t5, 32, 0, 100);
    for (std::size_t i = 0; i < o.position_bias->table.size(); ++i)
      o.position_bias->table[i] = normal(rng);
    if (packed) o.cu_seqlens_q = o.cu_seqlens_k = {0, 70, 71, 300};
    const Result f = forward(q.view(), k.view(), v.view(), o, {true, false});
    std::vector<std::vector<float>> runs;
    for (const int threads : {1, 2}) {
      o.threads = threads;
      const BackwardResult g =
          backward({q.view(), k.view(), v.view(), f.context.view(), f.lse.view(), dout.view()}, o);
      const float* d = g.dposition_bias.data_as<float>();
      runs.emplace_back(d, d + g.dposition_bias.view().numel());
    }
    EXPECT_EQ(runs[0], runs[1]) << (packed ? "packed" : "one sequence");
  }
}

struct Errors : ::testing::Test {
  Tensor q{DType::f32, {1, 2, 4, 8}}, k{DType::f32, {1, 2, 4, 8}}, v{DType::f32, {1, 2, 4, 8}};
  std::string forward_error(const PositionBias& bias) {
    Options o;
    o.position_bias = bias;
    return error_message([&] { forward(q.view(), k.view(), v.view(), o); });
  }
};

TEST_F(Errors, EveryBadSettingIsNamed) {
  PositionBias bias = bias_of_kind(BiasBuckets::t5, 2, 0, 10);
  EXPECT_THAT(forward_error(bias), HasSubstr("position_bias.columns: expected a count in [4"));
  bias = bias_of_kind(BiasBuckets::clipped, 0, 0, 0);
  EXPECT_THAT(forward_error(bias), HasSubstr("position_bias.columns"));
  bias = bias_of_kind(BiasBuckets::clipped, 4, 0, 0);
  bias.table.push_back(1.0f);
  EXPECT_THAT(forward_error(bias),
              HasSubstr("position_bias.table: expected 4 values (one row for every head) or 8"));
  bias.table.assign(8, 0.0f);
  bias.table[5] = NAN;
  EXPECT_THAT(forward_error(bias), HasSubstr("position_bias.table: expected finite values"));
  EXPECT_THAT(forward_error(bias), HasSubstr("at head 1, column 1"));
  bias = bias_of_kind(BiasBuckets::t5_causal, 8, 0, 4);
  EXPECT_THAT(forward_error(bias),
              HasSubstr("position_bias.max_distance: expected a distance in (4"));
  bias = bias_of_kind(BiasBuckets::clipped, 8, Index{1} << 31, 0);
  EXPECT_THAT(forward_error(bias), HasSubstr("position_bias.offset"));
}

TEST_F(Errors, GradientOutputMustMatchTheBias) {
  Options o;
  const Result f = forward(q.view(), k.view(), v.view(), o, {true, false});
  Tensor dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv(DType::f32, v.shape());
  Tensor dbias(DType::f32, {1, 1, 1, 4});
  const BackwardInputs in{q.view(),         k.view(),     v.view(),
                          f.context.view(), f.lse.view(), f.context.view()};
  Gradients g{dq.mutable_view(), dk.mutable_view(), dv.mutable_view(), {}, dbias.mutable_view()};
  EXPECT_THAT(error_message([&] { backward_into(in, o, g); }),
              HasSubstr("dposition_bias: expected none (no position_bias in the options)"));
  o.position_bias = bias_of_kind(BiasBuckets::clipped, 5, 0, 0);
  EXPECT_THAT(error_message([&] { backward_into(in, o, g); }),
              HasSubstr("dposition_bias: expected shape [1, 1, 1, 5]"));
  g.dposition_bias.reset();
  EXPECT_THAT(error_message([&] { backward_into(in, o, g); }),
              HasSubstr("dposition_bias: expected shape [1, 1, 1, 5] (position_bias is given)"));
}

TEST_F(Errors, DecodeRefusesIt) {
  KVCacheConfig config;
  config.heads_kv = 2;
  config.dim = 8;
  config.dim_v = 8;
  KVCache cache(config);
  const KVCache::SequenceId id = cache.add_sequence();
  Options o;
  o.position_bias = bias_of_kind(BiasBuckets::clipped, 5, 0, 0);
  const Tensor one(DType::f32, {1, 2, 1, 8});
  EXPECT_THAT(error_message([&] { decode(one.view(), cache, {id}, o); }),
              HasSubstr("position_bias: expected none (decode and paged attention"));
}

}  // namespace
}  // namespace attn
