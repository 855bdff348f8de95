// Options::position_offset: attention over a slice of the query rows or of the keys, with
// the offset that places the slice in the whole, gives the whole's rows (the reference bit
// for bit, the fast kernel to its usual bounds), and decode over a cache holding one range
// of a context matches forward over that range. This is what sharding over processes rests
// on (src/dist).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"

namespace attn::testing {
namespace {

// Bounds of tests/cpu_forward_test.cpp (fp32 accumulation against float64).
constexpr double kContextNmse = 1e-11;
constexpr double kLseMaxAbs = 2e-5;

struct Result64 {
  Tensor context, lse;
};

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]; float64 outputs.
Result64 run(const TensorView& q, const TensorView& k, const TensorView& v, Options options,
             Backend backend) {
  Result64 r{Tensor(DType::f64, {q.shape[0], q.shape[1], q.shape[2], v.shape[3]}),
             Tensor(DType::f64, {q.shape[0], q.shape[1], q.shape[2], 1})};
  options.backend = backend;
  forward_into(q, k, v, options, {r.context.mutable_view(), r.lse.mutable_view(), {}});
  return r;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  if (a.shape != b.shape || a.dtype != b.dtype) return false;
  const std::size_t row_bytes = static_cast<std::size_t>(a.shape[3]) * dtype_size(a.dtype);
  for (Index b0 = 0; b0 < a.shape[0]; ++b0)
    for (Index h = 0; h < a.shape[1]; ++h)
      for (Index s = 0; s < a.shape[2]; ++s) {
        const auto row = [&](const TensorView& t) {
          return static_cast<const char*>(t.data) +
                 (b0 * t.strides[0] + h * t.strides[1] + s * t.strides[2]) *
                     static_cast<Index>(dtype_size(t.dtype));
        };
        if (std::memcmp(row(a), row(b), row_bytes) != 0) return false;
      }
  return true;
}

void expect_close(const TensorView& got, const TensorView& want, const TensorView& got_lse,
                  const TensorView& want_lse) {
  const Comparison c = compare(got, want);
  EXPECT_TRUE(c.hard_failure.empty()) << "context: " << describe(c);
  EXPECT_LT(c.nmse, kContextNmse) << "context: " << describe(c);
  const Comparison l = compare(got_lse, want_lse);
  EXPECT_TRUE(l.hard_failure.empty()) << "lse: " << describe(l);
  EXPECT_LT(l.max_abs, kLseMaxAbs) << "lse: " << describe(l);
}

// The cases a slice can express: no mask (whose columns would need slicing too), not packed.
std::vector<Case> sliceable_cases() {
  std::vector<Case> out;
  for (const Case& c : case_list()) {
    if (c.mask == MaskCase::none && !c.packed && c.len_q >= 2 && c.len_k >= 2) out.push_back(c);
  }
  return out;
}

class PositionOffset : public ::testing::TestWithParam<Case> {};

// Query rows [0, a) keep the case's alignment and rows [a, Lq) switch to top-left: both
// need an offset unless the case is top-left (the first slice) or bottom-right (the second).
TEST_P(PositionOffset, QuerySlicesGiveTheWholesRows) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c);
  const Result64 whole = run(in.q, in.k, in.v, in.options, Backend::reference);
  const Index a = c.len_q / 3, shift = c.align == CausalAlign::bottom_right ? c.len_k - c.len_q : 0;

  Options head = in.options;
  head.position_offset = c.align == CausalAlign::bottom_right ? a - c.len_q : 0;
  Options tail = in.options;
  tail.causal_align = CausalAlign::top_left;
  tail.position_offset = a + shift;

  for (const auto& [first, count, options] :
       {std::tuple{Index{0}, a, head}, std::tuple{a, c.len_q - a, tail}}) {
    SCOPED_TRACE("rows " + std::to_string(first) + " + " + std::to_string(count));
    const TensorView q = in.q.rows(first, count);
    const Result64 ref = run(q, in.k, in.v, options, Backend::reference);
    EXPECT_TRUE(same_bytes(ref.context.view(), whole.context.view().rows(first, count)));
    EXPECT_TRUE(same_bytes(ref.lse.view(), whole.lse.view().rows(first, count)));
    if (c.dtype == DType::f64) continue;
    const Result64 fast = run(q, in.k, in.v, options, Backend::fast);
    expect_close(fast.context.view(), whole.context.view().rows(first, count), fast.lse.view(),
                 whole.lse.view().rows(first, count));
  }
}

// Keys [0, b) and [b, Lk), each with the offset that keeps the whole's positions, merged.
TEST_P(PositionOffset, KeySlicesMergeToTheWhole) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c);
  const Result64 whole = run(in.q, in.k, in.v, in.options, Backend::reference);
  const Index b = c.len_k / 2, shift = c.align == CausalAlign::bottom_right ? c.len_k - c.len_q : 0;
  Options options = in.options;
  options.sinks.clear();
  options.causal_align = CausalAlign::top_left;
  options.position_offset = shift;
  const State left = forward_state(in.q, in.k.rows(0, b), in.v.rows(0, b), options);
  options.position_offset = shift - b;
  const State right =
      forward_state(in.q, in.k.rows(b, c.len_k - b), in.v.rows(b, c.len_k - b), options);
  const Finalized merged = finalize(merge(left, right), in.options.sinks);
  expect_close(merged.context.view(), whole.context.view(), merged.lse.view(), whole.lse.view());
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name();
}

