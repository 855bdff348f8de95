// The float64 reference against hand-computed values and an independent naive formula:
// the full score matrix built from the plain definitions, softmax without max subtraction,
// and the weighted sum, for every case of case_list().
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"

namespace attn {
namespace {

using testing::Case;
using testing::case_list;
using testing::compare;
using testing::describe;
using testing::GuardedTensor;
using testing::Inputs;
using testing::make_inputs;

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kTight = 1e-24;  // NMSE between two float64 computations

// t[b, h, s, d] as a double, read through the strides without the library's row helpers.
double element(const TensorView& t, Index b, Index h, Index s, Index d) {
  const Index at = b * t.strides[0] + h * t.strides[1] + s * t.strides[2] + d * t.strides[3];
  switch (t.dtype) {
    case DType::f16:
      return to_float(static_cast<const float16*>(t.data)[at]);
    case DType::bf16:
      return to_float(static_cast<const bfloat16*>(t.data)[at]);
    case DType::f32:
      return static_cast<const float*>(t.data)[at];
    case DType::f64:
      return static_cast<const double*>(t.data)[at];
    case DType::boolean:
      return static_cast<const bool*>(t.data)[at] ? 1.0 : 0.0;
  }
  return 0.0;
}

// A contiguous float64 [b, h, s, d] array with plain indexing, for expected values.
struct Grid {
  Dims shape;
  std::vector<double> values;
  explicit Grid(const Dims& dims)
      : shape(dims), values(static_cast<std::size_t>(dims[0] * dims[1] * dims[2] * dims[3])) {}
  double& operator()(Index b, Index h, Index s, Index d) {
    return values[static_cast<std::size_t>(((b * shape[1] + h) * shape[2] + s) * shape[3] + d)];
  }
  TensorView view() const { return TensorView(values.data(), DType::f64, shape); }
};

struct Expected {
  Grid context, lse, weights;
};

// Query rows [q0, q0 + len_q) against key rows [k0, k0 + len_k) of one batch entry.
struct Block {
  Index q0, len_q, k0, len_k;
};

std::vector<Block> blocks_of(const Options& o, Index len_q, Index len_k) {
  if (o.cu_seqlens_q.empty()) return {{0, len_q, 0, len_k}};
  std::vector<Block> blocks;
  for (std::size_t s = 0; s + 1 < o.cu_seqlens_q.size(); ++s) {
    blocks.push_back({o.cu_seqlens_q[s], o.cu_seqlens_q[s + 1] - o.cu_seqlens_q[s],
                      o.cu_seqlens_k[s], o.cu_seqlens_k[s + 1] - o.cu_seqlens_k[s]});
  }
  return blocks;
}

// The definition of attention, written out plainly: for each query row build every score,
// -inf where a key is hidden, then alpha_j = exp(s_j) / (sum_j exp(s_j) + exp(sink)),
// C = sum_j alpha_j v_j and lse = log(sum_j exp(s_j) + exp(sink)).
Expected naive_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Options& o) {
  const Index batch = q.shape[0], heads = q.shape[1], len_q = q.shape[2], dim = q.shape[3];
  const Index len_k = k.shape[2], dim_v = v.shape[3], group = heads / k.shape[1];
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(dim));
  Expected e{Grid({batch, heads, len_q, dim_v}), Grid({batch, heads, len_q, 1}),
             Grid({batch, heads, len_q, len_k})};
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (const Block& blk : blocks_of(o, len_q, len_k))
        for (Index i = 0; i < blk.len_q; ++i) {
          const Index row = blk.q0 + i;
          const Index shift =
              o.causal_align == CausalAlign::bottom_right ? blk.len_k - blk.len_q : 0;
          const Index position = i + shift;
          std::vector<double> s(static_cast<std::size_t>(blk.len_k), -kInfinity);
          for (Index j = 0; j < blk.len_k; ++j) {
            const Index key = blk.k0 + j;
            if (o.causal && j > position) continue;
            if (o.window.left >= 0 && j < position - o.window.left) continue;
            if (o.window.right >= 0 && j > position + o.window.right) continue;
            double mask = 0.0;
            if (o.mask) {
              const Index mb = o.mask->shape[0] == 1 ? 0 : b, mh = o.mask->shape[1] == 1 ? 0 : h;
              mask = element(*o.mask, mb, mh, row, key);
              if (o.mask->dtype == DType::boolean) mask = mask != 0.0 ? 0.0 : -kInfinity;
            }
            if (mask == -kInfinity) continue;
            double dot = 0.0;
            for (Index d = 0; d < dim; ++d) {
              dot += element(q, b, h, row, d) * element(k, b, h / group, key, d);
            }
            double score = scale * dot;
            if (o.softcap > 0) score = o.softcap * std::tanh(score / o.softcap);
            if (!o.alibi_slopes.empty()) {
              score -= o.alibi_slopes[h] * static_cast<double>(std::abs(position - j));
            }
            if (o.position_bias) score += bias_of(*o.position_bias, h, position - j);
            s[j] = score + mask;
          }
          double total = o.sinks.empty() ? 0.0 : std::exp(static_cast<double>(o.sinks[h]));
          for (const double x : s) total += std::exp(x);
          e.lse(b, h, row, 0) = std::log(total);
          for (Index j = 0; j < blk.len_k; ++j) {
            const double alpha = total > 0 ? std::exp(s[j]) / total : 0.0;
            e.weights(b, h, row, blk.k0 + j) = alpha;
            for (Index d = 0; d < dim_v; ++d) {
              e.context(b, h, row, d) += alpha * element(v, b, h / group, blk.k0 + j, d);
            }
          }
        }
  return e;
}

