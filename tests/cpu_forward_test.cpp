// The fast CPU forward kernel against the float64 reference, on every case it supports and
// on every SIMD target compiled in that this CPU runs.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "core/problem.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/forward/forward.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::Case;
using testing::GuardedTensor;

using testing::for_each_target;

Dims context_shape(const testing::Inputs& in) {
  return {in.q.shape[0], in.q.shape[1], in.q.shape[2], in.v.shape[3]};
}
Dims lse_shape(const testing::Inputs& in) {
  return {in.q.shape[0], in.q.shape[1], in.q.shape[2], 1};
}

struct ReferenceResult {
  Tensor context, lse;
};

ReferenceResult run_reference(const testing::Inputs& in) {
  ReferenceResult want{Tensor(DType::f64, context_shape(in)), Tensor(DType::f64, lse_shape(in))};
  Options options = in.options;
  options.backend = Backend::reference;
  forward_into(in.q, in.k, in.v, options,
               {want.context.mutable_view(), want.lse.mutable_view(), {}});
  return want;
}

// Bounds against float64 (worst NMSE seen: 4.4e-13): fp32 accumulation over a few thousand
// keys, on the same stored inputs (so f16/bf16 inputs are as tight as f32 ones).
constexpr double kContextNmse = 2e-12;
// ALiBi over long rows gives scores of magnitude slope x distance (about 1e3 for 1025
// rows), which fp32 holds to about 6e-5; worst NMSE seen 2.2e-12.
constexpr double kAlibiContextNmse = 1e-11;

double context_nmse_bound(const Case& c) {
  return c.alibi ? kAlibiContextNmse : kContextNmse;
}
constexpr double kLseMaxAbs = 2e-5;
// P rounded to bf16 for P V (Options::pv_precision bf16): each weight off by at most 2^-8
// of itself.
constexpr double kRoundedPContextNmse = 1e-5;

void expect_fast_matches(const testing::Inputs& in, const ReferenceResult& want,
                         double nmse_bound) {
  GuardedTensor context(DType::f32, context_shape(in)), lse(DType::f32, lse_shape(in));
  Options options = in.options;
  options.backend = Backend::fast;
  forward_into(in.q, in.k, in.v, options, {context.view(), lse.view(), {}});
  EXPECT_TRUE(context.guards_intact()) << "context written out of bounds";
  EXPECT_TRUE(lse.guards_intact()) << "lse written out of bounds";
  const testing::Comparison c = testing::compare(context.const_view(), want.context.view());
  EXPECT_TRUE(c.hard_failure.empty()) << "context: " << testing::describe(c);
  EXPECT_LT(c.nmse, nmse_bound) << "context: " << testing::describe(c);
  const testing::Comparison l = testing::compare(lse.const_view(), want.lse.view());
  EXPECT_TRUE(l.hard_failure.empty()) << "lse: " << testing::describe(l);
  EXPECT_LT(l.max_abs, kLseMaxAbs) << "lse: " << testing::describe(l);
}

class FastForward : public ::testing::TestWithParam<Case> {};

TEST_P(FastForward, MatchesReferenceOnEveryTarget) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  const ReferenceResult want = run_reference(in);
  for_each_target([&] { expect_fast_matches(in, want, context_nmse_bound(GetParam())); });
}

// The cases the fast kernel serves (float64 goes to the reference).
std::vector<Case> supported(const std::vector<Case>& cases) {
  std::vector<Case> out;
  for (const Case& c : cases) {
    if (c.dtype != DType::f64) out.push_back(c);
  }
  return out;
}

// gtest names allow letters, digits and '_' only ("win6_-1" -> "win6_m1", "2.5" -> "2p5").
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name;
  for (const char ch : info.param.name()) {
    if (ch == '-') {
      name += 'm';
    } else if (ch == '.') {
      name += 'p';
    } else {
      name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    }
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Cases, FastForward, ::testing::ValuesIn(supported(testing::case_list())),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Dropout, FastForward,
                         ::testing::ValuesIn(supported(testing::dropout_cases())), case_name);

