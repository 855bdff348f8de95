// The lesson's three functions (scores, softmax, context) against hand-computed examples
// and naive formulas, and the three chained against attn::forward.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/compare.hpp"

namespace attn {
namespace {

using testing::compare;
using testing::describe;
using ::testing::HasSubstr;

// A contiguous float64 [b, h, s, d] tensor holding `values` (row-major).
Tensor tensor_of(const Dims& shape, const std::vector<double>& values) {
  Tensor t(DType::f64, shape);
  EXPECT_EQ(static_cast<Index>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.data_as<double>());
  return t;
}

std::vector<double> values_of(const Tensor& t) {
  const double* p = t.data_as<double>();
  return std::vector<double>(p, p + t.numel());
}

Tensor random_tensor(const Dims& shape, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor t(DType::f64, shape);
  for (Index i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = normal(rng);
  return t;
}

void expect_values_near(const std::vector<double>& got, const std::vector<double>& want,
                        double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tolerance) << "at " << i;
}

void expect_close(const TensorView& got, const TensorView& want, double nmse) {
  const testing::Comparison c = compare(got, want);
  EXPECT_TRUE(c.hard_failure.empty()) << describe(c);
  EXPECT_LE(c.nmse, nmse) << describe(c);
}

// One query [1, 2] against keys [3, 4] and [5, 6] (by hand: dots 11 and 17).
struct SmallExample {
  Tensor q = tensor_of({1, 1, 1, 2}, {1, 2});
  Tensor k = tensor_of({1, 1, 2, 2}, {3, 4, 5, 6});
};

TEST(Scores, DotByHand) {
  const SmallExample x;
  ScoreParams p;
  p.kind = ScoreKind::dot;
  expect_values_near(values_of(scores(x.q.view(), x.k.view(), p)), {11, 17}, 0);
}

TEST(Scores, ScaledDotByHand) {
  const SmallExample x;
  expect_values_near(values_of(scores(x.q.view(), x.k.view())),
                     {11 / std::sqrt(2.0), 17 / std::sqrt(2.0)}, 1e-14);
  ScoreParams p;
  p.scale = 0.5;
  expect_values_near(values_of(scores(x.q.view(), x.k.view(), p)), {5.5, 8.5}, 0);
}

TEST(Scores, GeneralByHand) {
  // W = [[1, 0], [2, -1]]: q^T W = [1 + 4, -2] = [5, -2]; scores 5*3 - 2*4 = 7, 25 - 12 = 13.
  const SmallExample x;
  const Tensor w = tensor_of({1, 1, 2, 2}, {1, 0, 2, -1});
  ScoreParams p;
  p.kind = ScoreKind::general;
  p.weight = w.view();
  expect_values_near(values_of(scores(x.q.view(), x.k.view(), p)), {7, 13}, 0);
}

TEST(Scores, AdditiveByHand) {
  // A = 1: W1 = [0.1, 0], W2 = [0, -0.1], w = [2]. W1 q = 0.1; W2 k = -0.4 and -0.6.
  const SmallExample x;
  const Tensor w1 = tensor_of({1, 1, 1, 2}, {0.1, 0}), w2 = tensor_of({1, 1, 1, 2}, {0, -0.1});
  const Tensor energy = tensor_of({1, 1, 1, 1}, {2});
  ScoreParams p;
  p.kind = ScoreKind::additive;
  p.query_projection = w1.view();
  p.key_projection = w2.view();
  p.energy = energy.view();
  expect_values_near(values_of(scores(x.q.view(), x.k.view(), p)),
                     {2 * std::tanh(0.1 - 0.4), 2 * std::tanh(0.1 - 0.6)}, 1e-15);
}

// The four score functions written out per (b, h, i, j), with GQA and Dq != Dk where the
// kind allows it.
double naive_score(const ScoreParams& p, const double* q, const double* k, Index dq, Index dk,
                   const std::vector<double>& w, const std::vector<double>& w1,
                   const std::vector<double>& w2, const std::vector<double>& energy) {
  double s = 0.0;
  switch (p.kind) {
    case ScoreKind::dot:
      for (Index d = 0; d < dq; ++d) s += q[d] * k[d];
      return s;
    case ScoreKind::scaled_dot:
      for (Index d = 0; d < dq; ++d) s += q[d] * k[d];
      return s * *p.scale;
    case ScoreKind::general:
      for (Index r = 0; r < dq; ++r)
        for (Index c = 0; c < dk; ++c) s += q[r] * w[r * dk + c] * k[c];
      return s;
    case ScoreKind::additive:
      for (std::size_t a = 0; a < energy.size(); ++a) {
        double hidden = 0.0;
        for (Index d = 0; d < dq; ++d) hidden += w1[a * dq + d] * q[d];
        for (Index d = 0; d < dk; ++d) hidden += w2[a * dk + d] * k[d];
        s += energy[a] * std::tanh(hidden);
      }
      return s;
  }
  return s;
}

class ScoresAgainstNaive : public ::testing::TestWithParam<ScoreKind> {};

TEST_P(ScoresAgainstNaive, RandomInputs) {
  const ScoreKind kind = GetParam();
  const bool same_dim = kind == ScoreKind::dot || kind == ScoreKind::scaled_dot;
  const Index batch = 2, heads = 4, heads_kv = 2, len_q = 5, len_k = 7, dq = 6;
  const Index dk = same_dim ? dq : 3, hidden = 4;
  const Tensor q = random_tensor({batch, heads, len_q, dq}, 1);
  const Tensor k = random_tensor({batch, heads_kv, len_k, dk}, 2);
  const Tensor w = random_tensor({1, 1, dq, dk}, 3), w1 = random_tensor({1, 1, hidden, dq}, 4);
  const Tensor w2 = random_tensor({1, 1, hidden, dk}, 5), e = random_tensor({1, 1, 1, hidden}, 6);
  ScoreParams p;
  p.kind = kind;
  if (kind == ScoreKind::scaled_dot) p.scale = 0.3;
  p.weight = w.view();
  p.query_projection = w1.view();
  p.key_projection = w2.view();
  p.energy = e.view();
  const Tensor got = scores(q.view(), k.view(), p);
  ASSERT_EQ(got.shape(), (Dims{batch, heads, len_q, len_k}));
  Tensor want(DType::f64, got.shape());
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < len_q; ++i)
        for (Index j = 0; j < len_k; ++j) {
          const double* q_row = q.data_as<double>() + ((b * heads + h) * len_q + i) * dq;
          const double* k_row =
              k.data_as<double>() + ((b * heads_kv + h / (heads / heads_kv)) * len_k + j) * dk;
          want.data_as<double>()[((b * heads + h) * len_q + i) * len_k + j] = naive_score(
              p, q_row, k_row, dq, dk, values_of(w), values_of(w1), values_of(w2), values_of(e));
        }
  expect_close(got.view(), want.view(), 1e-28);
}

std::string kind_name(const ::testing::TestParamInfo<ScoreKind>& info) {
  const char* names[] = {"dot", "scaled_dot", "general", "additive"};
  return names[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Kinds, ScoresAgainstNaive,
                         ::testing::Values(ScoreKind::dot, ScoreKind::scaled_dot,
                                           ScoreKind::general, ScoreKind::additive),
                         kind_name);

TEST(Scores, FollowQueryDtype) {
  const float q[] = {1, 2}, k[] = {3, 4};
  const Tensor s = scores(TensorView(q, DType::f32, {1, 1, 1, 2}),
                          TensorView(k, DType::f32, {1, 1, 1, 2}), {.kind = ScoreKind::dot});
  EXPECT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(s.data_as<float>()[0], 11.0f);
}

TEST(Softmax, ByHand) {
  // exp(0) : exp(log 2) : exp(log 3) = 1 : 2 : 3.
  const Tensor s = tensor_of({1, 1, 1, 3}, {0, std::log(2.0), std::log(3.0)});
  expect_values_near(values_of(softmax(s.view())), {1 / 6.0, 2 / 6.0, 3 / 6.0}, 1e-15);
}

TEST(Softmax, LargeScoresDoNotOverflow) {
  // exp(1000) overflows a double; subtracting the maximum first keeps it exact.
  const Tensor s = tensor_of({1, 1, 1, 2}, {1000, 1001});
  const double e = std::exp(1.0);
  expect_values_near(values_of(softmax(s.view())), {1 / (1 + e), e / (1 + e)}, 1e-15);
}

TEST(Softmax, MinusInfinityTakesNoWeightAndEmptyRowsAreZero) {
  const double inf = INFINITY;
  const Tensor s = tensor_of({1, 1, 2, 3}, {-inf, 1, 1, -inf, -inf, -inf});
  expect_values_near(values_of(softmax(s.view())), {0, 0.5, 0.5, 0, 0, 0}, 0);
}

TEST(Softmax, AgainstNaiveFormula) {
  const Tensor s = random_tensor({2, 3, 4, 9}, 7);
  const std::vector<double> x = values_of(s);
  std::vector<double> want(x.size());
  for (std::size_t row = 0; row < x.size() / 9; ++row) {
    double total = 0.0;
    for (std::size_t j = 0; j < 9; ++j) total += std::exp(x[row * 9 + j]);
    for (std::size_t j = 0; j < 9; ++j) want[row * 9 + j] = std::exp(x[row * 9 + j]) / total;
  }
  expect_values_near(values_of(softmax(s.view())), want, 1e-15);
}

TEST(Softmax, FollowsScoresDtype) {
  const float s[] = {0, 0};
  const Tensor alpha = softmax(TensorView(s, DType::f32, {1, 1, 1, 2}));
  EXPECT_EQ(alpha.dtype(), DType::f32);
  EXPECT_EQ(alpha.data_as<float>()[1], 0.5f);
}

TEST(Context, ByHand) {
  // alpha = [0.25, 0.75] over values [1, 10] and [3, 20]: [0.25 + 2.25, 2.5 + 15].
  const Tensor alpha = tensor_of({1, 1, 1, 2}, {0.25, 0.75});
  const Tensor v = tensor_of({1, 1, 2, 2}, {1, 10, 3, 20});
  expect_values_near(values_of(context(alpha.view(), v.view())), {2.5, 17.5}, 0);
}

TEST(Context, GroupedHeadsShareValues) {
  // Two query heads share one value head: each head averages the same values its own way.
  const Tensor alpha = tensor_of({1, 2, 1, 2}, {1, 0, 0.5, 0.5});
  const Tensor v = tensor_of({1, 1, 2, 1}, {4, 8});
  expect_values_near(values_of(context(alpha.view(), v.view())), {4, 6}, 0);
}

TEST(Context, FollowsValueDtype) {
  const double alpha[] = {1};
  const float v[] = {3};
  const Tensor c =
      context(TensorView(alpha, DType::f64, {1, 1, 1, 1}), TensorView(v, DType::f32, {1, 1, 1, 1}));
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_EQ(c.data_as<float>()[0], 3.0f);
}

// The lesson's three steps chained equal attn::forward on the same inputs.
TEST(Lesson, ThreeStepsEqualForward) {
  const Tensor q = random_tensor({2, 4, 5, 8}, 11), k = random_tensor({2, 2, 7, 8}, 12);
  const Tensor v = random_tensor({2, 2, 7, 3}, 13);
  const Tensor alpha = softmax(scores(q.view(), k.view()).view());
  const Tensor chained = context(alpha.view(), v.view());
  Options o;
  o.backend = Backend::reference;
  const Result fused = forward(q.view(), k.view(), v.view(), o, {.weights = true});
  expect_close(alpha.view(), fused.weights.view(), 1e-28);
  expect_close(chained.view(), fused.context.view(), 1e-28);
}

// The lesson's example through its three steps: scores [0, 1, 1], alpha [1, e, e] / (1 + 2e).
TEST(Lesson, ThreeWordExampleStepByStep) {
  const Tensor embeddings = tensor_of({1, 1, 3, 2}, {1, 0, 0, 1, 1, 1});
  const Tensor query = tensor_of({1, 1, 1, 2}, {0, 1});
  const Tensor s = scores(query.view(), embeddings.view(), {.kind = ScoreKind::dot});
  expect_values_near(values_of(s), {0, 1, 1}, 0);
  const Tensor alpha = softmax(s.view());
  const double e = std::exp(1.0), total = 1 + 2 * e;
  expect_values_near(values_of(alpha), {1 / total, e / total, e / total}, 1e-15);
  const Tensor c = context(alpha.view(), embeddings.view());
  expect_values_near(values_of(c), {(1 + e) / total, 2 * e / total}, 1e-15);
}

// float16 weights straight from softmax pass the default check: each is rounded by up to
// 2^-11, more than the default tolerance, and the check allows for that.
TEST(Lesson, HalfPrecisionPipelinePassesDefaultCheck) {
  const Tensor q64 = random_tensor({1, 2, 6, 4}, 21), k64 = random_tensor({1, 2, 33, 4}, 22);
  Tensor q(DType::f16, q64.shape()), k(DType::f16, k64.shape()), v(DType::f16, {1, 2, 33, 2});
  for (Index i = 0; i < q.numel(); ++i) {
    q.data_as<float16>()[i] = to_float16(static_cast<float>(q64.data_as<double>()[i]));
  }
  for (Index i = 0; i < k.numel(); ++i) {
    k.data_as<float16>()[i] = to_float16(static_cast<float>(k64.data_as<double>()[i]));
  }
  for (Index i = 0; i < v.numel(); ++i) v.data_as<float16>()[i] = to_float16(1.0f);
  const Tensor alpha = softmax(scores(q.view(), k.view()).view());
  EXPECT_EQ(alpha.dtype(), DType::f16);
  const Tensor c = context(alpha.view(), v.view());
  for (Index i = 0; i < c.numel(); ++i) EXPECT_NEAR(to_float(c.data_as<float16>()[i]), 1.0, 2e-3);
}

// The checks context makes on alpha, each with the message it gives.
std::string context_error(const std::vector<double>& alpha_row, const ContextCheck& check = {}) {
  const Index len = static_cast<Index>(alpha_row.size());
  const Tensor alpha = tensor_of({1, 1, 1, len}, alpha_row);
  const Tensor v(DType::f64, {1, 1, len, 1});
  try {
    context(alpha.view(), v.view(), check);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ContextCheck, RejectsNegativeWeight) {
  EXPECT_THAT(context_error({1.5, -0.5}),
              HasSubstr("alpha: expected finite, non-negative weights, given -0.500000 at "
                        "[0, 0, 0, 1]"));
}

TEST(ContextCheck, RejectsNonFiniteWeight) {
  EXPECT_THAT(context_error({NAN, 1}), HasSubstr("alpha: expected finite, non-negative weights, "
                                                 "given nan at [0, 0, 0, 0]"));
  EXPECT_THAT(context_error({0, INFINITY}), HasSubstr("given inf at [0, 0, 0, 1]"));
}

TEST(ContextCheck, RejectsRowsNotSummingToOne) {
  EXPECT_THAT(context_error({0.5, 0.4}),
              HasSubstr("alpha: expected rows summing to 1 (or 0 for a fully masked row), given "
                        "a sum of 0.900000 in row [0, 0, 0, 0]"));
}

TEST(ContextCheck, ToleranceDecides) {
  EXPECT_EQ(context_error({0.5, 0.5 + 1e-6}), "");
  EXPECT_NE(context_error({0.5, 0.5 + 1e-4}), "");
  EXPECT_EQ(context_error({0.5, 0.5 + 1e-4}, {.tolerance = 1e-3}), "");
  EXPECT_NE(context_error({0.5, 0.5 + 1e-9}, {.tolerance = 0.0}), "");
}

TEST(ContextCheck, AllZeroRowPasses) {
  EXPECT_EQ(context_error({0, 0, 0}), "");
}

TEST(ContextCheck, DisabledCheckUsesWeightsAsGiven) {
  const Tensor alpha = tensor_of({1, 1, 1, 2}, {2, -1});
  const Tensor v = tensor_of({1, 1, 2, 1}, {3, 5});
  const Tensor c = context(alpha.view(), v.view(), {.enabled = false});
  EXPECT_EQ(c.data_as<double>()[0], 1.0);
}

TEST(ContextCheck, RejectsBadTolerance) {
  EXPECT_THAT(context_error({1}, {.tolerance = -1}),
              HasSubstr("tolerance: expected a number >= 0, given -1.000000"));
  EXPECT_THAT(context_error({1}, {.tolerance = NAN}),
              HasSubstr("tolerance: expected a number >= 0, given nan"));
}

}  // namespace
}  // namespace attn
