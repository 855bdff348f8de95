// `attn run` computes in pieces to show progress (tools/forward_in_pieces.cpp): every output
// must be bitwise that of one forward_into call and close to the float64 reference, on
// every case of the list (GQA, masks, ALiBi, sinks, packed varlen, bshd strides), and
// progress must count every piece.
#include <gtest/gtest.h>

#include <cstring>

#include "attn/attn.hpp"
#include "forward_in_pieces.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"

namespace attn::tools {
namespace {

using testing::Case;

struct AllOutputs {
  Tensor context, lse, weights;
  Outputs views() { return {context.mutable_view(), lse.mutable_view(), weights.mutable_view()}; }
};

AllOutputs make_outputs(const testing::Inputs& in) {
  const Index b = in.q.shape[0], h = in.q.shape[1], lq = in.q.shape[2];
  const DType stats = in.q.dtype == DType::f64 ? DType::f64 : DType::f32;
  return {Tensor(in.q.dtype, {b, h, lq, in.v.shape[3]}), Tensor(stats, {b, h, lq, 1}),
          Tensor(stats, {b, h, lq, in.k.shape[2]})};
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

class ForwardInPieces : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardInPieces, EqualsOneCallBitwise) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  AllOutputs whole = make_outputs(in), pieces = make_outputs(in);
  forward_into(in.q, in.k, in.v, in.options, whole.views());
  Index calls = 0, last_done = -1, last_total = -1;
  forward_in_pieces(in.q, in.k, in.v, in.options, pieces.views(), [&](Index done, Index total) {
    EXPECT_EQ(done, calls) << "progress out of order";
    ++calls;
    last_done = done;
    last_total = total;
  });
  EXPECT_TRUE(same_bytes(whole.context, pieces.context)) << "context";
  EXPECT_TRUE(same_bytes(whole.lse, pieces.lse)) << "lse";
  EXPECT_TRUE(same_bytes(whole.weights, pieces.weights)) << "weights";
  EXPECT_EQ(last_total, count_pieces(in.q, in.k));
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(calls, last_total + 1);  // 0 of N first, then one call per piece
}

// Bounds against float64, as for the kernels (tests/cpu_forward_test.cpp and
// tests/weights_test.cpp), with the rounding of a 16-bit context on top.
struct Bounds {
  double nmse, max_abs;
};

Bounds context_bounds(const Case& c) {
  switch (c.dtype) {
    case DType::f16:
      return {1e-6, 4e-3};
    case DType::bf16:
      return {1e-4, 3e-2};
    case DType::f64:
      return {1e-24, 1e-12};
    default:
      return {c.alibi ? 1e-11 : 2e-12, 1e-5};
  }
}

void expect_close(const Tensor& got, const Tensor& want, Bounds bounds, const char* what) {
  const testing::Comparison c = testing::compare(got.view(), want.view());
  EXPECT_TRUE(c.hard_failure.empty()) << what << ": " << testing::describe(c);
  EXPECT_LT(c.nmse, bounds.nmse) << what << ": " << testing::describe(c);
  EXPECT_LT(c.max_abs, bounds.max_abs) << what << ": " << testing::describe(c);
}

// The pieces against the float64 reference over the whole request, so that a fault shared
// by the pieces and the one call is caught too.
TEST_P(ForwardInPieces, MatchesReference) {
  const Case& c = GetParam();
  const testing::Inputs in = testing::make_inputs(c);
  AllOutputs pieces = make_outputs(in);
  forward_in_pieces(in.q, in.k, in.v, in.options, pieces.views(), [](Index, Index) {});
  const Index b = in.q.shape[0], h = in.q.shape[1], lq = in.q.shape[2];
  AllOutputs want{Tensor(DType::f64, {b, h, lq, in.v.shape[3]}), Tensor(DType::f64, {b, h, lq, 1}),
                  Tensor(DType::f64, {b, h, lq, in.k.shape[2]})};
  Options reference = in.options;
  reference.backend = Backend::reference;
  forward_into(in.q, in.k, in.v, reference, want.views());
  const bool wide = c.dtype == DType::f64;
  expect_close(pieces.context, want.context, context_bounds(c), "context");
  expect_close(pieces.lse, want.lse, wide ? Bounds{1e-24, 1e-12} : Bounds{1e-9, 2e-5}, "lse");
  expect_close(pieces.weights, want.weights, wide ? Bounds{1e-24, 1e-12} : Bounds{2e-11, 1e-5},
               "weights");
}

// Numbered cases: a failure prints the case by its name (testing::PrintTo).
INSTANTIATE_TEST_SUITE_P(Cases, ForwardInPieces, ::testing::ValuesIn(testing::case_list()));

TEST(ForwardInPiecesErrors, NameTheWholeRequest) {
  std::vector<float> q(2 * 4 * 3 * 8), k(2 * 3 * 5 * 8), v(2 * 3 * 5 * 8), out(2 * 4 * 3 * 8);
  const TensorView qv(q.data(), DType::f32, {2, 4, 3, 8}), kv(k.data(), DType::f32, {2, 3, 5, 8});
  const TensorView vv(v.data(), DType::f32, {2, 3, 5, 8});
  const Outputs outputs{MutableTensorView(out.data(), DType::f32, {2, 4, 3, 8}), std::nullopt,
                        std::nullopt};
  Index calls = 0;
  // Four query heads cannot share three KV heads; nothing may be computed.
  EXPECT_THROW(forward_in_pieces(qv, kv, vv, {}, outputs, [&](Index, Index) { ++calls; }), Error);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace attn::tools