// Sizes past one key tile and one work item, at the head dims with their own kernel copy.
std::vector<Case> larger_cases() {
  auto shaped = [](Index hq, Index hkv, Index lq, Index lk, Index d) {
    Case c;
    c.heads_q = hq, c.heads_kv = hkv, c.len_q = lq, c.len_k = lk, c.dim = d, c.dim_v = d;
    return c;
  };
  std::vector<Case> out;
  out.push_back(shaped(8, 2, 257, 1025, 64));
  Case causal = shaped(2, 2, 1025, 1025, 128);
  causal.causal = true;
  out.push_back(causal);
  Case bottom_right = shaped(2, 1, 513, 300, 256);
  bottom_right.causal = true, bottom_right.align = CausalAlign::bottom_right;
  out.push_back(bottom_right);
  Case window = shaped(4, 4, 300, 700, 80);
  window.window = {150, 20}, window.softcap = 10.0, window.alibi = true;
  window.dtype = DType::bf16;
  out.push_back(window);
  Case masked = shaped(3, 1, 260, 400, 96);
  masked.mask = testing::MaskCase::boolean, masked.sinks = true, masked.dtype = DType::f16;
  out.push_back(masked);
  // Decoding with 16-bit K and V, whose narrow tiles are read in place (attend_narrow_tile
  // in src/cpu/forward/forward.cpp): one to four rows an item, over three key tiles; the rows of an
  // item see the same keys (one query) or not (two queries, causal).
  for (const Index group : {1, 2, 3, 4}) {
    Case decoding = shaped(2 * group, 2, 1, 300, group % 2 ? 64 : 128);
    decoding.dtype = group % 2 ? DType::f16 : DType::bf16;
    decoding.sinks = group == 3, decoding.softcap = group == 2 ? 6.0 : 0.0;
    out.push_back(decoding);
    Case speculative = shaped(group, 1, 2, 700, 80);
    speculative.dtype = group % 2 ? DType::bf16 : DType::f16;
    speculative.causal = true, speculative.align = CausalAlign::bottom_right;
    speculative.window = {group == 4 ? 400 : -1, -1}, speculative.alibi = group == 1;
    out.push_back(speculative);
  }
  if (testing::full_sweep()) {
    for (const Index d : {64, 128, 256}) {
      for (const bool is_causal : {false, true}) {
        Case c = shaped(8, 2, 1025, 1025, d);
        c.causal = is_causal;
        out.push_back(c);
      }
    }
  }
  return out;
}

class FastForwardLarger : public ::testing::TestWithParam<Case> {};

TEST_P(FastForwardLarger, MatchesReferenceOnEveryTarget) {
  const testing::Inputs in = testing::make_inputs(GetParam());
  const ReferenceResult want = run_reference(in);
  for_each_target([&] { expect_fast_matches(in, want, context_nmse_bound(GetParam())); });
}

INSTANTIATE_TEST_SUITE_P(Larger, FastForwardLarger, ::testing::ValuesIn(larger_cases()), case_name);

// An explicit scale, 0.37 and 1.9 times 1/sqrt(d) (scores of the usual size, so the usual
// bounds hold), on the generic copy (d = 40, and dv != d) and on every head dim with its
// own copy, over keys in several tiles.
TEST(FastForwardScale, ExplicitScaleOnEveryHeadDimCopy) {
  const std::pair<Index, Index> dims[] = {{40, 40}, {64, 24},   {64, 64},  {80, 80},
                                          {96, 96}, {128, 128}, {256, 256}};
  for (const auto& [dim, dim_v] : dims) {
    for (const double factor : {0.37, 1.9}) {
      Case c;
      c.heads_q = 4, c.heads_kv = 2, c.len_q = 21, c.len_k = 300, c.dim = dim, c.dim_v = dim_v;
      c.causal = true, c.align = CausalAlign::bottom_right;
      testing::Inputs in = testing::make_inputs(c);
      in.options.scale = factor / std::sqrt(static_cast<double>(dim));
      SCOPED_TRACE(c.name() + " scale " + std::to_string(factor) + "/sqrt(d)");
      const ReferenceResult want = run_reference(in);
      for_each_target([&] { expect_fast_matches(in, want, kContextNmse); });
    }
  }
}

