// attn::weights and attn::forward's weights output against the float64 reference, on every
// case and every SIMD target compiled in that this CPU runs; selections against slices of
// the full matrix; top-k against a sort of the reference weights.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "core/rows.hpp"
#include "cpu/forward/forward.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::Case;
using testing::GuardedTensor;

using testing::for_each_target;

Dims weights_shape(const testing::Inputs& in) {
  return {in.q.shape[0], in.q.shape[1], in.q.shape[2], in.k.shape[2]};
}

struct ReferenceResult {
  Tensor weights, lse;  // [B, Hq, Lq, Lk] and [B, Hq, Lq, 1], f64
};

ReferenceResult run_reference(const testing::Inputs& in) {
  ReferenceResult want{Tensor(DType::f64, weights_shape(in)),
                       Tensor(DType::f64, {in.q.shape[0], in.q.shape[1], in.q.shape[2], 1})};
  Tensor context(DType::f64, {in.q.shape[0], in.q.shape[1], in.q.shape[2], in.v.shape[3]});
  Options options = in.options;
  options.backend = Backend::reference;
  forward_into(in.q, in.k, in.v, options,
               {context.mutable_view(), want.lse.mutable_view(), want.weights.mutable_view()});
  return want;
}

// Bounds against float64: the scores are the forward kernel's fp32 scores, alpha = exp in
// fp32 (2 ulp). Worst seen over the full sweep: NMSE 3.2e-12; max abs 3.6e-6, where ALiBi
// at distances near 1000 (Lq = 1025, Lk = 17) puts scores near -500, a float's ulp there
// being 3e-5 (quick list: 2.5e-13 and 3.2e-7); row sums 4.7e-7 off.
constexpr double kWeightsNmse = 2e-11;
constexpr double kWeightsMaxAbs = 1e-5;
constexpr double kRowSumError = 1e-6;

double element(const TensorView& t, Index b, Index h, Index s, Index j) {
  return core::load_element(t, b, h, s, j);
}

void expect_close(const TensorView& got, const TensorView& want, const char* what) {
  const testing::Comparison c = testing::compare(got, want);
  EXPECT_TRUE(c.hard_failure.empty()) << what << ": " << testing::describe(c);
  const bool wide = got.dtype == DType::f64;
  EXPECT_LT(c.nmse, wide ? 1e-24 : kWeightsNmse) << what << ": " << testing::describe(c);
  EXPECT_LT(c.max_abs, wide ? 1e-12 : kWeightsMaxAbs) << what << ": " << testing::describe(c);
}

// Each row sums to 1 less the sink's share exp(sink - lse); a row that sees nothing is 0.
void expect_rows_sum_to_one(const TensorView& got, const ReferenceResult& want,
                            const Options& options) {
  const TensorView lse = want.lse.view();
  for (Index b = 0; b < got.shape[0]; ++b)
    for (Index h = 0; h < got.shape[1]; ++h)
      for (Index s = 0; s < got.shape[2]; ++s) {
        const double row_lse = element(lse, b, h, s, 0);
        double sum = 0.0;
        bool all_zero = true;
        for (Index j = 0; j < got.shape[3]; ++j) {
          const double w = element(got, b, h, s, j);
          sum += w;
          all_zero = all_zero && w == 0.0;
        }
        if (row_lse == -std::numeric_limits<double>::infinity()) {
          EXPECT_TRUE(all_zero) << "fully masked row " << format_dims({b, h, s, 0});
          continue;
        }
        const double sink_share =
            options.sinks.empty() ? 0.0 : std::exp(static_cast<double>(options.sinks[h]) - row_lse);
        EXPECT_NEAR(sum, 1.0 - sink_share, kRowSumError) << "row " << format_dims({b, h, s, 0});
      }
}

class WeightsCases : public ::testing::TestWithParam<Case> {};