// The reference's three outputs in float64, each with guard bytes around it.
struct Guarded {
  GuardedTensor context, lse, weights;
  Guarded(const TensorView& q, const TensorView& k, const TensorView& v)
      : context(DType::f64, {q.shape[0], q.shape[1], q.shape[2], v.shape[3]}),
        lse(DType::f64, {q.shape[0], q.shape[1], q.shape[2], 1}),
        weights(DType::f64, {q.shape[0], q.shape[1], q.shape[2], k.shape[2]}) {}
};

Options reference_options(Options options) {
  options.backend = Backend::reference;
  return options;
}

void run_reference(const TensorView& q, const TensorView& k, const TensorView& v,
                   const Options& options, Guarded& out) {
  forward_into(q, k, v, reference_options(options),
               {out.context.view(), out.lse.view(), out.weights.view()});
}

// True when the two views hold bitwise-identical float64 values (NaN nowhere).
void expect_identical(const TensorView& got, const TensorView& want, const char* what) {
  const testing::Comparison c = compare(got, want);
  EXPECT_TRUE(c.hard_failure.empty() && c.max_abs == 0.0) << what << ": " << describe(c);
}

void expect_close(const TensorView& got, const TensorView& want, double nmse, const char* what) {
  const testing::Comparison c = compare(got, want);
  EXPECT_TRUE(c.hard_failure.empty()) << what << ": " << describe(c);
  EXPECT_LE(c.nmse, nmse) << what << ": " << describe(c);
}

// Allowed NMSE for a float64 result stored in `dtype`: the square of its unit roundoff u,
// since rounding to nearest moves each element by at most u of itself (normal values). An
// output of a few dozen elements comes near that bound (bf16, D 19, one row: 5.2e-6).
double rounding_nmse(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return 0x1p-22;  // u = 2^-11
    case DType::bf16:
      return 0x1p-16;  // u = 2^-8
    case DType::f32:
      return 1e-14;
    default:
      return kTight;
  }
}