// Hidden keys are skipped, not multiplied by zero: NaN in a hidden k or v row must not
// reach rows that do not see it (the reference skips it the same way).
// bf16 q and k on a CPU with AVX512-BF16 take its dot-product path (cpu/bf16_dot.hpp) on the
// AVX-512 targets: every head-dim copy, GQA, causal and an odd dim (which stays on the
// float path), against float64 as tightly as float inputs. The case lists run it too.
TEST(FastForwardBf16Dot, MatchesReferenceOnEveryHeadDimCopy) {
  if (!cpu::has_bf16_dot()) {
    GTEST_SKIP() << "this CPU has no AVX512-BF16: the bf16 dot path was not exercised here "
                    "(it runs emulated in tests/python/test_emulated_attention.py)";
  }
  for (const Index dim : {64, 80, 96, 128, 256, 40, 59}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    Case c;
    c.heads_q = 4, c.heads_kv = 2, c.len_q = 150, c.len_k = 231, c.dim = c.dim_v = dim;
    c.causal = true, c.align = CausalAlign::bottom_right, c.dtype = DType::bf16;
    const testing::Inputs in = testing::make_inputs(c);
    const ReferenceResult want = run_reference(in);
    for_each_target([&] { expect_fast_matches(in, want, kContextNmse); });
  }
}

// One thread walks wide items, whose AMX scores leave their scale to the softmax where
// nothing shapes them, then a narrow one (2 rows, scored in place): it must not inherit a
// scale left over. bf16 without shaping, so that the wide items defer on a CPU with AMX.
TEST(FastForwardBf16Dot, NarrowItemAfterWideOnesOnOneThread) {
  Case c;
  c.heads_q = 2, c.heads_kv = 2, c.len_q = 98, c.len_k = 300, c.dim = c.dim_v = 64;
  c.dtype = DType::bf16;
  testing::Inputs in = testing::make_inputs(c);
  in.options.threads = 1;
  const ReferenceResult want = run_reference(in);
  for_each_target([&] { expect_fast_matches(in, want, kContextNmse); });
}

// pv_precision bf16 on the same cases: P V by vdpbf16ps on each weight rounded to bf16
// (cpu/bf16_dot.hpp; for Lq 2, narrow chunks, on V rows in pairs: cpu/tile/bf16_pairs-inl.h)
// on the AVX-512 targets, within bf16's rounding of P (worst NMSE seen 2.0e-6 on Zen 4), and
// not exact P's bits where the plan rounds P; any thread count gives the same bits.
TEST(FastForwardBf16Dot, RoundedPMatchesReferenceWithinItsRounding) {
  if (!cpu::has_bf16_dot()) {
    GTEST_SKIP() << "this CPU has no AVX512-BF16: P V by vdpbf16ps was not exercised here "
                    "(it runs emulated in tests/python/test_emulated_attention.py)";
  }
  for (const Index dim : {64, 80, 128, 256})
    for (const Index len_q : {150, 2}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + ", Lq " + std::to_string(len_q));
      Case c;
      c.heads_q = 4, c.heads_kv = 2, c.len_q = len_q, c.len_k = 231, c.dim = c.dim_v = dim;
      c.causal = dim != 80, c.align = CausalAlign::bottom_right, c.dtype = DType::bf16;
      testing::Inputs in = testing::make_inputs(c);
      const ReferenceResult want = run_reference(in);
      in.options.backend = Backend::fast;
      const Tensor exact = forward(in.q, in.k, in.v, in.options).context;
      in.options.pv_precision = PvPrecision::bf16;
      for_each_target([&] { expect_fast_matches(in, want, kRoundedPContextNmse); });
      std::vector<Tensor> rounded;
      for (const int threads : {1, 2, 3}) {
        in.options.threads = threads;
        rounded.push_back(forward(in.q, in.k, in.v, in.options).context);
      }
      const auto bytes = [](const Tensor& t) {
        const auto* data = static_cast<const unsigned char*>(t.data());
        return std::vector<unsigned char>(data, data + t.nbytes());
      };
      // Not exact P's bits where the dispatched target takes vdpbf16ps (a build of fewer
      // targets, as the TSan one, may dispatch to AVX2, where P stays float32).
      if (explain(in.q, in.k, in.v, in.options).plan.find("pv_precision bf16") !=
          std::string::npos) {
        EXPECT_NE(bytes(rounded[0]), bytes(exact));
      }
      EXPECT_EQ(bytes(rounded[1]), bytes(rounded[0]));
      EXPECT_EQ(bytes(rounded[2]), bytes(rounded[0]));
    }
}