TEST_P(WeightsCases, MatchReferenceOnEveryTarget) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  const ReferenceResult want = run_reference(in);
  const DType stats = in.q.dtype == DType::f64 ? DType::f64 : DType::f32;
  for_each_target([&] {
    GuardedTensor got(stats, weights_shape(in));
    weights_into(in.q, in.k, in.options, {}, got.view());
    EXPECT_TRUE(got.guards_intact()) << "weights written out of bounds";
    expect_close(got.const_view(), want.weights.view(), "weights");
    expect_rows_sum_to_one(got.const_view(), want, in.options);
  });
  const WeightsResult owned = weights(in.q, in.k, in.options);
  EXPECT_EQ(owned.weights.dtype(), stats);
  EXPECT_TRUE(owned.indices.empty());
  expect_close(owned.weights.view(), want.weights.view(), "weights()");
}

// forward's weights output: the fast kernel's context (bit for bit what forward gives
// without weights) and weights from its own lse, written only inside the output. On the
// best target only: the weights pass is tested on every target above.
TEST_P(WeightsCases, ForwardWeightsOutputMatchesReference) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  const ReferenceResult want = run_reference(in);
  const Dims context_shape{in.q.shape[0], in.q.shape[1], in.q.shape[2], in.v.shape[3]};
  const Dims lse_shape{in.q.shape[0], in.q.shape[1], in.q.shape[2], 1};
  const DType stats = in.q.dtype == DType::f64 ? DType::f64 : DType::f32;
  GuardedTensor context(in.q.dtype, context_shape), lse(stats, lse_shape);
  GuardedTensor alpha(stats, weights_shape(in));
  forward_into(in.q, in.k, in.v, in.options, {context.view(), lse.view(), alpha.view()});
  EXPECT_TRUE(context.guards_intact() && lse.guards_intact() && alpha.guards_intact());
  expect_close(alpha.const_view(), want.weights.view(), "forward weights");
  expect_rows_sum_to_one(alpha.const_view(), want, in.options);

  const Result plain = forward(in.q, in.k, in.v, in.options, {.lse = true});
  ASSERT_EQ(plain.context.nbytes(),
            static_cast<std::size_t>(plain.context.numel()) * dtype_size(in.q.dtype));
  EXPECT_EQ(std::memcmp(plain.context.data(), context.const_view().data, plain.context.nbytes()), 0)
      << "context differs from forward without weights";
  EXPECT_EQ(std::memcmp(plain.lse.data(), lse.const_view().data, plain.lse.nbytes()), 0)
      << "lse differs from forward without weights";
}

// Whether two weights outputs hold the same float32 values bit for bit (a float64 one
// read as the float32 it was widened from), NaN where the other has NaN.
void expect_same_float_bits(const TensorView& got, const TensorView& want) {
  const Dims& shape = got.shape;
  for (Index b = 0; b < shape[0]; ++b)
    for (Index h = 0; h < shape[1]; ++h)
      for (Index s = 0; s < shape[2]; ++s)
        for (Index j = 0; j < shape[3]; ++j) {
          const auto x = static_cast<float>(element(got, b, h, s, j));
          const auto y = static_cast<float>(element(want, b, h, s, j));
          if (std::isnan(x) && std::isnan(y)) continue;
          std::uint32_t x_bits = 0, y_bits = 0;
          std::memcpy(&x_bits, &x, sizeof x);
          std::memcpy(&y_bits, &y, sizeof y);
          ASSERT_EQ(x_bits, y_bits)
              << "weight " << format_dims({b, h, s, j}) << ": " << x << " against " << y;
        }
}