// A contiguous [b, h, s, d] copy of a view in `dtype`, with every row of `view` copied.
Tensor contiguous_copy(const TensorView& view, DType dtype) {
  Tensor out(dtype, view.shape);
  for (Index b = 0; b < view.shape[0]; ++b)
    for (Index h = 0; h < view.shape[1]; ++h)
      for (Index s = 0; s < view.shape[2]; ++s)
        for (Index d = 0; d < view.shape[3]; ++d) {
          const double x = element(view, b, h, s, d);
          const Index at = ((b * view.shape[1] + h) * view.shape[2] + s) * view.shape[3] + d;
          switch (dtype) {
            case DType::f16:
              out.data_as<float16>()[at] = to_float16(static_cast<float>(x));
              break;
            case DType::bf16:
              out.data_as<bfloat16>()[at] = to_bfloat16(static_cast<float>(x));
              break;
            case DType::f32:
              out.data_as<float>()[at] = static_cast<float>(x);
              break;
            case DType::f64:
              out.data_as<double>()[at] = x;
              break;
            case DType::boolean:
              out.data_as<bool>()[at] = x != 0.0;
              break;
          }
        }
  return out;
}

// [B, Hkv, L, D] -> [B, Hq, L, D]: kv head h / group repeated for every query head h.
Tensor repeat_heads(const TensorView& kv, Index heads_q) {
  const Index group = heads_q / kv.shape[1];
  Tensor out(DType::f64, {kv.shape[0], heads_q, kv.shape[2], kv.shape[3]});
  double* dst = out.data_as<double>();
  for (Index b = 0; b < kv.shape[0]; ++b)
    for (Index h = 0; h < heads_q; ++h)
      for (Index s = 0; s < kv.shape[2]; ++s)
        for (Index d = 0; d < kv.shape[3]; ++d) *dst++ = element(kv, b, h / group, s, d);
  return out;
}

// Writes NaN into element d = 0 .. D-1 of row (b, h, s) of a contiguous or strided view.
void poison_row(const TensorView& t, Index b, Index h, Index s) {
  for (Index d = 0; d < t.shape[3]; ++d) {
    const Index at = b * t.strides[0] + h * t.strides[1] + s * t.strides[2] + d;
    void* base = const_cast<void*>(t.data);
    switch (t.dtype) {
      case DType::f16:
        static_cast<float16*>(base)[at] = to_float16(NAN);
        break;
      case DType::bf16:
        static_cast<bfloat16*>(base)[at] = to_bfloat16(NAN);
        break;
      case DType::f32:
        static_cast<float*>(base)[at] = NAN;
        break;
      case DType::f64:
        static_cast<double*>(base)[at] = NAN;
        break;
      case DType::boolean:
        break;
    }
  }
}

class ReferenceCase : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceCase, MatchesNaiveFormula) {
  const Case c = GetParam();
  const Inputs in = make_inputs(c);
  const Expected want = naive_attention(in.q, in.k, in.v, in.options);
  Guarded got(in.q, in.k, in.v);
  run_reference(in.q, in.k, in.v, in.options, got);
  EXPECT_TRUE(got.context.guards_intact() && got.lse.guards_intact() &&
              got.weights.guards_intact());
  expect_close(got.context.const_view(), want.context.view(), kTight, "context");
  expect_close(got.lse.const_view(), want.lse.view(), kTight, "lse");
  expect_close(got.weights.const_view(), want.weights.view(), kTight, "weights");
}

TEST_P(ReferenceCase, ResultFollowsQueryDtype) {
  const Case c = GetParam();
  const Inputs in = make_inputs(c);
  const Expected want = naive_attention(in.q, in.k, in.v, in.options);
  const Result r =
      forward(in.q, in.k, in.v, reference_options(in.options), {.lse = true, .weights = true});
  const DType stats = c.dtype == DType::f64 ? DType::f64 : DType::f32;
  EXPECT_EQ(r.context.dtype(), c.dtype);
  EXPECT_EQ(r.lse.dtype(), stats);
  EXPECT_EQ(r.weights.dtype(), stats);
  expect_close(r.context.view(), want.context.view(), rounding_nmse(c.dtype), "context");
  expect_close(r.lse.view(), want.lse.view(), rounding_nmse(stats), "lse");
  expect_close(r.weights.view(), want.weights.view(), rounding_nmse(stats), "weights");
}

