// The float64 reference backward against central finite differences of the float64
// reference forward: the formulas themselves are tested, not only the fast kernel
// against them. The loss is sum(out * dout) for a fixed random dout, so its gradient with
// respect to out is dout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "core/rows.hpp"
#include "support/cases.hpp"

namespace attn {
namespace {

using testing::Case;

// Central differences of a float64 function: error about h^2 f''' ~ 1e-12 here, and
// rounding about 1e-16 / h ~ 1e-11.
constexpr double kStep = 1e-5;
constexpr double kTolerance = 1e-7;
// Sinks are float32 options: a step of 2^-10 is exact in float32; its h^2 error is ~1e-6.
constexpr double kSinkStep = 1.0 / 1024.0;
constexpr double kSinkTolerance = 1e-5;

Tensor random_tensor(const Dims& shape, unsigned seed) {
  Tensor t(DType::f64, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (Index i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = normal(rng);
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double sum = 0.0;
  for (Index i = 0; i < a.numel(); ++i) sum += a.data_as<double>()[i] * b.data_as<double>()[i];
  return sum;
}

// The inputs of a case with contiguous float64 copies of q, k and v (so that elements can
// be nudged in place), and the loss sum(out * dout).
struct Problem {
  explicit Problem(const Case& c) : inputs(testing::make_inputs(c)) {
    q = contiguous(inputs.q);
    k = contiguous(inputs.k);
    v = contiguous(inputs.v);
    options = inputs.options;
    options.backend = Backend::reference;
    dout = random_tensor({c.batch, c.heads_q, c.len_q, c.dim_v}, 7);
  }

  static Tensor contiguous(const TensorView& x) {
    Tensor t(DType::f64, x.shape);
    for (Index b = 0; b < x.shape[0]; ++b)
      for (Index h = 0; h < x.shape[1]; ++h)
        for (Index s = 0; s < x.shape[2]; ++s)
          core::load_row(
              x, b, h, s,
              t.data_as<double>() + ((b * x.shape[1] + h) * x.shape[2] + s) * x.shape[3]);
    return t;
  }

  double loss() const { return dot(forward(q.view(), k.view(), v.view(), options).context, dout); }

  testing::Inputs inputs;
  Tensor q, k, v, dout;
  Options options;
};

// max |numeric - analytic| over a tensor's elements, each nudged by +-step in place.
double worst_difference(Problem& p, Tensor& x, const Tensor& analytic) {
  double worst = 0.0;
  for (Index i = 0; i < x.numel(); ++i) {
    double& element = x.data_as<double>()[i];
    const double saved = element;
    element = saved + kStep;
    const double plus = p.loss();
    element = saved - kStep;
    const double minus = p.loss();
    element = saved;
    const double numeric = (plus - minus) / (2.0 * kStep);
    worst = std::max(worst, std::abs(numeric - analytic.data_as<double>()[i]));
  }
  return worst;
}

double largest(const Tensor& t) {
  double m = 0.0;
  for (Index i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.data_as<double>()[i]));
  return m;
}

void expect_matches_finite_differences(const Case& c) {
  Problem p(c);
  const Result forward_result =
      forward(p.q.view(), p.k.view(), p.v.view(), p.options, {.lse = true});
  const BackwardResult grads =
      backward({p.q.view(), p.k.view(), p.v.view(), forward_result.context.view(),
                forward_result.lse.view(), p.dout.view()},
               p.options);
  // The analytic gradients are not all zero: a test that compares zeros tests nothing.
  EXPECT_GT(largest(grads.dq) + largest(grads.dk), 1e-3);
  EXPECT_GT(largest(grads.dv), 1e-3);
  const double scale = std::max({1.0, largest(grads.dq), largest(grads.dk), largest(grads.dv)});
  EXPECT_LT(worst_difference(p, p.q, grads.dq), kTolerance * scale) << "dq";
  EXPECT_LT(worst_difference(p, p.k, grads.dk), kTolerance * scale) << "dk";
  EXPECT_LT(worst_difference(p, p.v, grads.dv), kTolerance * scale) << "dv";
  if (!c.sinks) {
    EXPECT_EQ(grads.dsinks.numel(), 0);
    return;
  }
  ASSERT_EQ(grads.dsinks.shape(), (Dims{1, c.heads_q, 1, 1}));
  EXPECT_GT(largest(grads.dsinks), 1e-3);
  for (Index h = 0; h < c.heads_q; ++h) {
    const float saved = p.options.sinks[h];
    p.options.sinks[h] = saved + static_cast<float>(kSinkStep);
    const double plus = p.loss();
    p.options.sinks[h] = saved - static_cast<float>(kSinkStep);
    const double minus = p.loss();
    p.options.sinks[h] = saved;
    const double numeric = (plus - minus) / (2.0 * kSinkStep);
    EXPECT_NEAR(numeric, grads.dsinks.data_as<double>()[h], kSinkTolerance * scale) << "head " << h;
  }
}

// Every option on its own and a few together, on shapes small enough for one forward per
// nudged element: GQA (4 query heads on 2), Lq != Lk, d != dv, and a packed batch.
std::vector<Case> small_cases() {
  auto shaped = [](Index batch, Index lq, Index lk) {
    Case c;
    c.batch = batch, c.heads_q = 4, c.heads_kv = 2, c.len_q = lq, c.len_k = lk;
    c.dim = 3, c.dim_v = 2, c.dtype = DType::f64;
    return c;
  };
  const Case plain = shaped(2, 5, 7), packed = shaped(1, 9, 12);
  std::vector<Case> out;
  auto add = [&](const Case& base, auto&& edit) {
    Case c = base;
    edit(c);
    out.push_back(c);
  };
  add(plain, [](Case&) {});
  add(plain, [](Case& c) { c.causal = true; });
  add(plain, [](Case& c) { c.causal = true, c.align = CausalAlign::bottom_right; });
  add(plain, [](Case& c) { c.window = {2, 0}; });
  add(plain, [](Case& c) { c.window = {1, 2}, c.align = CausalAlign::bottom_right; });
  add(plain, [](Case& c) { c.softcap = 1.5; });
  add(plain, [](Case& c) { c.alibi = true; });
  add(plain, [](Case& c) { c.sinks = true; });
  add(plain, [](Case& c) { c.mask = testing::MaskCase::boolean; });
  add(plain, [](Case& c) { c.mask = testing::MaskCase::additive; });
  add(plain, [](Case& c) { c.heads_kv = 1; });  // MQA
  add(packed, [](Case& c) { c.packed = true; });
  add(packed,
      [](Case& c) { c.packed = true, c.causal = true, c.align = CausalAlign::bottom_right; });
  add(plain, [](Case& c) {
    c.causal = true, c.align = CausalAlign::bottom_right, c.window = {3, -1};
    c.softcap = 2.0, c.alibi = true, c.sinks = true, c.mask = testing::MaskCase::additive;
  });
  add(packed, [](Case& c) { c.packed = true, c.sinks = true, c.softcap = 1.0, c.window = {2, 1}; });
  // Dropout: the mask is fixed by the seed, so the loss is smooth in q, k and v.
  add(plain, [](Case& c) { c.dropout = 0.4; });
  add(packed, [](Case& c) { c.packed = true, c.causal = true, c.sinks = true, c.dropout = 0.3; });
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name();
}

class ReferenceBackward : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceBackward, MatchesFiniteDifferencesOfForward) {
  expect_matches_finite_differences(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceBackward, ::testing::ValuesIn(small_cases()), case_name);

// A row that sees no key (and no sink) contributes nothing and gives zero dq, never NaN.
TEST(ReferenceBackwardEdges, FullyMaskedRowsGiveZeroGradients) {
  Case c;
  c.len_q = 3, c.len_k = 4, c.dim = 2, c.dim_v = 2, c.dtype = DType::f64;
  c.mask = testing::MaskCase::boolean;
  Problem p(c);
  bool* mask = p.inputs.mask_storage.data_as<bool>();
  std::fill(mask, mask + c.len_q * c.len_k, false);
  const Result f = forward(p.q.view(), p.k.view(), p.v.view(), p.options, {.lse = true});
  const BackwardResult g =
      backward({p.q.view(), p.k.view(), p.v.view(), f.context.view(), f.lse.view(), p.dout.view()},
               p.options);
  EXPECT_EQ(largest(g.dq), 0.0);
  EXPECT_EQ(largest(g.dk), 0.0);
  EXPECT_EQ(largest(g.dv), 0.0);
}

}  // namespace
}  // namespace attn