// attn::weights on its own (which sums each row's lse by the walk forward runs) and
// attn::forward's weights output (the weights pass given forward's lse) give the same float32
// bits, on every target, in a float32 output and as the float32 a float64 output widens:
// both score every chunk by the scorer the plan names for it, AVX512-BF16 dot products
// included (on a CPU without them, tests/python/test_emulated_attention.py checks that on an
// emulated one).
void expect_weights_are_forward_weights(const testing::Inputs& in) {
  for_each_target([&] {
    const Dims context_shape{in.q.shape[0], in.q.shape[1], in.q.shape[2], in.v.shape[3]};
    Tensor context(in.q.dtype, context_shape);
    GuardedTensor alone(DType::f32, weights_shape(in)), forward32(DType::f32, weights_shape(in));
    GuardedTensor forward64(DType::f64, weights_shape(in));
    weights_into(in.q, in.k, in.options, {}, alone.view());
    forward_into(in.q, in.k, in.v, in.options,
                 {context.mutable_view(), std::nullopt, forward32.view()});
    forward_into(in.q, in.k, in.v, in.options,
                 {context.mutable_view(), std::nullopt, forward64.view()});
    EXPECT_TRUE(alone.guards_intact() && forward32.guards_intact() && forward64.guards_intact());
    expect_same_float_bits(alone.const_view(), forward32.const_view());
    expect_same_float_bits(alone.const_view(), forward64.const_view());
  });
}

TEST_P(WeightsCases, WeightsAreForwardWeightsBitsOnEveryTarget) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  // float64 inputs go to the reference (whose weights are float64 sums of its own).
  if (in.q.dtype != DType::f64) expect_weights_are_forward_weights(in);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name();
}

INSTANTIATE_TEST_SUITE_P(Cases, WeightsCases, ::testing::ValuesIn(testing::case_list()), case_name);

// A mask that hides a whole key tile from whole row chunks: the walk skips those chunks, and
// their weights must still be 0 (and attn::weights' equal forward's).
TEST(WeightsForwardKept, ChunksAMaskHidesForAWholeTile) {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 120, c.len_k = 300, c.dim = 32, c.dim_v = 32;
  c.mask = testing::MaskCase::boolean;
  testing::Inputs in = testing::make_inputs(c);
  bool* shown = in.mask_storage.data_as<bool>();
  for (Index i = 0; i < 100; ++i) std::fill(shown + i * c.len_k, shown + i * c.len_k + 200, false);
  expect_weights_are_forward_weights(in);
  const ReferenceResult want = run_reference(in);
  GuardedTensor context(DType::f32, {1, 4, 120, 32}), alpha(DType::f32, weights_shape(in));
  forward_into(in.q, in.k, in.v, in.options, {context.view(), std::nullopt, alpha.view()});
  expect_close(alpha.const_view(), want.weights.view(), "forward weights");
  expect_rows_sum_to_one(alpha.const_view(), want, in.options);
}

// Cases past one key tile and one work item, for the selection and top-k tests.
std::vector<Case> selection_cases() {
  auto shaped = [](Index b, Index hq, Index hkv, Index lq, Index lk, Index d) {
    Case c;
    c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.len_q = lq, c.len_k = lk, c.dim = d;
    c.dim_v = d;
    return c;
  };
  std::vector<Case> out;
  out.push_back(shaped(2, 4, 2, 70, 300, 64));
  Case causal = shaped(1, 3, 1, 150, 260, 40);
  causal.causal = true, causal.align = CausalAlign::bottom_right, causal.sinks = true;
  out.push_back(causal);
  Case window = shaped(1, 2, 2, 200, 200, 72);
  window.window = {40, 3}, window.softcap = 6.0, window.mask = testing::MaskCase::boolean;
  window.dtype = DType::bf16;
  out.push_back(window);
  Case packed = shaped(1, 4, 2, 140, 290, 32);
  packed.packed = true, packed.causal = true, packed.alibi = true;
  out.push_back(packed);
  Case wide = shaped(1, 2, 1, 40, 150, 24);
  wide.dtype = DType::f64, wide.mask = testing::MaskCase::additive;
  out.push_back(wide);
  return out;
}

class WeightsSelections : public ::testing::TestWithParam<Case> {};