// Each row's weights plus its sinks' share exp(sink - lse) sum to 1; a row with lse = -inf
// (no visible key, no sink) has zero weights and a zero context, never NaN.
TEST_P(ReferenceCase, RowsSumToOneOrAreEmpty) {
  const Case c = GetParam();
  const Inputs in = make_inputs(c);
  Guarded got(in.q, in.k, in.v);
  run_reference(in.q, in.k, in.v, in.options, got);
  const TensorView context = got.context.const_view(), lse = got.lse.const_view();
  const TensorView weights = got.weights.const_view();
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.heads_q; ++h)
      for (Index i = 0; i < c.len_q; ++i) {
        double sum = 0.0;
        for (Index j = 0; j < c.len_k; ++j) sum += element(weights, b, h, i, j);
        const double row_lse = element(lse, b, h, i, 0);
        if (row_lse == -kInfinity) {
          EXPECT_EQ(sum, 0.0) << "row " << i;
          for (Index d = 0; d < c.dim_v; ++d) EXPECT_EQ(element(context, b, h, i, d), 0.0);
        } else {
          const double sink_share = c.sinks ? std::exp(in.options.sinks[h] - row_lse) : 0.0;
          EXPECT_NEAR(sum + sink_share, 1.0, 1e-12) << "row " << i;
        }
      }
}

// Keys that no query of a (batch, kv head) may see get NaN in k and v; nothing changes.
TEST_P(ReferenceCase, NaNInHiddenKeysNeverReachesOutput) {
  const Case c = GetParam();
  Inputs in = make_inputs(c);
  Guarded clean(in.q, in.k, in.v);
  run_reference(in.q, in.k, in.v, in.options, clean);
  const TensorView weights = clean.weights.const_view();
  const Index group = c.heads_q / c.heads_kv;
  for (Index b = 0; b < c.batch; ++b)
    for (Index kv_head = 0; kv_head < c.heads_kv; ++kv_head)
      for (Index j = 0; j < c.len_k; ++j) {
        bool seen = false;
        for (Index h = kv_head * group; h < (kv_head + 1) * group; ++h)
          for (Index i = 0; i < c.len_q; ++i) seen = seen || element(weights, b, h, i, j) != 0.0;
        if (seen) continue;
        poison_row(in.k, b, kv_head, j);
        poison_row(in.v, b, kv_head, j);
      }
  Guarded poisoned(in.q, in.k, in.v);
  run_reference(in.q, in.k, in.v, in.options, poisoned);
  expect_identical(poisoned.context.const_view(), clean.context.const_view(), "context");
  expect_identical(poisoned.lse.const_view(), clean.lse.const_view(), "lse");
  expect_identical(poisoned.weights.const_view(), clean.weights.const_view(), "weights");
}

TEST_P(ReferenceCase, GroupedHeadsEqualRepeatedHeads) {
  const Case c = GetParam();
  const Inputs in = make_inputs(c);
  Guarded grouped(in.q, in.k, in.v);
  run_reference(in.q, in.k, in.v, in.options, grouped);
  const Tensor q = contiguous_copy(in.q, DType::f64);
  const Tensor k = repeat_heads(in.k, c.heads_q), v = repeat_heads(in.v, c.heads_q);
  Guarded repeated(q.view(), k.view(), v.view());
  run_reference(q.view(), k.view(), v.view(), in.options, repeated);
  expect_identical(repeated.context.const_view(), grouped.context.const_view(), "context");
  expect_identical(repeated.lse.const_view(), grouped.lse.const_view(), "lse");
}

TEST_P(ReferenceCase, StridedLayoutEqualsContiguousCopy) {
  const Case c = GetParam();
  const Inputs in = make_inputs(c);
  Guarded strided(in.q, in.k, in.v);
  run_reference(in.q, in.k, in.v, in.options, strided);
  const Tensor q = contiguous_copy(in.q, c.dtype), k = contiguous_copy(in.k, c.dtype);
  const Tensor v = contiguous_copy(in.v, c.dtype);
  Guarded copied(q.view(), k.view(), v.view());
  run_reference(q.view(), k.view(), v.view(), in.options, copied);
  expect_identical(strided.context.const_view(), copied.context.const_view(), "context");
  expect_identical(strided.lse.const_view(), copied.lse.const_view(), "lse");
}