TEST(FastForwardHiddenKeys, NanInHiddenKeysNeverReachesOutput) {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 70, c.len_k = 70, c.dim = 64, c.dim_v = 64;
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
  Case additive = c;
  additive.mask = testing::MaskCase::additive, additive.causal = true;
  variants.push_back(additive);
  // bf16 too: on a CPU with AMX its context goes through tiles, and a poisoned span of keys
  // key by key (src/cpu/forward/forward.cpp, context_on_tiles).
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (Case variant : variants) {
      variant.dtype = dtype;
      SCOPED_TRACE(variant.name());
      testing::Inputs in = testing::make_inputs(variant);
      testing::poison_key(in, 40);
      const ReferenceResult want = run_reference(in);
      for_each_target([&] { expect_fast_matches(in, want, kContextNmse); });
    }
  }
}

// The same over many key tiles: rows that skip the poisoned tile row by row must rescale
// what earlier tiles accumulated, and later tiles must rescale that in turn. The poisoned
// keys lie in middle tiles, hidden by a mask from most rows, which see keys in every tile,
// or hidden by a causal window from rows that see the tiles before them.
TEST(FastForwardHiddenKeys, NanInHiddenKeysOfMiddleTilesNeverReachesOutput) {
  struct Poisoned {
    Index len_k, dim;
    std::vector<Index> keys;
  };
  const Poisoned layouts[] = {{300, 64, {150}}, {1025, 64, {300, 700}}, {300, 256, {100, 200}}};
  for (const Poisoned& layout : layouts) {
    Case c;
    c.heads_q = 4, c.heads_kv = 2, c.len_q = 40, c.len_k = layout.len_k;
    c.dim = layout.dim, c.dim_v = layout.dim;
    std::vector<Case> variants;
    Case boolean = c;
    boolean.mask = testing::MaskCase::boolean;
    variants.push_back(boolean);
    Case additive = c;
    additive.mask = testing::MaskCase::additive, additive.causal = true;
    additive.align = CausalAlign::bottom_right, additive.softcap = 4.0;
    variants.push_back(additive);
    if (layout.len_k <= 300) {  // every query row, one per key: kept short
      Case window = c;
      window.len_q = layout.len_k, window.window = {100, 0};
      variants.push_back(window);
    }
    for (const Case& variant : variants) {
      SCOPED_TRACE(variant.name());
      testing::Inputs in = testing::make_inputs(variant);
      for (const Index key : layout.keys) {
        testing::poison_key(in, key);
        if (variant.mask != testing::MaskCase::none) testing::show_key_to_every_fourth_row(in, key);
      }
      const ReferenceResult want = run_reference(in);
      for_each_target([&] { expect_fast_matches(in, want, kContextNmse); });
    }
  }
}

