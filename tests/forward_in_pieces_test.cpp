// `attn run` computes in pieces to show progress (tools/forward_in_pieces.cpp): every output
// must be bitwise that of one forward_into call, on every case of the list (GQA, masks,
// ALiBi, sinks, packed varlen, bshd strides), and progress must count every piece.
#include <gtest/gtest.h>

#include <cstring>

#include "attn/attn.hpp"
#include "forward_in_pieces.hpp"
#include "support/cases.hpp"

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