// Rows [begin, begin + len) of a view, as a view.
TensorView rows(const TensorView& t, Index begin, Index len) {
  const char* base = static_cast<const char*>(t.data);
  const auto offset = static_cast<std::size_t>(begin * t.strides[2]) * dtype_size(t.dtype);
  return TensorView(base + offset, t.dtype, {t.shape[0], t.shape[1], len, t.shape[3]}, t.strides);
}

TEST_P(ReferenceCase, PackedEqualsSeparateSequences) {
  const Case c = GetParam();
  const Inputs in = make_inputs(c);
  Guarded packed(in.q, in.k, in.v);
  run_reference(in.q, in.k, in.v, in.options, packed);
  Options single = in.options;
  single.cu_seqlens_q.clear();
  single.cu_seqlens_k.clear();
  for (const Block& blk : blocks_of(in.options, c.len_q, c.len_k)) {
    const TensorView q = rows(in.q, blk.q0, blk.len_q);
    const TensorView k = rows(in.k, blk.k0, blk.len_k), v = rows(in.v, blk.k0, blk.len_k);
    Guarded alone(q, k, v);
    run_reference(q, k, v, single, alone);
    const TensorView packed_context = rows(packed.context.const_view(), blk.q0, blk.len_q);
    const TensorView packed_lse = rows(packed.lse.const_view(), blk.q0, blk.len_q);
    expect_identical(packed_context, alone.context.const_view(), "context");
    expect_identical(packed_lse, alone.lse.const_view(), "lse");
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name();
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceCase, ::testing::ValuesIn(case_list()), case_name);

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

// Which keys each query row sees, drawn one string per row ('x' visible, '.' hidden), read
// off the weights of zero inputs (every visible key gets the same weight).
std::vector<std::string> draw(Index len_q, Index len_k, Options options) {
  const Tensor q(DType::f64, {1, 1, len_q, 4}), kv(DType::f64, {1, 1, len_k, 4});
  options.backend = Backend::reference;
  const Result r = forward(q.view(), kv.view(), kv.view(), options, {.weights = true});
  std::vector<std::string> picture;
  for (Index i = 0; i < len_q; ++i) {
    std::string line;
    for (Index j = 0; j < len_k; ++j)
      line += r.weights.data_as<double>()[i * len_k + j] > 0 ? 'x' : '.';
    picture.push_back(line);
  }
  return picture;
}

Options causal(CausalAlign align) {
  Options o;
  o.causal = true;
  o.causal_align = align;
  return o;
}

Options window(Index left, Index right, CausalAlign align) {
  Options o;
  o.window = {left, right};
  o.causal_align = align;
  return o;
}

using Picture = std::vector<std::string>;

TEST(Reference, CausalAlignmentFewerQueriesThanKeys) {
  EXPECT_EQ(draw(2, 4, causal(CausalAlign::top_left)), (Picture{"x...",  //
                                                                "xx.."}));
  EXPECT_EQ(draw(2, 4, causal(CausalAlign::bottom_right)), (Picture{"xxx.",  //
                                                                    "xxxx"}));
}

TEST(Reference, CausalAlignmentMoreQueriesThanKeys) {
  EXPECT_EQ(draw(4, 2, causal(CausalAlign::top_left)), (Picture{"x.",  //
                                                                "xx",  //
                                                                "xx",  //
                                                                "xx"}));
  // The first two queries sit before every key: fully masked rows.
  EXPECT_EQ(draw(4, 2, causal(CausalAlign::bottom_right)), (Picture{"..",  //
                                                                    "..",  //
                                                                    "x.",  //
                                                                    "xx"}));
}

TEST(Reference, WindowFollowsAlignment) {
  EXPECT_EQ(draw(3, 5, window(1, 0, CausalAlign::top_left)), (Picture{"x....",  //
                                                                      "xx...",  //
                                                                      ".xx.."}));
  EXPECT_EQ(draw(3, 5, window(1, 0, CausalAlign::bottom_right)), (Picture{".xx..",  //
                                                                          "..xx.",  //
                                                                          "...xx"}));
  EXPECT_EQ(draw(3, 5, window(0, 1, CausalAlign::top_left)), (Picture{"xx...",  //
                                                                      ".xx..",  //
                                                                      "..xx."}));
}

TEST(Reference, AlibiDistanceFollowsAlignment) {
  // Zero q and k: the score is -slope * |position - j|, so weights fall off with distance
  // from the query's key position.
  const Tensor q(DType::f64, {1, 1, 1, 2}), kv(DType::f64, {1, 1, 3, 2});
  Options o;
  o.backend = Backend::reference;
  o.alibi_slopes = {1.0f};
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0);
  const Result top_left = forward(q.view(), kv.view(), kv.view(), o, {.weights = true});
  const double* w = top_left.weights.data_as<double>();
  EXPECT_NEAR(w[0], 1 / (1 + e1 + e2), 1e-15);
  EXPECT_NEAR(w[2], e2 / (1 + e1 + e2), 1e-15);
  o.causal_align = CausalAlign::bottom_right;
  const Result bottom_right = forward(q.view(), kv.view(), kv.view(), o, {.weights = true});
  w = bottom_right.weights.data_as<double>();
  EXPECT_NEAR(w[0], e2 / (1 + e1 + e2), 1e-15);
  EXPECT_NEAR(w[2], 1 / (1 + e1 + e2), 1e-15);
}

