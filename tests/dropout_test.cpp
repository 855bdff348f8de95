// Dropout (Options::dropout_p, dropout_seed): the keep mask's statistics, the kernels
// dropping exactly attn::dropout_mask's weights on every target (seen through an identity V),
// the same bits on any thread count, and the edges p = 0 and p = 1. Forward and backward
// against float64 on the whole case list with dropout: cpu_forward_test.cpp and
// backward_test.cpp (the Dropout suites); the reference's gradients against finite
// differences: backward_reference_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "core/rows.hpp"
#include "support/cases.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::for_each_target;

struct Counts {
  double kept = 0, pairs_along_keys = 0, pairs_along_rows = 0, pairs_along_heads = 0;
};

// Kept weights, and pairs of neighbours (along keys, rows, heads) both kept, as fractions.
Counts count(const Tensor& mask) {
  const Dims& s = mask.shape();
  const bool* m = mask.data_as<bool>();
  auto at = [&](Index b, Index h, Index i, Index j) {
    return m[((b * s[1] + h) * s[2] + i) * s[3] + j];
  };
  Counts c;
  double n = 0, n_keys = 0, n_rows = 0, n_heads = 0;
  for (Index b = 0; b < s[0]; ++b)
    for (Index h = 0; h < s[1]; ++h)
      for (Index i = 0; i < s[2]; ++i)
        for (Index j = 0; j < s[3]; ++j) {
          const bool kept = at(b, h, i, j);
          c.kept += kept, ++n;
          if (j + 1 < s[3]) c.pairs_along_keys += kept && at(b, h, i, j + 1), ++n_keys;
          if (i + 1 < s[2]) c.pairs_along_rows += kept && at(b, h, i + 1, j), ++n_rows;
          if (h + 1 < s[1]) c.pairs_along_heads += kept && at(b, h + 1, i, j), ++n_heads;
        }
  c.kept /= n, c.pairs_along_keys /= n_keys, c.pairs_along_rows /= n_rows;
  c.pairs_along_heads /= n_heads;
  return c;
}

// Within 6 standard deviations of a binomial fraction over n draws.
void expect_fraction(double got, double p, double n, const char* what) {
  EXPECT_NEAR(got, p, 6.0 * std::sqrt(p * (1.0 - p) / n)) << what;
}

TEST(DropoutMask, KeepsOneMinusPIndependentlyOfNeighbours) {
  const Dims shape{2, 4, 128, 512};
  const double n = 2.0 * 4 * 128 * 512;
  for (const double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE(p);
    const Counts c = count(dropout_mask(shape, p, 42));
    const double keep = 1.0 - p;
    expect_fraction(c.kept, keep, n, "kept");
    expect_fraction(c.pairs_along_keys, keep * keep, n, "neighbouring keys");
    expect_fraction(c.pairs_along_rows, keep * keep, n, "neighbouring rows");
    expect_fraction(c.pairs_along_heads, keep * keep, n, "neighbouring heads");
  }
}

TEST(DropoutMask, SeedsGiveIndependentMasksAndTheSameSeedTheSameMask) {
  const Dims shape{1, 2, 256, 256};
  const Tensor a = dropout_mask(shape, 0.5, 1), b = dropout_mask(shape, 0.5, 2);
  const Tensor again = dropout_mask(shape, 0.5, 1);
  EXPECT_EQ(std::memcmp(a.data(), again.data(), a.nbytes()), 0);
  double agree = 0;
  for (Index x = 0; x < a.numel(); ++x) agree += a.data_as<bool>()[x] == b.data_as<bool>()[x];
  expect_fraction(agree / static_cast<double>(a.numel()), 0.5, static_cast<double>(a.numel()),
                  "two seeds agree");
}

TEST(DropoutMask, ZeroKeepsEverythingAndOneNothing) {
  const Tensor all = dropout_mask({1, 1, 64, 64}, 0.0, 7),
               none = dropout_mask({1, 1, 64, 64}, 1.0, 7);
  for (Index x = 0; x < all.numel(); ++x) {
    ASSERT_TRUE(all.data_as<bool>()[x]);
    ASSERT_FALSE(none.data_as<bool>()[x]);
  }
}

TEST(DropoutMask, RefusesBadArguments) {
  EXPECT_THROW(
      {
        try {
          dropout_mask({1, 1, -1, 4}, 0.5, 0);
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(),
                       "shape: expected four sizes >= 0 [B, Hq, Lq, Lk], given [1, 1, -1, 4]");
          throw;
        }
      },
      Error);
  EXPECT_THROW(dropout_mask({1, 1, 1, 1}, 1.5, 0), Error);
  EXPECT_THROW(dropout_mask({1, 1, 1, 1}, NAN, 0), Error);
}

// q and k random, v the identity (Lk = Dv) in their dtype: context row i is row i of the
// weights times dropout's factors, so its zeros are the dropped weights.
struct IdentityValues {
  explicit IdentityValues(testing::Case c, bool packed) {
    c.dim_v = c.len_k;
    c.packed = packed;
    in = testing::make_inputs(c);
    v = Tensor(c.dtype, in.v.shape);
    std::vector<double> row(static_cast<std::size_t>(c.len_k));
    for (Index b = 0; b < c.batch; ++b)
      for (Index h = 0; h < c.heads_kv; ++h)
        for (Index j = 0; j < c.len_k; ++j) {
          std::fill(row.begin(), row.end(), 0.0);
          row[static_cast<std::size_t>(j)] = 1.0;
          core::store_row(v.mutable_view(), b, h, j, row.data());
        }
    in.options.dropout_p = 0.25;
    in.options.dropout_seed = 2024;
  }
  testing::Inputs in;
  Tensor v;
};