INSTANTIATE_TEST_SUITE_P(Cases, PositionOffset, ::testing::ValuesIn(sliceable_cases()), case_name);

// The backward pass places queries by the same rule: dq of a slice of the rows, with the
// offset that places it, is the whole's dq of those rows (each row's dq depends on that
// row alone), in float64 through the reference and in float32 through the fast kernel.
TEST(PositionOffset, BackwardOfAQuerySliceGivesTheWholesDq) {
  for (const DType dtype : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Case c;
    c.heads_q = 4, c.heads_kv = 2, c.len_q = 37, c.len_k = 50, c.dim = 16, c.dim_v = 16;
    c.causal = true, c.align = CausalAlign::bottom_right, c.window = {20, -1};
    c.softcap = 5.0, c.alibi = true, c.dtype = dtype;
    const Inputs in = make_inputs(c), gradient = make_inputs(c, 2);
    const Result fwd = forward(in.q, in.k, in.v, in.options, {.lse = true});
    const TensorView dout = gradient.q;
    const BackwardResult whole =
        backward({in.q, in.k, in.v, fwd.context.view(), fwd.lse.view(), dout}, in.options);
    const Index a = 12, count = c.len_q - a;
    Options options = in.options;
    options.causal_align = CausalAlign::top_left;
    options.position_offset = a + c.len_k - c.len_q;
    const BackwardResult slice =
        backward({in.q.rows(a, count), in.k, in.v, fwd.context.view().rows(a, count),
                  fwd.lse.view().rows(a, count), dout.rows(a, count)},
                 options);
    const Comparison dq = compare(slice.dq.view(), whole.dq.view().rows(a, count));
    EXPECT_TRUE(dq.hard_failure.empty()) << describe(dq);
    EXPECT_LT(dq.nmse, dtype == DType::f64 ? 1e-24 : 1e-10) << describe(dq);
  }
}

TEST(TensorViewRows, SlicesTheSeqDimAndRefusesRowsOutside) {
  Tensor t(DType::f32, {2, 3, 10, 4});
  const TensorView rows = t.view().rows(4, 5);
  EXPECT_EQ(rows.shape, (Dims{2, 3, 5, 4}));
  EXPECT_EQ(rows.strides, t.view().strides);
  EXPECT_EQ(rows.data, static_cast<const float*>(t.data()) + 4 * 4);
  EXPECT_EQ(t.mutable_view().rows(10, 0).shape[2], 0);
  EXPECT_EQ(error_message([&] { t.view().rows(6, 5); }),
            "rows: expected 0 <= first <= first + count <= 10 (the seq length), given first 6, "
            "count 5");
  EXPECT_EQ(error_message([&] { t.mutable_view().rows(-1, 2); }),
            "rows: expected 0 <= first <= first + count <= 10 (the seq length), given first -1, "
            "count 2");
}

TEST(PositionOffset, RefusesOffsetsPastThirtyBitPositions) {
  const Inputs in = make_inputs(Case{});
  Options options;
  options.position_offset = Index{1} << 30;
  EXPECT_EQ(error_message([&] { forward(in.q, in.k, in.v, options); }),
            "position_offset: expected a magnitude below 2^30, given 1073741824");
}

// A cache holding keys [0, b) of a context of Lk, its decode step told that Lk - b keys
// follow, equals forward over those keys with the queries at the context's end.
TEST(PositionOffset, DecodeOfOneRangeMatchesForward) {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 2, c.len_k = 90, c.dim = 16, c.dim_v = 16;
  const Inputs in = make_inputs(c);
  const Index b = 60;
  KVCache cache(KVCacheConfig{
      .heads_kv = 2, .dim = 16, .dim_v = 16, .page_size = 16, .dtype = CacheDType::f32});
  const KVCache::SequenceId id = cache.add_sequence();
  cache.append(id, in.k.rows(0, b), in.v.rows(0, b));
  for (const bool causal : {false, true}) {
    Options options;
    options.causal = causal;
    options.window = {70, -1};
    options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    options.position_offset = c.len_k - b;
    const Decoded got = decode(in.q, cache, {id}, options);
    Options whole = options;
    whole.causal_align = CausalAlign::top_left;
    whole.position_offset = c.len_k - c.len_q;
    const Result64 want = run(in.q, in.k.rows(0, b), in.v.rows(0, b), whole, Backend::reference);
    expect_close(got.context.view(), want.context.view(), got.lse.view(), want.lse.view());
  }
}

}  // namespace
}  // namespace attn::testing
