// The public attention state: empty states, merge laws, and attention over split keys
// merged back to attention over all keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "attn/state.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"

namespace attn::testing {
namespace {

// A random non-empty state; m spread widely so merges rescale by large factors.
State random_state(std::mt19937_64& rng, DType dtype, const Dims& rows_dv) {
  State s = State::empty(dtype, rows_dv[0], rows_dv[1], rows_dv[2], rows_dv[3]);
  std::uniform_real_distribution<double> m(-30.0, 30.0), l(0.5, 20.0), acc(-5.0, 5.0);
  const auto fill = [&](Tensor& t, auto& dist) {
    for (Index i = 0; i < t.numel(); ++i) {
      if (dtype == DType::f64) {
        t.data_as<double>()[i] = dist(rng);
      } else {
        t.data_as<float>()[i] = static_cast<float>(dist(rng));
      }
    }
  };
  fill(s.m, m);
  fill(s.l, l);
  fill(s.acc, acc);
  return s;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

void expect_close(const Tensor& got, const Tensor& want, double nmse) {
  const Comparison c = compare(got.view(), want.view());
  EXPECT_TRUE(c.hard_failure.empty()) << c.hard_failure;
  EXPECT_LE(c.nmse, nmse) << describe(c);
}

TEST(State, EmptyFinalizesToZeroAndMinusInfinity) {
  for (const DType dtype : {DType::f32, DType::f64}) {
    const State empty = State::empty(dtype, 2, 3, 4, 5);
    const Finalized f = finalize(empty);
    for (Index i = 0; i < f.context.numel(); ++i) {
      const double c =
          dtype == DType::f32 ? f.context.data_as<float>()[i] : f.context.data_as<double>()[i];
      EXPECT_EQ(c, 0.0);
    }
    for (Index i = 0; i < f.lse.numel(); ++i) {
      const double lse =
          dtype == DType::f32 ? f.lse.data_as<float>()[i] : f.lse.data_as<double>()[i];
      EXPECT_EQ(lse, -INFINITY);
    }
    // A sink alone takes all the weight and carries no value: context 0, lse = sink.
    const Finalized with_sinks = finalize(empty, {0.5f, -1.0f, -INFINITY});
    const double lse0 = dtype == DType::f32 ? with_sinks.lse.data_as<float>()[0]
                                            : with_sinks.lse.data_as<double>()[0];
    EXPECT_EQ(lse0, 0.5);
  }
}

TEST(State, MergeWithEmptyIsIdentityBitForBit) {
  std::mt19937_64 rng(3);
  for (const DType dtype : {DType::f32, DType::f64}) {
    const State s = random_state(rng, dtype, {2, 3, 5, 7});
    const State empty = State::empty(dtype, 2, 3, 5, 7);
    for (const State& merged : {merge(s, empty), merge(empty, s)}) {
      EXPECT_TRUE(same_bits(merged.m, s.m));
      EXPECT_TRUE(same_bits(merged.l, s.l));
      EXPECT_TRUE(same_bits(merged.acc, s.acc));
    }
    const State both_empty = merge(empty, empty);
    EXPECT_TRUE(same_bits(finalize(both_empty).context, finalize(empty).context));
  }
}

TEST(State, MergeIsAssociativeAndCommutativeWithinRounding) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    for (const DType dtype : {DType::f32, DType::f64}) {
      const double bound = dtype == DType::f32 ? 1e-12 : 1e-28;
      const State a = random_state(rng, dtype, {1, 2, 9, 11});
      const State b = random_state(rng, dtype, {1, 2, 9, 11});
      const State c = random_state(rng, dtype, {1, 2, 9, 11});
      const Finalized left = finalize(merge(merge(a, b), c));
      const Finalized right = finalize(merge(a, merge(b, c)));
      const Finalized swapped = finalize(merge(c, merge(b, a)));
      expect_close(left.context, right.context, bound);
      expect_close(left.lse, right.lse, bound);
      expect_close(swapped.context, left.context, bound);
      expect_close(swapped.lse, left.lse, bound);
    }
  }
}

// Keys [0, Lk) split at the given points; each part's state comes from forward_state, and
// their merge, finalized with the sinks, must equal forward over all keys. `edit` changes
// the inputs first.
void check_split(
    const Case& c, const std::vector<Index>& cuts, double bound,
    const std::function<void(Inputs&)>& edit = [](Inputs&) {}) {
  SCOPED_TRACE(c.name());
  Inputs in = make_inputs(c, 11);
  edit(in);
  Options part_options = in.options;
  part_options.sinks.clear();
  State merged = State::empty(c.dtype == DType::f64 ? DType::f64 : DType::f32, c.batch, c.heads_q,
                              c.len_q, c.dim_v);
  Index begin = 0;
  for (std::size_t p = 0; p <= cuts.size(); ++p) {
    const Index end = p < cuts.size() ? cuts[p] : c.len_k;
    const auto keys = [&](const TensorView& t) {
      TensorView part = t;
      part.data = static_cast<const char*>(t.data) +
                  static_cast<std::ptrdiff_t>(begin * t.strides[2] * dtype_size(t.dtype));
      part.shape[2] = end - begin;
      return part;
    };
    merged = merge(merged, forward_state(in.q, keys(in.k), keys(in.v), part_options));
    begin = end;
  }
  const Finalized got = finalize(merged, in.options.sinks);
  Options reference = in.options;
  reference.backend = Backend::reference;
  const Result want = forward(in.q, in.k, in.v, reference, Want{.lse = true});
  expect_close(got.context, want.context, bound);
  expect_close(got.lse, want.lse, bound);
}

TEST(State, MergedSplitsEqualAttentionOverAllKeys) {
  for (const DType dtype : {DType::f64, DType::f32}) {
    const double bound = dtype == DType::f64 ? 1e-26 : 1e-12;
    for (const bool sinks : {false, true}) {
      Case c;
      c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.len_q = 5, c.len_k = 97, c.dim = 40;
      c.dim_v = 24, c.sinks = sinks, c.softcap = sinks ? 0.0 : 5.0, c.dtype = dtype;
      check_split(c, {}, bound);
      check_split(c, {1}, bound);
      check_split(c, {0, 0, 50}, bound);
      check_split(c, {3, 17, 60, 96}, bound);
    }
  }
}

// A row whose scores are NaN (a NaN query element) has a NaN state (m NaN), whichever
// backend computed it, and stays NaN through merges with other parts (an empty one, of no
// keys, included) and finalize, as forward over all keys is; lse = -inf would claim the
// row sees no key.
TEST(State, NanScoresGiveNanStatesThroughMergeAndFinalize) {
  for (const DType dtype : {DType::f64, DType::f32}) {
    Case c;
    c.heads_q = 4, c.heads_kv = 2, c.len_q = 5, c.len_k = 300, c.dim = 64, c.dim_v = 64;
    c.dtype = dtype;
    const auto nan_query = [&](Inputs& in) {
      const Index at = (1 * c.len_q + 3) * c.dim + 2;
      if (dtype == DType::f64) {
        static_cast<double*>(const_cast<void*>(in.q.data))[at] = NAN;
      } else {
        static_cast<float*>(const_cast<void*>(in.q.data))[at] = NAN;
      }
    };
    const double bound = dtype == DType::f64 ? 1e-26 : 1e-12;
    check_split(c, {}, bound, nan_query);
    check_split(c, {0, 150}, bound, nan_query);
    check_split(c, {100, 200}, bound, nan_query);

    Inputs in = make_inputs(c, 11);
    nan_query(in);
    const State state = forward_state(in.q, in.k, in.v, in.options);
    const Index row = 1 * c.len_q + 3;
    const double m =
        dtype == DType::f64 ? state.m.data_as<double>()[row] : state.m.data_as<float>()[row];
    EXPECT_TRUE(std::isnan(m)) << dtype_name(dtype) << ": m = " << m;
  }
}

TEST(State, BadInputThrowsNamingTheArgument) {
  const State a = State::empty(DType::f32, 1, 2, 3, 4);
  const State b = State::empty(DType::f32, 1, 2, 3, 5);
  const State c = State::empty(DType::f64, 1, 2, 3, 4);
  EXPECT_EQ(error_message([&] { merge(a, b); }).rfind("b: expected acc of shape [1, 2, 3, 4]", 0),
            0u);
  EXPECT_EQ(error_message([&] { merge(a, c); }).rfind("b: expected dtype float32", 0), 0u);
  EXPECT_EQ(error_message([&] { merge(a, State{}); }).rfind("b: expected a state", 0), 0u);
  EXPECT_EQ(error_message([&] { finalize(a, {1.0f}); }),
            "sinks: expected 2 values (one per query head), given 1");
  EXPECT_EQ(error_message([&] {
              finalize(a, {1.0f, NAN});
            }).rfind("sinks: expected finite", 0),
            0u);
  EXPECT_EQ(
      error_message([&] { State::empty(DType::f16, 1, 1, 1, 1); }).rfind("dtype: expected", 0), 0u);
  Case k;
  k.sinks = true;
  const Inputs in = make_inputs(k);
  EXPECT_EQ(error_message([&] { forward_state(in.q, in.k, in.v, in.options); }).rfind("sinks: ", 0),
            0u);
}

}  // namespace
}  // namespace attn::testing