void expect_context_is_dropped_weights(const IdentityValues& x, Backend backend) {
  Options options = x.in.options;
  options.backend = backend;
  const Result r = forward(x.in.q, x.in.k, x.v.view(), options, {.weights = true});
  const Dims& s = r.weights.shape();
  const Tensor mask = dropout_mask(s, options.dropout_p, options.dropout_seed);
  // The context is rounded to q's dtype: 2^-8 relative for bfloat16.
  const double tolerance = r.context.dtype() == DType::f32 ? 1e-6 : 4e-3;
  Index dropped = 0;
  for (Index b = 0; b < s[0]; ++b)
    for (Index h = 0; h < s[1]; ++h)
      for (Index i = 0; i < s[2]; ++i)
        for (Index j = 0; j < s[3]; ++j) {
          const double weight = core::load_element(r.weights.view(), b, h, i, j);
          const double context = core::load_element(r.context.view(), b, h, i, j);
          if (weight == 0.0 || !mask.data_as<bool>()[((b * s[1] + h) * s[2] + i) * s[3] + j]) {
            ASSERT_EQ(context, 0.0) << b << " " << h << " " << i << " " << j;
            dropped += weight != 0.0;
          } else {
            ASSERT_NEAR(context, weight / 0.75, tolerance * weight / 0.75)
                << b << " " << h << " " << i << " " << j;
          }
        }
  EXPECT_GT(dropped, 0);
}

TEST(DropoutKernels, DropExactlyTheMaskOnEveryTarget) {
  testing::Case c;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.len_q = 37, c.len_k = 97, c.dim = 40;
  const IdentityValues plain(c, false);
  c.batch = 1;
  const IdentityValues packed(c, true);
  c.heads_q = 2, c.len_q = 1, c.dtype = DType::bf16;  // decoding rows: narrow chunks
  const IdentityValues narrow(c, false);
  for (const IdentityValues* x : {&plain, &packed, &narrow}) {
    expect_context_is_dropped_weights(*x, Backend::reference);
    for_each_target([&] { expect_context_is_dropped_weights(*x, Backend::fast); });
  }
}

// Forward's context and backward's gradients, with dropout, in one buffer per output.
std::vector<Tensor> forward_and_backward(const testing::Inputs& in, const Options& options) {
  Result r = forward(in.q, in.k, in.v, options, {.lse = true});
  Tensor dout(DType::f32, r.context.shape());
  for (Index x = 0; x < dout.numel(); ++x) dout.data_as<float>()[x] = std::sin(0.37 * x);
  const BackwardInputs inputs{in.q, in.k, in.v, r.context.view(), r.lse.view(), dout.view()};
  BackwardResult g = backward(inputs, options);
  std::vector<Tensor> out;
  out.push_back(std::move(r.context));
  out.push_back(std::move(g.dq));
  out.push_back(std::move(g.dk));
  out.push_back(std::move(g.dv));
  return out;
}

TEST(DropoutKernels, AnyThreadCountGivesTheSameBits) {
  testing::Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 150, c.len_k = 300, c.dim = 64, c.dim_v = 64;
  c.causal = true, c.dropout = 0.2;
  const testing::Inputs in = testing::make_inputs(c);
  Options one = in.options, two = in.options;
  one.threads = 1, two.threads = 2;
  const std::vector<Tensor> a = forward_and_backward(in, one), b = forward_and_backward(in, two);
  for (std::size_t x = 0; x < a.size(); ++x) {
    EXPECT_EQ(std::memcmp(a[x].data(), b[x].data(), a[x].nbytes()), 0) << x;
  }
}

TEST(DropoutKernels, POneDropsEverythingButTheLse) {
  testing::Case c;
  c.heads_q = 2, c.len_q = 20, c.len_k = 30, c.dim = 16, c.dim_v = 16;
  testing::Inputs in = testing::make_inputs(c);
  const Result undropped = forward(in.q, in.k, in.v, in.options, {.lse = true});
  in.options.dropout_p = 1.0;
  for (const Backend backend : {Backend::fast, Backend::reference}) {
    in.options.backend = backend;
    const Result r = forward(in.q, in.k, in.v, in.options, {.lse = true});
    for (Index x = 0; x < r.context.numel(); ++x) ASSERT_EQ(r.context.data_as<float>()[x], 0.0f);
    for (Index x = 0; x < r.lse.numel(); ++x) {
      ASSERT_NEAR(r.lse.data_as<float>()[x], undropped.lse.data_as<float>()[x], 1e-5);
    }
    for (const Tensor& g : forward_and_backward(in, in.options)) {
      for (Index x = 0; x < g.numel(); ++x) ASSERT_EQ(g.data_as<float>()[x], 0.0f);
    }
  }
}

}  // namespace
}  // namespace attn