// Two queries with 16-bit K and V, whose narrow tiles are read in place, their windows
// over three key tiles: a NaN key and an infinite value that the first query's window
// holds and the second's leaves out reach only the first query's rows.
TEST(FastForwardHiddenKeys, NanInKeysOfNarrowTilesReachesOnlyRowsThatSeeThem) {
  for (const DType dtype : {DType::f16, DType::bf16}) {
    Case c;
    c.heads_q = 2, c.heads_kv = 1, c.len_q = 2, c.len_k = 300, c.dim = 64, c.dim_v = 64;
    c.dtype = dtype, c.causal = true, c.align = CausalAlign::bottom_right, c.window = {290, 0};
    SCOPED_TRACE(c.name());
    testing::Inputs in = testing::make_inputs(c);
    const auto bits = [&](float x) {
      return dtype == DType::f16 ? to_float16(x).bits : to_bfloat16(x).bits;
    };
    constexpr Index kFirstQuerysFirstKey = 300 - 2 - 290;
    auto* k = static_cast<std::uint16_t*>(const_cast<void*>(in.k.data));
    auto* v = static_cast<std::uint16_t*>(const_cast<void*>(in.v.data));
    k[kFirstQuerysFirstKey * in.k.strides[2]] = bits(std::numeric_limits<float>::quiet_NaN());
    v[kFirstQuerysFirstKey * in.v.strides[2] + c.dim_v - 1] =
        bits(std::numeric_limits<float>::infinity());
    const ReferenceResult want = run_reference(in);
    for (Index h = 0; h < c.heads_q; ++h) {
      ASSERT_TRUE(std::isnan(want.context.data_as<double>()[(h * 2) * c.dim_v]));
      ASSERT_TRUE(std::isfinite(want.context.data_as<double>()[(h * 2 + 1) * c.dim_v]));
    }
    for_each_target([&] { expect_fast_matches(in, want, kContextNmse); });
  }
}

// A row whose scores are NaN reports NaN (context and lse), as the reference does; lse =
// -inf means "this row sees no key" and stays for fully masked rows. NaN reaches the scores
// through a query element, or through an additive mask on the only key a row sees, in
// the middle of several key tiles.
TEST(FastForwardNanRows, NanScoresGiveNanLse) {
  for (const Index dim : {40, 64}) {
    Case c;
    c.heads_q = 2, c.heads_kv = 1, c.len_q = 20, c.len_k = 300, c.dim = dim, c.dim_v = dim;
    c.mask = testing::MaskCase::additive;
    SCOPED_TRACE(c.name());
    testing::Inputs in = testing::make_inputs(c);
    auto* q = static_cast<float*>(const_cast<void*>(in.q.data));
    q[(1 * c.len_q + 3) * c.dim + 5] = std::numeric_limits<float>::quiet_NaN();
    float* mask = in.mask_storage.data_as<float>();
    for (Index j = 0; j < c.len_k; ++j) mask[5 * c.len_k + j] = -INFINITY;
    mask[5 * c.len_k + 200] = std::numeric_limits<float>::quiet_NaN();
    const ReferenceResult want = run_reference(in);
    ASSERT_TRUE(std::isnan(want.lse.data_as<double>()[1 * c.len_q + 3]));
    ASSERT_TRUE(std::isnan(want.lse.data_as<double>()[5]));
    ASSERT_EQ(want.lse.data_as<double>()[2], -INFINITY);  // mask row 2 hides every key
    for_each_target([&] { expect_fast_matches(in, want, kContextNmse); });
  }
}