TEST(Reference, SoftcapSinkAndScaleByHand) {
  // One key at score 0 and one at scale * q.k = 0.5 * 4 = 2, capped to 1 * tanh(2); a sink
  // of logit 0. alpha = [1, e^t] / (1 + e^t + 1), lse = log(2 + e^t).
  const double query[] = {2, 0}, keys[] = {0, 0, 2, 0}, values[] = {1, 3};
  const TensorView q(query, DType::f64, {1, 1, 1, 2}), k(keys, DType::f64, {1, 1, 2, 2});
  const TensorView v(values, DType::f64, {1, 1, 2, 1});
  Options o;
  o.backend = Backend::reference;
  o.scale = 0.5;
  o.softcap = 1.0;
  o.sinks = {0.0f};
  const Result r = forward(q, k, v, o, {.lse = true, .weights = true});
  const double t = std::exp(std::tanh(2.0)), total = 2 + t;
  EXPECT_NEAR(r.weights.data_as<double>()[0], 1 / total, 1e-15);
  EXPECT_NEAR(r.weights.data_as<double>()[1], t / total, 1e-15);
  EXPECT_NEAR(r.context.data_as<double>()[0], (1 + 3 * t) / total, 1e-15);
  EXPECT_NEAR(r.lse.data_as<double>()[0], std::log(total), 1e-15);
}

// A row with nothing visible: zero context and weights, lse = -inf; with a sink, lse is the
// sink's logit and the context is still zero.
TEST(Reference, FullyMaskedRow) {
  const Tensor q(DType::f32, {1, 2, 2, 3}), kv(DType::f32, {1, 1, 2, 3});
  const bool allowed[] = {true, true, false, false};
  Options o;
  o.backend = Backend::reference;
  o.mask = TensorView(allowed, DType::boolean, {1, 1, 2, 2});
  Result r = forward(q.view(), kv.view(), kv.view(), o, {.lse = true, .weights = true});
  for (Index h = 0; h < 2; ++h) {
    EXPECT_FLOAT_EQ(r.lse.data_as<float>()[h * 2], std::log(2.0f));
    EXPECT_EQ(r.lse.data_as<float>()[h * 2 + 1], -INFINITY);
    for (Index j = 0; j < 2; ++j) EXPECT_EQ(r.weights.data_as<float>()[(h * 2 + 1) * 2 + j], 0.0f);
    for (Index d = 0; d < 3; ++d) EXPECT_EQ(r.context.data_as<float>()[(h * 2 + 1) * 3 + d], 0.0f);
  }
  o.sinks = {0.5f, -INFINITY};
  r = forward(q.view(), kv.view(), kv.view(), o, {.lse = true});
  EXPECT_EQ(r.lse.data_as<float>()[1], 0.5f);
  EXPECT_EQ(r.lse.data_as<float>()[3], -INFINITY);
  for (Index d = 0; d < 3; ++d) EXPECT_EQ(r.context.data_as<float>()[3 + d], 0.0f);
}