// Chosen heads and rows (any order, repeats) are the same bits as that slice of the full
// result, on both the fast path and the reference.
TEST_P(WeightsSelections, HeadsAndRowsAreSlicesOfTheFullResult) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  const Index heads = in.q.shape[1], rows = in.q.shape[2];
  WeightSelection selection;
  selection.heads = {heads - 1, 0, heads - 1};
  selection.rows = {rows - 1, 0, rows / 2, 1, rows / 2};
  for (const Backend backend : {Backend::automatic, Backend::reference}) {
    Options options = in.options;
    options.backend = backend;
    const WeightsResult full = weights(in.q, in.k, options);
    const WeightsResult part = weights(in.q, in.k, options, selection);
    const TensorView f = full.weights.view(), s = part.weights.view();
    ASSERT_EQ(s.shape, (Dims{f.shape[0], 3, 5, f.shape[3]}));
    for (Index b = 0; b < s.shape[0]; ++b)
      for (Index h = 0; h < s.shape[1]; ++h)
        for (Index r = 0; r < s.shape[2]; ++r)
          for (Index j = 0; j < s.shape[3]; ++j) {
            const Index head = selection.heads[h], row = selection.rows[r];
            ASSERT_EQ(element(s, b, h, r, j), element(f, b, head, row, j))
                << format_dims({b, h, r, j});
          }
    WeightSelection only_heads;
    only_heads.heads = {1 % heads};
    const WeightsResult one_head = weights(in.q, in.k, options, only_heads);
    ASSERT_EQ(one_head.weights.shape(), (Dims{f.shape[0], 1, rows, f.shape[3]}));
    for (Index b = 0; b < f.shape[0]; ++b)
      for (Index r = 0; r < rows; ++r)
        for (Index j = 0; j < f.shape[3]; ++j) {
          ASSERT_EQ(element(one_head.weights.view(), b, 0, r, j), element(f, b, 1 % heads, r, j));
        }
  }
}

// Keys of one row that the reference gives weight, best first: larger weight, then lower
// index.
std::vector<Index> reference_ranking(const TensorView& want, Index b, Index h, Index s) {
  std::vector<Index> keys;
  for (Index j = 0; j < want.shape[3]; ++j) {
    if (element(want, b, h, s, j) > 0.0) keys.push_back(j);
  }
  std::stable_sort(keys.begin(), keys.end(), [&](Index x, Index y) {
    return element(want, b, h, s, x) > element(want, b, h, s, y);
  });
  return keys;
}

// top-k against a sort of the reference weights: the same weights in the same order, the
// same keys wherever the reference's neighbours are not tied within the fp32 error, and
// padding (-1, 0) past the keys the row sees. Also the same bits as the full result.
void expect_top_k(const testing::Inputs& in, const ReferenceResult& want, Index asked,
                  const Options& options) {
  WeightSelection selection;
  selection.top_k = asked;
  // More than Lk columns would hold only padding: top_k is capped at Lk.
  const Index k = std::min(asked, want.weights.view().shape[3]);
  const WeightsResult top = weights(in.q, in.k, options, selection);
  const WeightsResult full = weights(in.q, in.k, options);
  const TensorView t = top.weights.view(), w = want.weights.view();
  ASSERT_EQ(t.shape, (Dims{w.shape[0], w.shape[1], w.shape[2], k}));
  ASSERT_EQ(top.indices.size(), static_cast<std::size_t>(top.weights.numel()));
  const double tolerance = t.dtype == DType::f64 ? 1e-13 : kWeightsMaxAbs;
  for (Index b = 0; b < t.shape[0]; ++b)
    for (Index h = 0; h < t.shape[1]; ++h)
      for (Index s = 0; s < t.shape[2]; ++s) {
        const std::vector<Index> ranked = reference_ranking(w, b, h, s);
        const Index shown = std::min<Index>(k, static_cast<Index>(ranked.size()));
        const std::int64_t* index =
            top.indices.data() + ((b * t.shape[1] + h) * t.shape[2] + s) * k;
        for (Index p = 0; p < k; ++p) {
          const std::string where = format_dims({b, h, s, p});
          const double got = element(t, b, h, s, p);
          if (p >= shown) {
            EXPECT_EQ(index[p], -1) << where;
            EXPECT_EQ(got, 0.0) << where;
            continue;
          }
          ASSERT_GE(index[p], 0) << where;
          EXPECT_NEAR(got, element(w, b, h, s, ranked[p]), tolerance) << where;
          EXPECT_NEAR(got, element(w, b, h, s, index[p]), tolerance) << where;
          EXPECT_EQ(got, element(full.weights.view(), b, h, s, index[p])) << where;
          const double mine = element(w, b, h, s, ranked[p]);
          const bool tied_before =
              p > 0 && element(w, b, h, s, ranked[p - 1]) - mine < 2 * tolerance;
          const bool tied_after = p + 1 < static_cast<Index>(ranked.size()) &&
                                  mine - element(w, b, h, s, ranked[p + 1]) < 2 * tolerance;
          if (!tied_before && !tied_after) {
            EXPECT_EQ(index[p], ranked[p]) << where;
          }
        }
      }
}

