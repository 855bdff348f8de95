// Decoding from the paged cache against the float64 reference over whole sequences: step by
// step for every storage dtype, page size, GQA ratio and option; speculative multi-query
// steps over long (split) sequences; shared prefixes; thread-count determinism; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include <hwy/targets.h>

#include "attn/decode.hpp"
#include "cpu/forward/forward.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"
#include "support/targets.hpp"

namespace attn::testing {
namespace {

struct DecodeCase {
  Case shape;  // batch = sequences, len_q = len_k = tokens per sequence; dtype of inputs
  CacheDType storage = CacheDType::f32;
  Index page = 16;

  std::string name() const {
    return shape.name() + "_" + cache_dtype_name(storage) + "_page" + std::to_string(page);
  }
};

void PrintTo(const DecodeCase& c, std::ostream* out) {
  *out << c.name();
}

// NMSE bound of each storage dtype: the cache holds 16-bit inputs exactly, so only float32
// accumulation remains; int8 and fp8 add their rounding.
double nmse_bound(CacheDType storage) {
  switch (storage) {
    case CacheDType::int8:
      return 1e-3;
    case CacheDType::fp8_e4m3:
      return 3e-3;
    case CacheDType::fp8_e5m2:
      return 1e-2;
    default:
      return 1e-12;
  }
}

TensorView rows_of(const TensorView& t, Index b, Index first, Index count) {
  TensorView part = t;
  part.data = static_cast<const char*>(t.data) +
              static_cast<std::ptrdiff_t>((b * t.strides[0] + first * t.strides[2]) *
                                          static_cast<Index>(dtype_size(t.dtype)));
  part.shape = {1, t.shape[1], count, t.shape[3]};
  return part;
}

// The reference over whole sequences with causal masking, in float64.
Tensor reference_context(const Inputs& in, Options options) {
  options.causal = true;
  options.backend = Backend::reference;
  const Dims& q = in.q.shape;
  Tensor want(DType::f64, {q[0], q[1], q[2], in.v.shape[3]});
  forward_into(in.q, in.k, in.v, options, Outputs{want.mutable_view(), std::nullopt, std::nullopt});
  return want;
}

std::vector<DecodeCase> step_cases() {
  std::vector<DecodeCase> cases;
  const bool full = full_sweep();
  for (const CacheDType storage : {CacheDType::f32, CacheDType::f16, CacheDType::bf16,
                                   CacheDType::int8, CacheDType::fp8_e4m3, CacheDType::fp8_e5m2}) {
    for (const Index page : {1, 3, 16, 100}) {
      for (const Index group : {1, 2, 3, 4}) {
        for (int option = 0; option < 6; ++option) {
          if (!full && (page + group + option) % 3 != 0) continue;
          DecodeCase c;
          c.storage = storage;
          c.page = page;
          Case& s = c.shape;
          s.batch = 3, s.heads_kv = 2, s.heads_q = 2 * group, s.len_q = s.len_k = 41;
          s.dim = option % 2 ? 40 : 64, s.dim_v = option % 2 ? 24 : 64, s.causal = true;
          s.dtype = storage == CacheDType::f16    ? DType::f16
                    : storage == CacheDType::bf16 ? DType::bf16
                                                  : DType::f32;
          if (option == 1) s.window = {7, -1};
          if (option == 2) s.softcap = 3.0;
          if (option == 3) s.alibi = true;
          if (option == 4) s.sinks = true;
          if (option == 5) s.window = {0, -1};
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

class DecodeSteps : public ::testing::TestWithParam<DecodeCase> {};

// Sequence b has its first 11 b tokens appended in one call, then one token per step; at
// each step every sequence past its prompt decodes its newest token, so one call holds
// sequences of different lengths.
void check_steps(const DecodeCase& c) {
  const Case& s = c.shape;
  const Inputs in = make_inputs(s, 7);
  const Tensor want = reference_context(in, in.options);
  Tensor got(DType::f64, want.shape());
  std::memcpy(got.data(), want.data(), want.nbytes());  // rows never decoded compare equal
  KVCache cache({.heads_kv = s.heads_kv,
                 .dim = s.dim,
                 .dim_v = s.dim_v,
                 .page_size = c.page,
                 .dtype = c.storage,
                 .max_blocks = 0});
  std::vector<KVCache::SequenceId> ids;
  const auto prompt = [](Index b) { return 11 * b; };
  for (Index b = 0; b < s.batch; ++b) {
    ids.push_back(cache.add_sequence());
    cache.append(ids.back(), rows_of(in.k, b, 0, prompt(b)), rows_of(in.v, b, 0, prompt(b)));
  }
  for (Index t = 0; t < s.len_k; ++t) {
    std::vector<KVCache::SequenceId> active;
    for (Index b = 0; b < s.batch && prompt(b) <= t; ++b) {
      cache.append(ids[b], rows_of(in.k, b, t, 1), rows_of(in.v, b, t, 1));
      active.push_back(ids[b]);
    }
    TensorView q = rows_of(in.q, 0, t, 1);
    q.shape[0] = static_cast<Index>(active.size());
    const Decoded step = decode(q, cache, active, in.options);
    for (Index b = 0; b < q.shape[0]; ++b)
      for (Index h = 0; h < s.heads_q; ++h)
        for (Index d = 0; d < s.dim_v; ++d) {
          got.data_as<double>()[((b * s.heads_q + h) * s.len_q + t) * s.dim_v + d] =
              step.context.data_as<float>()[(b * s.heads_q + h) * s.dim_v + d];
        }
  }
  const Comparison result = compare(got.view(), want.view());
  ASSERT_TRUE(result.hard_failure.empty()) << result.hard_failure;
  EXPECT_LE(result.nmse, nmse_bound(c.storage)) << describe(result);
}

// On every target: the dot micro-kernel takes a different number of keys a block for
// one to four rows (and per target), and the groups of 1 to 4 give every row count.
TEST_P(DecodeSteps, MatchOneForwardOverTheWholeSequence) {
  for_each_target([] { check_steps(GetParam()); });
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeSteps, ::testing::ValuesIn(step_cases()),
                         [](const auto& param_info) { return param_info.param.name(); });

// A cache of f32 sequences of the given lengths (random tokens), appended in uneven calls.
struct Filled {
  KVCache cache;
  std::vector<KVCache::SequenceId> ids;
};

Filled filled_cache(const std::vector<Index>& lengths, Index heads_kv, Index dim, Index page,
                    std::mt19937_64& rng, CacheDType storage = CacheDType::f32,
                    std::optional<CacheDType> value_storage = std::nullopt, Index group = 0,
                    bool zero_point = false) {
  Filled f{KVCache({.heads_kv = heads_kv,
                    .dim = dim,
                    .dim_v = dim,
                    .page_size = page,
                    .dtype = storage,
                    .dtype_v = value_storage,
                    .group = group,
                    .zero_point = zero_point,
                    .max_blocks = 0}),
           {}};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Index length : lengths) {
    f.ids.push_back(f.cache.add_sequence());
    for (Index done = 0; done < length;) {
      const Index n = std::min<Index>(length - done, 1 + static_cast<Index>(rng() % 300));
      Tensor k(DType::f32, {1, heads_kv, n, dim}), v(DType::f32, {1, heads_kv, n, dim});
      for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = normal(rng);
      for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
      f.cache.append(f.ids.back(), k.view(), v.view());
      done += n;
    }
  }
  return f;
}

// Checks decode of q (one row block per sequence) against the reference over each
// sequence's cached keys (as the cache holds them: int8 dequantised, so only float32
// rounding remains), with bottom-right alignment.
void expect_matches_reference(const KVCache& cache, const std::vector<KVCache::SequenceId>& ids,
                              const TensorView& q, const Options& options, const Decoded& got,
                              double nmse_bound = 1e-12) {
  for (std::size_t b = 0; b < ids.size(); ++b) {
    const Tensor k = cache.keys(ids[b]), v = cache.values(ids[b]);
    Options reference = options;
    reference.causal_align = CausalAlign::bottom_right;
    reference.backend = Backend::reference;
    const Index n_q = q.shape[2], heads = q.shape[1], dim_v = v.shape()[3];
    Tensor want(DType::f64, {1, heads, n_q, dim_v});
    forward_into(rows_of(q, static_cast<Index>(b), 0, n_q), k.view(), v.view(), reference,
                 Outputs{want.mutable_view(), std::nullopt, std::nullopt});
    const TensorView mine(
        got.context.data_as<float>() + static_cast<Index>(b) * heads * n_q * dim_v, DType::f32,
        {1, heads, n_q, dim_v});
    const Comparison result = compare(mine, want.view());
    ASSERT_TRUE(result.hard_failure.empty()) << "sequence " << b << ": " << result.hard_failure;
    EXPECT_LE(result.nmse, nmse_bound) << "sequence " << b << ": " << describe(result);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// 21460 key rows over 2 KV heads: enough work for every thread count tried to be used.
void check_speculative_steps(Index page) {
  std::mt19937_64 rng(17);
  Filled f = filled_cache({9000, 700, 5, 1025}, 2, 59, page, rng);
  Case shape;
  shape.batch = 4, shape.heads_q = 6, shape.heads_kv = 2, shape.len_q = 3, shape.dim = 59;
  const Inputs in = make_inputs(shape, 3);
  for (const bool causal : {false, true}) {
    for (const Window window : {Window{}, Window{600, -1}, Window{100, 1}}) {
      Options options;
      options.causal = causal;
      options.window = window;
      options.threads = 1;
      const Decoded one = decode(in.q, f.cache, f.ids, options);
      expect_matches_reference(f.cache, f.ids, in.q, options, one);
      for (const int threads : {2, 3, 5}) {
        options.threads = threads;
        const Decoded many = decode(in.q, f.cache, f.ids, options);
        EXPECT_TRUE(same_bits(one.context, many.context)) << threads << " threads";
        EXPECT_TRUE(same_bits(one.lse, many.lse)) << threads << " threads";
      }
    }
  }
}

using testing::for_each_target;

TEST(Decode, EveryTargetDecodesEveryStorageDtype) {
  for_each_target([] {
    for (const CacheDType storage :
         {CacheDType::f32, CacheDType::f16, CacheDType::bf16, CacheDType::int8,
          CacheDType::fp8_e4m3, CacheDType::fp8_e5m2}) {
      DecodeCase c;
      c.storage = storage;
      c.page = 3;
      Case& s = c.shape;
      s.batch = 2, s.heads_kv = 1, s.heads_q = 4, s.len_q = s.len_k = 70, s.dim = 59;
      s.dim_v = 33, s.causal = true, s.window = {50, -1}, s.alibi = true;
      s.dtype = storage == CacheDType::f16    ? DType::f16
                : storage == CacheDType::bf16 ? DType::bf16
                                              : DType::f32;
      SCOPED_TRACE(c.name());
      check_steps(c);
    }
  });
}

TEST(Decode, SpeculativeStepsOverSplitSequencesAreExactAndThreadCountFree) {
  for_each_target([] { check_speculative_steps(16); });
}

// Blocks of 100 tokens: tiles are cut inside blocks, and splits fall inside blocks.
TEST(Decode, LargeBlocksAreCutIntoTiles) {
  check_speculative_steps(100);
}

TEST(Decode, SharedPrefixesMatchTheReferenceAndEachSequenceAlone) {
  std::mt19937_64 rng(23);
  Filled f = filled_cache({1100, 40}, 2, 64, 16, rng);
  const KVCache::SequenceId parent = f.ids[0];
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<KVCache::SequenceId> ids{parent};
  for (const Index suffix : {1, 17, 600}) {
    const KVCache::SequenceId child = f.cache.fork(parent);
    Tensor k(DType::f32, {1, 2, suffix, 64}), v(DType::f32, {1, 2, suffix, 64});
    for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = normal(rng);
    for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
    f.cache.append(child, k.view(), v.view());
    ids.push_back(child);
  }
  ids.push_back(f.ids[1]);
  // The prefix is stored once: 1100 tokens in 69 blocks, 68 of them full and shared.
  EXPECT_EQ(f.cache.block_table(ids[1])[67], f.cache.block_table(parent)[67]);
  Case shape;
  shape.batch = static_cast<Index>(ids.size()), shape.heads_q = 4, shape.heads_kv = 2;
  shape.len_q = 2, shape.dim = 64;
  const Inputs in = make_inputs(shape, 5);
  Options options;
  options.causal = true;
  options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  const Decoded together = decode(in.q, f.cache, ids, options);
  expect_matches_reference(f.cache, ids, in.q, options, together);
  for (std::size_t b = 0; b < ids.size(); ++b) {
    const Decoded alone =
        decode(rows_of(in.q, static_cast<Index>(b), 0, 2), f.cache, {ids[b]}, options);
    const Index row = 4 * 2 * 64;
    const TensorView mine(together.context.data_as<float>() + static_cast<Index>(b) * row,
                          DType::f32, {1, 4, 2, 64});
    const Comparison c = compare(mine, alone.context.view());
    EXPECT_LE(c.nmse, 1e-12) << "sequence " << b << ": " << describe(c);
  }
}

TEST(Decode, StateMergesWithAttentionHeldElsewhere) {
  // Prefix in one cache, suffix in another: decode_state of each, merged, finalized with
  // the sinks, equals decode over one cache holding both.
  std::mt19937_64 rng(29);
  Filled whole = filled_cache({900}, 1, 32, 8, rng);
  const Tensor k = whole.cache.keys(whole.ids[0]), v = whole.cache.values(whole.ids[0]);
  KVCache prefix({.heads_kv = 1,
                  .dim = 32,
                  .dim_v = 32,
                  .page_size = 8,
                  .dtype = CacheDType::f32,
                  .max_blocks = 0});
  KVCache suffix = prefix;
  const auto a = prefix.add_sequence(), b = suffix.add_sequence();
  prefix.append(a, rows_of(k.view(), 0, 0, 333), rows_of(v.view(), 0, 0, 333));
  suffix.append(b, rows_of(k.view(), 0, 333, 567), rows_of(v.view(), 0, 333, 567));
  Case shape;
  shape.heads_q = 2, shape.heads_kv = 1, shape.dim = 32;
  const Inputs in = make_inputs(shape, 9);
  Options options;
  options.sinks = {0.3f, -2.0f};
  Options no_sinks;
  const Finalized merged = finalize(
      merge(decode_state(in.q, prefix, {a}, no_sinks), decode_state(in.q, suffix, {b}, no_sinks)),
      options.sinks);
  const Decoded direct = decode(in.q, whole.cache, whole.ids, options);
  EXPECT_LE(compare(merged.context.view(), direct.context.view()).nmse, 1e-12);
  EXPECT_LE(compare(merged.lse.view(), direct.lse.view()).nmse, 1e-12);
}

// int8 against the reference on the cache's own dequantised keys and values: the bound of
// the step tests (1e-3, quantisation included) would let a key or value scale off by 1%
// through; this one leaves only float32 rounding. Sequences of 1 to 3 parts, each appended
// in uneven calls, so blocks were requantised as later tokens raised their maxima.
TEST(Decode, Int8MatchesTheReferenceOnItsDequantisedCache) {
  for_each_target([] {
    std::mt19937_64 rng(37);
    Filled f = filled_cache({1025, 40, 600}, 2, 64, 16, rng, CacheDType::int8);
    Case shape;
    shape.batch = 3, shape.heads_q = 4, shape.heads_kv = 2, shape.len_q = 3, shape.dim = 64;
    const Inputs in = make_inputs(shape, 11);
    for (const Window window : {Window{}, Window{200, -1}}) {
      Options options;
      options.causal = true;
      options.window = window;
      options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
      expect_matches_reference(f.cache, f.ids, in.q, options,
                               decode(in.q, f.cache, f.ids, options));
    }
  });
}

// Keys and values of two dtypes in one cache, each read by its own format (the values
// widened per tile), against the reference over the cache as it holds them.
TEST(Decode, KeysAndValuesOfTwoDtypesMatchTheReferenceOnTheirDequantisedCache) {
  struct Pair {
    CacheDType keys, values;
    Index group;
    bool zero_point;
  };
  for (const Pair& pair : {Pair{CacheDType::int8, CacheDType::int4, 32, true},
                           Pair{CacheDType::f16, CacheDType::int8, 0, false},
                           Pair{CacheDType::int4, CacheDType::bf16, 64, false},
                           Pair{CacheDType::fp8_e4m3, CacheDType::f32, 0, false}}) {
    SCOPED_TRACE(std::string(cache_dtype_name(pair.keys)) + " keys, " +
                 cache_dtype_name(pair.values) + " values");
    for_each_target([&] {
      std::mt19937_64 rng(41);
      Filled f = filled_cache({1025, 40, 600}, 2, 64, 16, rng, pair.keys, pair.values, pair.group,
                              pair.zero_point);
      Case shape;
      shape.batch = 3, shape.heads_q = 4, shape.heads_kv = 2, shape.len_q = 3, shape.dim = 64;
      const Inputs in = make_inputs(shape, 13);
      Options options;
      options.causal = true;
      options.window = {200, -1};
      expect_matches_reference(f.cache, f.ids, in.q, options, decode(in.q, f.cache, f.ids, options),
                               1e-11);
    });
  }
}

// An explicit scale, 0.37 and 1.9 times 1/sqrt(d), at a generic dim and at the dims with
// their own forward kernel copy, over sequences of several tiles and parts. Scores up to
// 1.9 times their usual size round a little coarser: worst NMSE seen 1.7e-12 (SCALAR
// target, d = 128).
TEST(Decode, ExplicitScaleAtEveryHeadDim) {
  for (const Index dim : {40, 64, 80, 96, 128, 256}) {
    std::mt19937_64 rng(41);
    Filled f = filled_cache({700, 90}, 2, dim, 16, rng);
    Case shape;
    shape.batch = 2, shape.heads_q = 4, shape.heads_kv = 2, shape.len_q = 2, shape.dim = dim;
    const Inputs in = make_inputs(shape, 13);
    for (const double factor : {0.37, 1.9}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " scale " + std::to_string(factor) + "/sqrt(d)");
      Options options;
      options.causal = true;
      options.scale = factor / std::sqrt(static_cast<double>(dim));
      for_each_target([&] {
        expect_matches_reference(f.cache, f.ids, in.q, options,
                                 decode(in.q, f.cache, f.ids, options), 4e-12);
      });
    }
  }
}

// float64 queries (decode has no reference path to hand them to) are rounded to float32
// and decoded like any other; the demo's generation trace decodes float64 queries.
TEST(Decode, Float64QueriesOnEveryTarget) {
  std::mt19937_64 rng(47);
  Filled f = filled_cache({300, 37}, 2, 64, 16, rng);
  Case shape;
  shape.batch = 2, shape.heads_q = 4, shape.heads_kv = 2, shape.len_q = 2, shape.dim = 64;
  shape.dtype = DType::f64;
  const Inputs in = make_inputs(shape, 19);
  Options options;
  options.causal = true;
  for_each_target([&] {
    expect_matches_reference(f.cache, f.ids, in.q, options, decode(in.q, f.cache, f.ids, options));
  });
}

// NaN in a key and infinity in a value row that a row does not see never reach it: one
// poisoned key just before the window of every row, with the keys the rows see in many
// tiles (and, at 1025 keys, parts) after it, and one at the newest position, which only
// the last query row sees (and is NaN, as in the reference).
TEST(Decode, NanInHiddenKeysOfLongSequencesNeverReachesOutput) {
  struct Poisoned {
    Index length, window;
  };
  for (const Poisoned layout : {Poisoned{300, 100}, Poisoned{1025, 300}}) {
    const Index length = layout.length, heads_kv = 2, dim = 64;
    std::mt19937_64 rng(43);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Tensor k(DType::f32, {1, heads_kv, length, dim}), v(DType::f32, {1, heads_kv, length, dim});
    for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = normal(rng);
    for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
    // Hidden from every row by the window; seen by the newest query row alone.
    for (const Index key : {length - 4 - layout.window, length - 1}) {
      for (Index h = 0; h < heads_kv; ++h) {
        k.data_as<float>()[(h * length + key) * dim] = std::numeric_limits<float>::quiet_NaN();
        v.data_as<float>()[(h * length + key) * dim + dim - 1] =
            std::numeric_limits<float>::infinity();
      }
    }
    KVCache cache({.heads_kv = heads_kv,
                   .dim = dim,
                   .dim_v = dim,
                   .page_size = 16,
                   .dtype = CacheDType::f32,
                   .max_blocks = 0});
    const KVCache::SequenceId id = cache.add_sequence();
    cache.append(id, k.view(), v.view());
    Case shape;
    shape.heads_q = 4, shape.heads_kv = heads_kv, shape.len_q = 3, shape.dim = dim;
    const Inputs in = make_inputs(shape, 17);
    SCOPED_TRACE("length " + std::to_string(length));
    Options options;
    options.causal = true;
    options.window = {layout.window, -1};
    for_each_target([&] {
      const Decoded got = decode(in.q, cache, {id}, options);
      expect_matches_reference(cache, {id}, in.q, options, got);
      for (Index h = 0; h < shape.heads_q; ++h) {
        EXPECT_TRUE(std::isfinite(got.lse.data_as<float>()[h * 3])) << "head " << h;
        EXPECT_TRUE(std::isfinite(got.lse.data_as<float>()[h * 3 + 1])) << "head " << h;
        EXPECT_TRUE(std::isnan(got.lse.data_as<float>()[h * 3 + 2])) << "head " << h;
      }
    });
  }
}

// A query row with a NaN element has NaN scores: its context and lse are NaN, as in the
// reference, from decode and from decode_state after finalize; other rows are untouched.
TEST(Decode, NanQueryGivesNanRow) {
  std::mt19937_64 rng(47);
  Filled f = filled_cache({700, 50}, 2, 64, 16, rng);
  Case shape;
  shape.batch = 2, shape.heads_q = 4, shape.heads_kv = 2, shape.len_q = 1, shape.dim = 64;
  Inputs in = make_inputs(shape, 19);
  static_cast<float*>(const_cast<void*>(in.q.data))[(0 * 4 + 1) * 64 + 7] =
      std::numeric_limits<float>::quiet_NaN();
  Options options;
  options.causal = true;
  for_each_target([&] {
    const Decoded got = decode(in.q, f.cache, f.ids, options);
    expect_matches_reference(f.cache, f.ids, in.q, options, got);
    const Finalized state = finalize(decode_state(in.q, f.cache, f.ids, options));
    for (Index row = 0; row < 8; ++row) {
      const bool nan_row = row == 1;
      EXPECT_EQ(std::isnan(got.lse.data_as<float>()[row]), nan_row) << "row " << row;
      EXPECT_EQ(std::isnan(state.lse.data_as<float>()[row]), nan_row) << "row " << row;
      EXPECT_EQ(std::isnan(state.context.data_as<float>()[row * 64]), nan_row) << "row " << row;
    }
  });
}

TEST(Decode, BadInputThrowsNamingTheArgument) {
  std::mt19937_64 rng(31);
  Filled f = filled_cache({4}, 2, 8, 4, rng);
  Tensor q(DType::f32, {1, 4, 1, 8}), wide(DType::f32, {1, 4, 1, 9}), odd(DType::f32, {1, 3, 1, 8});
  const auto starts = [](const std::string& text, const std::string& prefix) {
    return text.rfind(prefix, 0) == 0;
  };
  EXPECT_TRUE(starts(error_message([&] { decode(wide.view(), f.cache, f.ids); }),
                     "q: expected shape [1 (one per seq_id), Hq, n_q, 8"));
  EXPECT_TRUE(starts(error_message([&] {
                       decode(q.view(), f.cache, {f.ids[0], f.ids[0]});
                     }),
                     "q: "));
  EXPECT_TRUE(starts(error_message([&] { decode(odd.view(), f.cache, f.ids); }),
                     "q: expected a head count that is a multiple"));
  EXPECT_TRUE(
      starts(error_message([&] { decode(q.view(), f.cache, {42}); }), "seq_ids: expected ids"));
  Options options;
  options.sinks = {1.0f};
  EXPECT_TRUE(starts(error_message([&] { decode(q.view(), f.cache, f.ids, options); }),
                     "sinks: expected 4 values"));
  options.sinks = {1.0f, 1.0f, 1.0f, 1.0f};
  EXPECT_TRUE(starts(error_message([&] { decode_state(q.view(), f.cache, f.ids, options); }),
                     "sinks: expected none"));
  Options masked;
  masked.mask = q.view();
  EXPECT_TRUE(starts(error_message([&] { decode(q.view(), f.cache, f.ids, masked); }), "mask: "));
  Options dropout;
  dropout.dropout_p = 0.1;
  EXPECT_TRUE(starts(error_message([&] { decode(q.view(), f.cache, f.ids, dropout); }),
                     "dropout_p: expected 0 (decode and paged attention serve inference)"));
  Options reference;
  reference.backend = Backend::reference;
  EXPECT_TRUE(
      starts(error_message([&] { decode(q.view(), f.cache, f.ids, reference); }), "backend: "));
  Options window;
  window.window.left = -2;
  EXPECT_TRUE(
      starts(error_message([&] { decode(q.view(), f.cache, f.ids, window); }), "window.left: "));
}

}  // namespace
}  // namespace attn::testing