// No keys at all: every row is fully masked (or all sink). No queries, or no batch: empty
// outputs and nothing written.
TEST(Reference, EmptyExtents) {
  const Tensor q(DType::f32, {1, 2, 3, 4}), k(DType::f32, {1, 1, 0, 4}),
      v(DType::f32, {1, 1, 0, 5});
  Options o;
  o.backend = Backend::reference;
  Result r = forward(q.view(), k.view(), v.view(), o, {.lse = true, .weights = true});
  EXPECT_EQ(r.context.shape(), (Dims{1, 2, 3, 5}));
  EXPECT_EQ(r.weights.shape(), (Dims{1, 2, 3, 0}));
  for (Index i = 0; i < r.context.numel(); ++i) EXPECT_EQ(r.context.data_as<float>()[i], 0.0f);
  for (Index i = 0; i < r.lse.numel(); ++i) EXPECT_EQ(r.lse.data_as<float>()[i], -INFINITY);
  o.sinks = {1.5f, -2.0f};
  r = forward(q.view(), k.view(), v.view(), o, {.lse = true});
  EXPECT_EQ(r.lse.data_as<float>()[0], 1.5f);
  EXPECT_EQ(r.lse.data_as<float>()[3], -2.0f);

  GuardedTensor context(DType::f32, {1, 2, 0, 5});
  const Tensor no_queries(DType::f32, {1, 2, 0, 4}), keys(DType::f32, {1, 1, 6, 4});
  const Tensor values(DType::f32, {1, 1, 6, 5});
  forward_into(no_queries.view(), keys.view(), values.view(), o, {context.view(), {}, {}});
  EXPECT_TRUE(context.guards_intact());
  const Tensor no_batch(DType::f32, {0, 2, 3, 4}), no_batch_kv(DType::f32, {0, 1, 6, 4});
  EXPECT_EQ(forward(no_batch.view(), no_batch_kv.view(), no_batch_kv.view(), o).context.numel(), 0);
}

// Each way of hiding a key, with NaN written into that key's k and v rows.
struct Hiding {
  const char* name;
  Options options;
};

// allowed, additive: [1, 1, 3, 5] masks that hide the last of 5 keys from 3 queries.
std::vector<Hiding> ways_to_hide_last_key(const bool* allowed, const float* additive) {
  std::vector<Hiding> out;
  Options o;
  o.causal = true;  // 3 queries top-left: keys 3 and 4 are after every query
  out.push_back({"causal", o});
  o = {};
  o.window = {-1, 0};
  out.push_back({"window", o});
  o = {};
  o.mask = TensorView(allowed, DType::boolean, {1, 1, 3, 5});
  out.push_back({"boolean mask", o});
  o = {};
  o.mask = TensorView(additive, DType::f32, {1, 1, 3, 5});
  out.push_back({"additive mask", o});
  o = {};
  o.cu_seqlens_q = {0, 3, 3};  // the last key belongs to a sequence without queries
  o.cu_seqlens_k = {0, 4, 5};
  out.push_back({"packed", o});
  return out;
}