TEST_P(WeightsSelections, TopKMatchesSortedReference) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  const ReferenceResult want = run_reference(in);
  for (const Index k : {Index{1}, Index{8}, Index{37}, in.k.shape[2] + 5}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    expect_top_k(in, want, k, in.options);
    Options reference = in.options;
    reference.backend = Backend::reference;
    expect_top_k(in, want, k, reference);
  }
}

INSTANTIATE_TEST_SUITE_P(Larger, WeightsSelections, ::testing::ValuesIn(selection_cases()),
                         case_name);

// Duplicate keys give exactly equal scores: the lower index must come first, on every
// target and on the reference.
TEST(WeightsTopK, TiesGoToTheLowerKeyIndex) {
  Case c;
  c.heads_q = 2, c.heads_kv = 1, c.len_q = 9, c.len_k = 300, c.dim = 16, c.dim_v = 16;
  testing::Inputs in = testing::make_inputs(c);
  // Key j is a copy of key j % 7: seven distinct scores, each on about 43 keys.
  auto* k = static_cast<float*>(const_cast<void*>(in.k.data));
  for (Index j = 7; j < c.len_k; ++j)
    std::copy(k + (j % 7) * c.dim, k + (j % 7 + 1) * c.dim, k + j * c.dim);
  WeightSelection selection;
  selection.top_k = 100;
  for (const Backend backend : {Backend::automatic, Backend::reference}) {
    Options options = in.options;
    options.backend = backend;
    for_each_target([&] {
      const WeightsResult top = weights(in.q, in.k, options, selection);
      const WeightsResult full = weights(in.q, in.k, options);
      for (Index h = 0; h < c.heads_q; ++h)
        for (Index s = 0; s < c.len_q; ++s) {
          // Expected: keys by descending weight of their class, ascending index within it.
          std::vector<Index> keys(static_cast<std::size_t>(c.len_k));
          for (Index j = 0; j < c.len_k; ++j) keys[j] = j;
          std::stable_sort(keys.begin(), keys.end(), [&](Index x, Index y) {
            return element(full.weights.view(), 0, h, s, x % 7) >
                   element(full.weights.view(), 0, h, s, y % 7);
          });
          const std::int64_t* index = top.indices.data() + (h * c.len_q + s) * 100;
          for (Index p = 0; p < 100; ++p) ASSERT_EQ(index[p], keys[p]) << h << " " << s << " " << p;
        }
    });
  }
}