TEST(FastForwardThreads, BitwiseIdenticalForAnyThreadCount) {
  Case c;
  c.heads_q = 6, c.heads_kv = 2, c.len_q = 333, c.len_k = 410, c.dim = 64, c.dim_v = 64;
  c.causal = true, c.align = CausalAlign::bottom_right, c.alibi = true, c.sinks = true;
  const testing::Inputs in = testing::make_inputs(c);
  std::vector<std::vector<unsigned char>> results;
  for (const int threads : {1, 2, 3, 7}) {
    Options options = in.options;
    options.backend = Backend::fast;
    options.threads = threads;
    const Result r = forward(in.q, in.k, in.v, options, {.lse = true});
    std::vector<unsigned char> bytes(r.context.nbytes() + r.lse.nbytes());
    std::memcpy(bytes.data(), r.context.data(), r.context.nbytes());
    std::memcpy(bytes.data() + r.context.nbytes(), r.lse.data(), r.lse.nbytes());
    results.push_back(std::move(bytes));
  }
  for (std::size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << i;
}

// Every output dtype the outputs view may have, against float64 with the dtype's rounding.
TEST(FastForwardOutputs, WritesEveryOutputDtype) {
  Case c;
  c.heads_q = 2, c.len_q = 50, c.len_k = 90, c.dim = 40, c.dim_v = 40, c.causal = true;
  const testing::Inputs in = testing::make_inputs(c);
  const ReferenceResult want = run_reference(in);
  const std::pair<DType, double> outputs[] = {{DType::f16, 1e-6},
                                              {DType::bf16, 1e-4},
                                              {DType::f32, kContextNmse},
                                              {DType::f64, kContextNmse}};
  for (const auto& [dtype, bound] : outputs) {
    SCOPED_TRACE(dtype_name(dtype));
    GuardedTensor context(dtype, context_shape(in)), lse(DType::f64, lse_shape(in));
    Options options = in.options;
    options.backend = Backend::fast;
    forward_into(in.q, in.k, in.v, options, {context.view(), lse.view(), {}});
    EXPECT_TRUE(context.guards_intact() && lse.guards_intact());
    const testing::Comparison cmp = testing::compare(context.const_view(), want.context.view());
    EXPECT_TRUE(cmp.hard_failure.empty()) << testing::describe(cmp);
    EXPECT_LT(cmp.nmse, bound) << testing::describe(cmp);
    EXPECT_LT(testing::compare(lse.const_view(), want.lse.view()).max_abs, kLseMaxAbs);
  }
}

TEST(FastForwardDispatch, FastBackendNamesWhatItDoesNotSupport) {
  Case c;
  c.len_q = 4, c.len_k = 5, c.dim = 8, c.dim_v = 8, c.dtype = DType::f64;
  const testing::Inputs wide = testing::make_inputs(c);
  Options options = wide.options;
  options.backend = Backend::fast;
  try {
    forward(wide.q, wide.k, wide.v, options);
    FAIL() << "expected attn::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("backend: ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
  }
  // Weights come from the fast weights pass (tests/weights_test.cpp).
  c.dtype = DType::f32;
  const testing::Inputs in = testing::make_inputs(c);
  EXPECT_NO_THROW(forward(in.q, in.k, in.v, options, {.weights = true}));
  // automatic falls back to the reference.
  options.backend = Backend::automatic;
  EXPECT_NO_THROW(forward(wide.q, wide.k, wide.v, options));
}

TEST(FastForwardDispatch, EnvironmentForcesReference) {
  Case c;
  c.len_q = 4, c.len_k = 5, c.dim = 8, c.dim_v = 8, c.dtype = DType::f64;
  const testing::Inputs in = testing::make_inputs(c);
  Options options = in.options;
  options.backend = Backend::fast;
  ASSERT_EQ(setenv("ATTN_BACKEND", "reference", 1), 0);
  // The reference serves float64, so the unsupported request goes through.
  EXPECT_NO_THROW(forward(in.q, in.k, in.v, options));
  unsetenv("ATTN_BACKEND");
  EXPECT_THROW(forward(in.q, in.k, in.v, options), Error);
}

TEST(FastForwardDispatch, RejectsBadThreadEnvironment) {
  Case c;
  const testing::Inputs in = testing::make_inputs(c);
  ASSERT_EQ(setenv("ATTN_NUM_THREADS", "two", 1), 0);
  try {
    forward(in.q, in.k, in.v, in.options);
    FAIL() << "expected attn::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ATTN_NUM_THREADS"), std::string::npos) << e.what();
  }
  unsetenv("ATTN_NUM_THREADS");
}

}  // namespace
}  // namespace attn