TEST(Reference, NaNInKeyHiddenEachWay) {
  std::vector<double> q(3 * 4, 0.25), k(5 * 4), v(5 * 2);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::sin(static_cast<double>(i));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::cos(static_cast<double>(i));
  bool allowed[15];
  std::vector<float> additive(15, -0.5f);
  for (Index i = 0; i < 3; ++i) {
    for (Index j = 0; j < 5; ++j) allowed[i * 5 + j] = j != 4;
    additive[static_cast<std::size_t>(i * 5 + 4)] = -INFINITY;
  }
  std::vector<double> poisoned_k = k, poisoned_v = v;
  for (Index d = 0; d < 4; ++d) poisoned_k[static_cast<std::size_t>(16 + d)] = NAN;
  for (Index d = 0; d < 2; ++d) poisoned_v[static_cast<std::size_t>(8 + d)] = NAN;
  const TensorView qv(q.data(), DType::f64, {1, 1, 3, 4});
  for (Hiding hiding : ways_to_hide_last_key(allowed, additive.data())) {
    SCOPED_TRACE(hiding.name);
    hiding.options.backend = Backend::reference;
    const Result clean = forward(qv, TensorView(k.data(), DType::f64, {1, 1, 5, 4}),
                                 TensorView(v.data(), DType::f64, {1, 1, 5, 2}), hiding.options,
                                 {.lse = true, .weights = true});
    const Result dirty = forward(qv, TensorView(poisoned_k.data(), DType::f64, {1, 1, 5, 4}),
                                 TensorView(poisoned_v.data(), DType::f64, {1, 1, 5, 2}),
                                 hiding.options, {.lse = true, .weights = true});
    expect_identical(dirty.context.view(), clean.context.view(), "context");
    expect_identical(dirty.lse.view(), clean.lse.view(), "lse");
    expect_identical(dirty.weights.view(), clean.weights.view(), "weights");
  }
}

// A NaN the query does see is an error in the data and shows up as NaN, even when it is
// the row's only key: it must not look like a fully masked row (zeros, lse = -inf).
TEST(Reference, NaNInVisibleKeyPropagates) {
  const double query[] = {1, 1}, key[] = {NAN, 0}, value[] = {2};
  const TensorView q(query, DType::f64, {1, 1, 1, 2}), k(key, DType::f64, {1, 1, 1, 2});
  Options o;
  o.backend = Backend::reference;
  const Result r =
      forward(q, k, TensorView(value, DType::f64, {1, 1, 1, 1}), o, {.lse = true, .weights = true});
  EXPECT_TRUE(std::isnan(r.context.data_as<double>()[0]));
  EXPECT_TRUE(std::isnan(r.lse.data_as<double>()[0]));
  EXPECT_TRUE(std::isnan(r.weights.data_as<double>()[0]));
}

TEST(Reference, AdditiveMaskBroadcastOverBatchAndHeads) {
  // A [1, 1, Lq, Lk] mask gives the same result as the same mask repeated to [B, H, Lq, Lk].
  Case c;
  c.batch = 2, c.heads_q = 3, c.heads_kv = 3, c.len_q = 4, c.len_k = 5, c.dim = 3, c.dim_v = 2;
  const Inputs in = make_inputs(c);
  std::vector<float> small(20), full(2 * 3 * 20);
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = -0.3f * static_cast<float>(i % 7);
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = small[i % 20];
  Options o;
  o.backend = Backend::reference;
  o.mask = TensorView(small.data(), DType::f32, {1, 1, 4, 5});
  const Result broadcast = forward(in.q, in.k, in.v, o, {.lse = true});
  o.mask = TensorView(full.data(), DType::f32, {2, 3, 4, 5});
  const Result repeated = forward(in.q, in.k, in.v, o, {.lse = true});
  expect_identical(broadcast.context.view(), repeated.context.view(), "context");
  expect_identical(broadcast.lse.view(), repeated.lse.view(), "lse");
}

TEST(Reference, EnvironmentForcesReference) {
  // ATTN_BACKEND=reference makes even an explicit fast request take the reference.
  const double one[] = {1};
  const TensorView x(one, DType::f64, {1, 1, 1, 1});
  Options o;
  o.backend = Backend::fast;
  ::setenv("ATTN_BACKEND", "reference", 1);
  const Result r = forward(x, x, x, o);
  ::unsetenv("ATTN_BACKEND");
  EXPECT_EQ(r.context.data_as<double>()[0], 1.0);
}

}  // namespace
}  // namespace attn