// Hidden keys are skipped: NaN in a hidden key never reaches a weight.
TEST(WeightsHiddenKeys, NanInHiddenKeysNeverReachesWeights) {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 70, c.len_k = 170, c.dim = 64, c.dim_v = 64;
  std::vector<Case> variants;
  Case causal = c;
  causal.causal = true;
  variants.push_back(causal);
  Case window = c;
  window.window = {5, 0};
  variants.push_back(window);
  Case boolean = c;
  boolean.mask = testing::MaskCase::boolean;
  variants.push_back(boolean);
  for (const Case& variant : variants) {
    SCOPED_TRACE(variant.name());
    testing::Inputs in = testing::make_inputs(variant);
    auto* k = static_cast<float*>(const_cast<void*>(in.k.data));
    for (Index h = 0; h < c.heads_kv; ++h)
      k[(h * c.len_k + 40) * c.dim] = std::numeric_limits<float>::quiet_NaN();
    const ReferenceResult want = run_reference(in);
    for_each_target([&] {
      expect_close(weights(in.q, in.k, in.options).weights.view(), want.weights.view(), "weights");
      // top-k: a row that sees the NaN key has NaN weights, as in the reference.
      WeightSelection selection;
      selection.top_k = 5;
      const WeightsResult top = weights(in.q, in.k, in.options, selection);
      const TensorView w = want.weights.view();
      for (Index h = 0; h < c.heads_q; ++h)
        for (Index s = 0; s < c.len_q; ++s) {
          bool row_nan = false;
          for (Index j = 0; j < c.len_k; ++j)
            row_nan = row_nan || std::isnan(element(w, 0, h, s, j));
          for (Index p = 0; p < 5; ++p) {
            const Index at = (h * c.len_q + s) * 5 + p;
            if (top.indices[at] < 0) continue;
            EXPECT_EQ(std::isnan(top.weights.data_as<float>()[at]), row_nan) << h << " " << s;
          }
        }
    });
  }
}

// The same over many key tiles: the poisoned keys lie in middle tiles, hidden by a mask
// from most rows, which see keys in every tile, so each row's statistics merge tiles on
// both sides of them.
TEST(WeightsHiddenKeys, NanInHiddenKeysOfMiddleTilesNeverReachesWeights) {
  struct Poisoned {
    Index len_k;
    std::vector<Index> keys;
  };
  const Poisoned layouts[] = {{300, {150}}, {1025, {300, 700}}};
  for (const Poisoned& layout : layouts) {
    for (const testing::MaskCase mask : {testing::MaskCase::boolean, testing::MaskCase::additive}) {
      Case c;
      c.heads_q = 4, c.heads_kv = 2, c.len_q = 40, c.len_k = layout.len_k, c.dim = 64;
      c.dim_v = 64, c.mask = mask, c.causal = mask == testing::MaskCase::additive;
      c.align = CausalAlign::bottom_right;
      SCOPED_TRACE(c.name());
      testing::Inputs in = testing::make_inputs(c);
      for (const Index key : layout.keys) {
        testing::poison_key(in, key);
        testing::show_key_to_every_fourth_row(in, key);
      }
      const ReferenceResult want = run_reference(in);
      for_each_target([&] {
        expect_close(weights(in.q, in.k, in.options).weights.view(), want.weights.view(),
                     "weights");
      });
    }
  }
}

// An explicit scale, 0.37 and 1.9 times 1/sqrt(d) (scores of the usual size, so the usual
// bounds hold), at a generic dim and at those with their own forward kernel copy, over keys
// in several tiles; from weights and from forward's weights output.
TEST(WeightsScale, ExplicitScaleAtEveryHeadDim) {
  for (const Index dim : {40, 64, 80, 96, 128, 256}) {
    for (const double factor : {0.37, 1.9}) {
      Case c;
      c.heads_q = 4, c.heads_kv = 2, c.len_q = 21, c.len_k = 300, c.dim = dim, c.dim_v = dim;
      c.causal = true, c.align = CausalAlign::bottom_right;
      testing::Inputs in = testing::make_inputs(c);
      in.options.scale = factor / std::sqrt(static_cast<double>(dim));
      SCOPED_TRACE(c.name() + " scale " + std::to_string(factor) + "/sqrt(d)");
      const ReferenceResult want = run_reference(in);
      for_each_target([&] {
        expect_close(weights(in.q, in.k, in.options).weights.view(), want.weights.view(),
                     "weights");
      });
      GuardedTensor context(DType::f32, {1, 4, 21, dim}), alpha(DType::f32, weights_shape(in));
      forward_into(in.q, in.k, in.v, in.options, {context.view(), std::nullopt, alpha.view()});
      expect_close(alpha.const_view(), want.weights.view(), "forward weights");
    }
  }
}

// A row whose scores are NaN (a NaN query element; an additive mask whose only visible key
// is NaN) has NaN weights, as in the reference, from weights and from forward's weights
// output; a fully masked row stays 0.
TEST(WeightsNanRows, NanScoresGiveNanWeights) {
  Case c;
  c.heads_q = 2, c.heads_kv = 1, c.len_q = 20, c.len_k = 300, c.dim = 64, c.dim_v = 64;
  c.mask = testing::MaskCase::additive;
  testing::Inputs in = testing::make_inputs(c);
  auto* q = static_cast<float*>(const_cast<void*>(in.q.data));
  q[(1 * c.len_q + 3) * c.dim + 5] = std::numeric_limits<float>::quiet_NaN();
  float* mask = in.mask_storage.data_as<float>();
  for (Index j = 0; j < c.len_k; ++j) mask[5 * c.len_k + j] = -INFINITY;
  mask[5 * c.len_k + 200] = std::numeric_limits<float>::quiet_NaN();
  const ReferenceResult want = run_reference(in);
  ASSERT_TRUE(std::isnan(element(want.weights.view(), 0, 1, 3, 0)));
  ASSERT_TRUE(std::isnan(element(want.weights.view(), 0, 0, 5, 200)));
  for_each_target([&] {
    expect_close(weights(in.q, in.k, in.options).weights.view(), want.weights.view(), "weights");
    GuardedTensor context(DType::f32, {1, 2, 20, 64}), alpha(DType::f32, weights_shape(in));
    forward_into(in.q, in.k, in.v, in.options, {context.view(), std::nullopt, alpha.view()});
    expect_close(alpha.const_view(), want.weights.view(), "forward weights");
  });
}

TEST(WeightsThreads, BitwiseIdenticalForAnyThreadCount) {
  Case c;
  c.heads_q = 6, c.heads_kv = 2, c.len_q = 333, c.len_k = 410, c.dim = 64, c.dim_v = 64;
  c.causal = true, c.align = CausalAlign::bottom_right, c.alibi = true, c.sinks = true;
  const testing::Inputs in = testing::make_inputs(c);
  WeightSelection top;
  top.top_k = 9;
  for (const WeightSelection& selection : {WeightSelection{}, top}) {
    std::vector<std::vector<unsigned char>> results;
    for (const int threads : {1, 2, 3, 7}) {
      Options options = in.options;
      options.threads = threads;
      const WeightsResult r = weights(in.q, in.k, options, selection);
      std::vector<unsigned char> bytes(r.weights.nbytes());
      std::memcpy(bytes.data(), r.weights.data(), r.weights.nbytes());
      results.push_back(std::move(bytes));
    }
    for (std::size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << i;
  }
}

// Every output dtype forward's weights view may have, against float64 with its rounding.
TEST(WeightsForward, WritesEveryOutputDtype) {
  Case c;
  c.heads_q = 2, c.len_q = 50, c.len_k = 190, c.dim = 40, c.dim_v = 40, c.causal = true;
  const testing::Inputs in = testing::make_inputs(c);
  const ReferenceResult want = run_reference(in);
  const std::pair<DType, double> outputs[] = {{DType::f16, 1e-6},
                                              {DType::bf16, 1e-4},
                                              {DType::f32, kWeightsNmse},
                                              {DType::f64, kWeightsNmse}};
  for (const auto& [dtype, bound] : outputs) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor context(DType::f32, {1, 2, 50, 40});
    GuardedTensor alpha(dtype, weights_shape(in));
    Options options = in.options;
    options.backend = Backend::fast;
    forward_into(in.q, in.k, in.v, options, {context.mutable_view(), std::nullopt, alpha.view()});
    EXPECT_TRUE(alpha.guards_intact());
    const testing::Comparison cmp = testing::compare(alpha.const_view(), want.weights.view());
    EXPECT_TRUE(cmp.hard_failure.empty()) << testing::describe(cmp);
    EXPECT_LT(cmp.nmse, bound) << testing::describe(cmp);
  }
}

// Expects the message of the attn::Error that fn() throws to start with `prefix`.
template <class Fn>
void expect_error(Fn&& fn, const std::string& prefix) {
  const std::string message = testing::error_message(fn);
  EXPECT_EQ(message.rfind(prefix, 0), 0u) << message;
}

void expect_error(const testing::Inputs& in, const WeightSelection& selection,
                  const std::string& starts_with) {
  expect_error([&] { weights(in.q, in.k, in.options, selection); }, starts_with);
}

TEST(WeightsErrors, BadSelectionsNameTheArgument) {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 5, c.len_k = 6, c.dim = 8, c.dim_v = 8;
  const testing::Inputs in = testing::make_inputs(c);
  WeightSelection heads;
  heads.heads = {0, 4};
  expect_error(in, heads, "selection.heads: expected query heads in [0, 4), given 4 at position 1");
  heads.heads = {-1};
  expect_error(in, heads, "selection.heads: expected query heads in [0, 4), given -1");
  WeightSelection rows;
  rows.rows = {5};
  expect_error(in, rows, "selection.rows: expected query rows in [0, 5), given 5 at position 0");
  WeightSelection top;
  top.top_k = 0;
  expect_error(in, top, "selection.top_k: expected a count of at least 1");
  top.top_k = -2;
  expect_error(in, top, "selection.top_k: expected a count of at least 1");
  // weights_into checks the caller's storage.
  auto into_error = [&](const WeightSelection& selection, const MutableTensorView& out,
                        std::int64_t* indices, const std::string& starts_with) {
    expect_error([&] { weights_into(in.q, in.k, in.options, selection, out, indices); },
                 starts_with);
  };
  Tensor wrong(DType::f32, {1, 4, 5, 7});
  into_error({}, wrong.mutable_view(), nullptr,
             "weights: expected shape [1, 4, 5, 6], given [1, 4, 5, 7]");
  Tensor three(DType::f32, {1, 4, 5, 3});
  WeightSelection top3;
  top3.top_k = 3;
  into_error(top3, three.mutable_view(), nullptr, "indices: expected storage for [1, 4, 5, 3]");
  std::vector<std::int64_t> indices(60);
  Tensor all(DType::f32, {1, 4, 5, 6});
  into_error({}, all.mutable_view(), indices.data(), "indices: expected a null pointer (no top_k)");
  Tensor flags(DType::boolean, {1, 4, 5, 6});
  into_error({}, flags.mutable_view(), nullptr, "weights: expected a floating-point dtype");
  // Problems are checked as for forward, naming the argument.
  Case narrow = c;
  narrow.dim = 4;
  const testing::Inputs other = testing::make_inputs(narrow);
  expect_error([&] { weights(in.q, other.k, in.options); }, "k: ");
  Case wide = c;
  wide.dtype = DType::f64;
  const testing::Inputs f64 = testing::make_inputs(wide);
  Options fast = f64.options;
  fast.backend = Backend::fast;
  expect_error([&] { weights(f64.q, f64.k, fast); }, "backend: ");
  Options bad_sinks = in.options;
  bad_sinks.sinks = {1.0f};
  expect_error([&] { weights(in.q, in.k, bad_sinks); }, "sinks: ");
}

}  // namespace
}  // namespace attn
