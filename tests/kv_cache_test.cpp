// KVCache bookkeeping against a plain model (each sequence as a list of its tokens), over
// thousands of random add / fork / append / drop operations, plus storage round trips and
// argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged.hpp"
#include "cache/kv_cache_blocks.hpp"
#include "support/error_message.hpp"

namespace attn::testing {
namespace {

constexpr Index kHeads = 2, kDim = 3, kDimV = 2;

// One token: kHeads x (kDim key + kDimV value) numbers, exact in float32.
using Token = std::vector<float>;
using Model = std::map<KVCache::SequenceId, std::vector<Token>>;

Token random_token(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> value(-1000, 1000);
  Token t(static_cast<std::size_t>(kHeads * (kDim + kDimV)));
  for (float& x : t) x = static_cast<float>(value(rng)) / 8.0f;
  return t;
}

void append_tokens(KVCache& cache, KVCache::SequenceId seq, const std::vector<Token>& tokens) {
  const auto n = static_cast<Index>(tokens.size());
  Tensor k(DType::f32, {1, kHeads, n, kDim}), v(DType::f32, {1, kHeads, n, kDimV});
  for (Index h = 0; h < kHeads; ++h)
    for (Index i = 0; i < n; ++i) {
      const Token& t = tokens[static_cast<std::size_t>(i)];
      for (Index d = 0; d < kDim; ++d)
        k.data_as<float>()[(h * n + i) * kDim + d] = t[static_cast<std::size_t>(h * kDim + d)];
      for (Index d = 0; d < kDimV; ++d)
        v.data_as<float>()[(h * n + i) * kDimV + d] =
            t[static_cast<std::size_t>(kHeads * kDim + h * kDimV + d)];
    }
  cache.append(seq, k.view(), v.view());
}

void expect_contents(const KVCache& cache, KVCache::SequenceId seq,
                     const std::vector<Token>& tokens) {
  const Tensor k = cache.keys(seq), v = cache.values(seq);
  const auto n = static_cast<Index>(tokens.size());
  ASSERT_EQ(k.shape()[2], n);
  for (Index h = 0; h < kHeads; ++h)
    for (Index i = 0; i < n; ++i) {
      const Token& t = tokens[static_cast<std::size_t>(i)];
      for (Index d = 0; d < kDim; ++d)
        ASSERT_EQ(k.data_as<float>()[(h * n + i) * kDim + d],
                  t[static_cast<std::size_t>(h * kDim + d)])
            << "seq " << seq << " token " << i;
      for (Index d = 0; d < kDimV; ++d)
        ASSERT_EQ(v.data_as<float>()[(h * n + i) * kDimV + d],
                  t[static_cast<std::size_t>(kHeads * kDim + h * kDimV + d)])
            << "seq " << seq << " token " << i;
    }
}

// Reference counts equal the number of table entries naming each block, the free list
// holds exactly the unreferenced blocks, and tables have the length their tokens need.
void expect_consistent(const KVCache& cache, const Model& model) {
  const Index page = cache.config().page_size;
  std::map<std::int32_t, std::int32_t> holders;
  ASSERT_EQ(cache.sequence_ids().size(), model.size());
  for (const auto& [seq, tokens] : model) {
    ASSERT_EQ(cache.length(seq), static_cast<Index>(tokens.size()));
    const auto& table = cache.block_table(seq);
    ASSERT_EQ(static_cast<Index>(table.size()),
              (static_cast<Index>(tokens.size()) + page - 1) / page);
    for (const std::int32_t block : table) ++holders[block];
  }
  Index free = 0;
  for (std::int32_t block = 0; block < cache.blocks_allocated(); ++block) {
    const auto found = holders.find(block);
    const std::int32_t expected = found == holders.end() ? 0 : found->second;
    ASSERT_EQ(cache.ref_count(block), expected) << "block " << block;
    free += expected == 0;
  }
  ASSERT_EQ(cache.blocks_free(), free);
  ASSERT_EQ(cache.blocks_in_use(), static_cast<Index>(holders.size()));
}

class RandomOperations : public ::testing::TestWithParam<Index> {};

TEST_P(RandomOperations, MatchAPlainModel) {
  const Index page = GetParam();
  KVCache cache({.heads_kv = kHeads,
                 .dim = kDim,
                 .dim_v = kDimV,
                 .page_size = page,
                 .dtype = CacheDType::f32,
                 .max_blocks = 0});
  Model model;
  std::mt19937_64 rng(static_cast<unsigned>(page) * 7919u);
  std::uniform_int_distribution<int> op(0, 9), count(0, 2 * static_cast<int>(page) + 1);
  Index peak_blocks = 0;
  for (int step = 0; step < 4000; ++step) {
    const int kind = model.empty() ? 0 : op(rng);
    auto pick = [&] {
      auto it = model.begin();
      std::advance(it, std::uniform_int_distribution<std::size_t>(0, model.size() - 1)(rng));
      return it->first;
    };
    if (kind == 0 || (kind == 1 && model.size() < 3)) {
      model[cache.add_sequence()] = {};
    } else if (kind == 1) {
      const auto parent = pick();
      model[cache.fork(parent)] = model[parent];
    } else if (kind <= 7) {
      const auto seq = pick();
      std::vector<Token> tokens(static_cast<std::size_t>(count(rng)));
      for (Token& t : tokens) t = random_token(rng);
      append_tokens(cache, seq, tokens);
      model[seq].insert(model[seq].end(), tokens.begin(), tokens.end());
    } else if (model.size() > 1 || kind == 9) {
      const auto seq = pick();
      cache.drop(seq);
      model.erase(seq);
    }
    expect_consistent(cache, model);
    if (HasFatalFailure()) return;
    peak_blocks = std::max(peak_blocks, cache.blocks_in_use());
    if (step % 100 == 0) {
      for (const auto& [seq, tokens] : model) expect_contents(cache, seq, tokens);
    }
  }
  for (const auto& [seq, tokens] : model) expect_contents(cache, seq, tokens);
  // Reuse: the pool never grew past the peak number of blocks held at once.
  EXPECT_EQ(cache.blocks_allocated(), peak_blocks);
  for (const auto& entry : model) cache.drop(entry.first);
  EXPECT_EQ(cache.blocks_in_use(), 0);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, RandomOperations, ::testing::Values(1, 3, 16));

TEST(KVCache, ForkSharesFullBlocksAndCopiesThePartialOne) {
  KVCache cache({.heads_kv = kHeads,
                 .dim = kDim,
                 .dim_v = kDimV,
                 .page_size = 4,
                 .dtype = CacheDType::f32,
                 .max_blocks = 0});
  std::mt19937_64 rng(1);
  std::vector<Token> prompt(10);
  for (Token& t : prompt) t = random_token(rng);
  const auto parent = cache.add_sequence();
  append_tokens(cache, parent, prompt);
  const auto child = cache.fork(parent);
  EXPECT_EQ(cache.blocks_in_use(), 3);
  const std::vector<Token> next{random_token(rng)}, other{random_token(rng)};
  append_tokens(cache, child, next);
  append_tokens(cache, parent, other);
  EXPECT_EQ(cache.blocks_in_use(), 4);  // two full blocks shared, each tail its own
  EXPECT_EQ(cache.block_table(parent)[0], cache.block_table(child)[0]);
  EXPECT_NE(cache.block_table(parent)[2], cache.block_table(child)[2]);
  std::vector<Token> child_tokens = prompt, parent_tokens = prompt;
  child_tokens.push_back(next[0]);
  parent_tokens.push_back(other[0]);
  expect_contents(cache, child, child_tokens);
  expect_contents(cache, parent, parent_tokens);
}

// A copy (constructed or assigned) owns its blocks: appends to either leave the other as it
// was. A moved-to cache holds what the source held.
TEST(KVCache, CopiesChangeIndependentlyAndMovesKeepContents) {
  KVCache cache({.heads_kv = kHeads,
                 .dim = kDim,
                 .dim_v = kDimV,
                 .page_size = 4,
                 .dtype = CacheDType::int8,
                 .max_blocks = 0});
  std::mt19937_64 rng(3);
  std::vector<Token> prompt(6);
  for (Token& t : prompt) t = random_token(rng);
  const auto seq = cache.add_sequence();
  append_tokens(cache, seq, prompt);
  const Tensor keys = cache.keys(seq), values = cache.values(seq);
  const auto expect_prompt = [&](const KVCache& c) {
    const Tensor k = c.keys(seq), v = c.values(seq);
    ASSERT_EQ(k.shape(), keys.shape());
    for (Index e = 0; e < k.numel(); ++e)
      EXPECT_EQ(k.data_as<float>()[e], keys.data_as<float>()[e]);
    for (Index e = 0; e < v.numel(); ++e)
      EXPECT_EQ(v.data_as<float>()[e], values.data_as<float>()[e]);
  };

  KVCache copy(cache);
  // Tokens ten times larger, into the shared tail block (copied on write).
  std::vector<Token> loud{random_token(rng)};
  for (float& x : loud[0]) x *= 10.0f;
  append_tokens(copy, seq, loud);
  expect_prompt(cache);
  EXPECT_EQ(cache.length(seq), 6);
  EXPECT_EQ(copy.length(seq), 7);

  const KVCache moved(std::move(cache));
  expect_prompt(moved);
}

TEST(KVCache, StoredDtypesRoundTripWithinTheirPrecision) {
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor k(DType::f32, {1, kHeads, 37, kDim}), v(DType::f32, {1, kHeads, 37, kDimV});
  // Growing magnitudes, so that tokens of one block differ in scale.
  for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = normal(rng) * (1 + i % 37);
  for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
  for (const CacheDType dtype : {CacheDType::f32, CacheDType::f16, CacheDType::bf16,
                                 CacheDType::int8, CacheDType::fp8_e4m3, CacheDType::fp8_e5m2}) {
    SCOPED_TRACE(cache_dtype_name(dtype));
    KVCache cache({.heads_kv = kHeads,
                   .dim = kDim,
                   .dim_v = kDimV,
                   .page_size = 8,
                   .dtype = dtype,
                   .max_blocks = 0});
    const auto seq = cache.add_sequence();
    for (Index i = 0; i < 37; ++i) {
      TensorView k1(k.data_as<float>() + i * kDim, DType::f32, {1, kHeads, 1, kDim},
                    {0, 37 * kDim, kDim, 1});
      TensorView v1(v.data_as<float>() + i * kDimV, DType::f32, {1, kHeads, 1, kDimV},
                    {0, 37 * kDimV, kDimV, 1});
      cache.append(seq, k1, v1);
    }
    const Tensor got = cache.keys(seq);
    // Relative error per element (fp8: or half the smallest subnormal step, absolute); int8:
    // half a step of its own row's scale (max |x| / 127 of that token and head), plus
    // float32's rounding of the scale and the product.
    const double unit = dtype == CacheDType::f32        ? 0.0
                        : dtype == CacheDType::f16      ? 1.0 / 2048
                        : dtype == CacheDType::bf16     ? 1.0 / 256
                        : dtype == CacheDType::fp8_e4m3 ? 1.0 / 16
                        : dtype == CacheDType::fp8_e5m2 ? 1.0 / 8
                                                        : 1.0 / 254;
    const double floor = dtype == CacheDType::fp8_e4m3   ? std::ldexp(1.0, -10)
                         : dtype == CacheDType::fp8_e5m2 ? std::ldexp(1.0, -17)
                                                         : 0.0;
    for (Index h = 0; h < kHeads; ++h)
      for (Index i = 0; i < 37; ++i) {
        const float* row = k.data_as<float>() + (h * 37 + i) * kDim;
        double row_max = 0.0;
        for (Index e = 0; e < kDim; ++e) row_max = std::max<double>(row_max, std::abs(row[e]));
        for (Index d = 0; d < kDim; ++d) {
          const double want = row[d];
          const double error = got.data_as<float>()[(h * 37 + i) * kDim + d] - want;
          const double allowed = dtype == CacheDType::int8
                                     ? unit * row_max * (1.0 + 1e-6) + 1e-7 * std::abs(want)
                                     : std::max(unit * std::abs(want), floor);
          ASSERT_LE(std::abs(error), allowed) << "head " << h << " token " << i << " dim " << d;
        }
      }
  }
}

// int8 quantises each token once, with its own scale, and fp8 each element alone: appending
// a sequence token by token, in runs of any length or at once stores the same bytes and
// scales, so decode reads the same keys and values whatever the appends were (here with
// outlier tokens among them, which under a shared block scale would have changed their
// neighbours' bits).
TEST(KVCache, CodesAreTheSameBytesWhateverTheAppends) {
  constexpr Index kTokens = 45;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor k(DType::f32, {1, kHeads, kTokens, kDim}), v(DType::f32, {1, kHeads, kTokens, kDimV});
  for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = normal(rng);
  for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
  for (Index h = 0; h < kHeads; ++h) {
    k.data_as<float>()[(h * kTokens + 11) * kDim + 2] = 60.0f;  // outliers mid-block
    v.data_as<float>()[(h * kTokens + 30) * kDimV] = -45.0f;
  }
  KVCacheConfig config{.heads_kv = kHeads,
                       .dim = kDim,
                       .dim_v = kDimV,
                       .page_size = 8,
                       .dtype = CacheDType::int8,
                       .max_blocks = 16};
  // The cache's pools (and scales) after appending the tokens in runs of the given lengths.
  const auto stored = [&](const std::vector<Index>& runs) {
    KVCache cache(config);
    const auto seq = cache.add_sequence();
    Index first = 0;
    for (const Index n : runs) {
      cache.append(seq, k.view().rows(first, n), v.view().rows(first, n));
      first += n;
    }
    EXPECT_EQ(first, kTokens);
    const CachePools pools = cache_pools(cache);
    const auto bytes = [&](const PagePool& p, Index dim) {
      const auto* data = static_cast<const std::byte*>(p.data);
      const auto* scales = reinterpret_cast<const std::byte*>(p.scales);
      const Index rows = p.pages * p.heads_kv * p.page_size;
      std::vector<std::byte> out(data, data + rows * dim);
      if (scales != nullptr) {
        out.insert(out.end(), scales, scales + rows * static_cast<Index>(sizeof(float)));
      }
      return out;
    };
    return std::pair{bytes(pools.keys, kDim), bytes(pools.values, kDimV)};
  };
  for (const CacheDType dtype : {CacheDType::int8, CacheDType::fp8_e4m3, CacheDType::fp8_e5m2}) {
    SCOPED_TRACE(cache_dtype_name(dtype));
    config.dtype = dtype;
    const auto at_once = stored({kTokens});
    EXPECT_EQ(stored(std::vector<Index>(kTokens, 1)), at_once);
    EXPECT_EQ(stored({3, 5, 1, 8, 13, 2, 13}), at_once);
    EXPECT_EQ(stored({20, 25}), at_once);
  }
}

// int8 and int4 with a scale per group of 32 elements: each element within half a step of
// its own group's scale (int8: max |x| / 127 over the group; int4: |m| / 8 for m the
// element of largest magnitude, a whole step for an element of m's magnitude and the other
// sign, whose code 8 is clamped to 7) plus float32's rounding, so an outlier channel
// coarsens only its group; and the same bytes and scales whatever the appends. With zero
// points the step is the group's (max - min) / 255 (int8) or / 15 (int4), with no clamping,
// plus 2^-22 of the group's largest magnitude (KVCacheConfig::zero_point).
void expect_groups_within_half_their_step(CacheDType dtype, bool zero_point) {
  constexpr Index kGroupDim = 128, kGroupDimV = 64, kGroup = 32, kTokens = 40;
  const bool int4 = dtype == CacheDType::int4;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor k(DType::f32, {1, kHeads, kTokens, kGroupDim});
  Tensor v(DType::f32, {1, kHeads, kTokens, kGroupDimV});
  for (Index i = 0; i < k.numel(); ++i) {
    k.data_as<float>()[i] = normal(rng) * (i % kGroupDim == 70 ? 50.0f : 1.0f);  // an outlier
  }
  for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
  const KVCacheConfig config{.heads_kv = kHeads,
                             .dim = kGroupDim,
                             .dim_v = kGroupDimV,
                             .page_size = 8,
                             .dtype = dtype,
                             .group = kGroup,
                             .zero_point = zero_point,
                             .max_blocks = 16};
  const auto filled = [&](const std::vector<Index>& runs) {
    auto cache = std::make_unique<KVCache>(config);
    const auto seq = cache->add_sequence();
    Index first = 0;
    for (const Index n : runs) {
      cache->append(seq, k.view().rows(first, n), v.view().rows(first, n));
      first += n;
    }
    return cache;
  };
  const auto at_once = filled({kTokens});
  for (const bool values : {false, true}) {
    const Tensor& given = values ? v : k;
    const Index dim = values ? kGroupDimV : kGroupDim;
    const Tensor got = values ? at_once->values(0) : at_once->keys(0);
    for (Index row = 0; row < kHeads * kTokens; ++row) {
      const float* x = given.data_as<float>() + row * dim;
      for (Index d = 0; d < dim; ++d) {
        double group_max = 0.0, low = x[d], high = x[d];
        for (Index e = d / kGroup * kGroup; e < (d / kGroup + 1) * kGroup; ++e) {
          group_max = std::max<double>(group_max, std::abs(x[e]));
          low = std::min<double>(low, x[e]);
          high = std::max<double>(high, x[e]);
        }
        const double error = got.data_as<float>()[row * dim + d] - static_cast<double>(x[d]);
        if (zero_point) {
          const double step = (high - low) / (int4 ? 15 : 255);
          ASSERT_LE(std::abs(error), step / 2 * (1.0 + 1e-6) + 0x1p-22 * group_max)
              << (values ? "value" : "key") << " row " << row << " dim " << d;
          continue;
        }
        const double step = int4 ? group_max / 8 : group_max / 127;
        const bool clamped = int4 && std::abs(x[d]) > 7.5 * step;
        ASSERT_LE(std::abs(error),
                  (clamped ? step : step / 2) * (1.0 + 1e-6) + 1e-7 * std::abs(x[d]))
            << (values ? "value" : "key") << " row " << row << " dim " << d;
      }
    }
  }
  const auto bytes = [&](KVCache& cache) {
    const CachePools pools = cache_pools(cache);
    std::vector<std::byte> out;
    for (const bool values : {false, true}) {
      const PagePool& pool = values ? pools.values : pools.keys;
      const Index rows = pool.pages * pool.heads_kv * pool.page_size;
      const auto* data = static_cast<const std::byte*>(pool.data);
      const auto* scales = reinterpret_cast<const std::byte*>(pool.scales);
      out.insert(out.end(), data, data + rows * pool.dim / (int4 ? 2 : 1));
      const Index floats = rows * pool.dim / kGroup * (zero_point ? 2 : 1);
      out.insert(out.end(), scales, scales + floats * static_cast<Index>(sizeof(float)));
    }
    return out;
  };
  EXPECT_EQ(bytes(*filled(std::vector<Index>(kTokens, 1))), bytes(*at_once));
  EXPECT_EQ(bytes(*filled({3, 9, 1, 20, 7})), bytes(*at_once));
}

TEST(KVCache, GroupedCodesKeepEachGroupWithinHalfItsStep) {
  for (const CacheDType dtype : {CacheDType::int8, CacheDType::int4}) {
    for (const bool zero_point : {false, true}) {
      SCOPED_TRACE(std::string(cache_dtype_name(dtype)) + (zero_point ? " zero points" : ""));
      expect_groups_within_half_their_step(dtype, zero_point);
    }
  }
}

TEST(KVCache, BadGroupsAreRefusedNamingTheField) {
  const auto message = [](CacheDType dtype, Index dim, Index group) {
    return error_message([&] {
      KVCache(
          {.heads_kv = 1, .dim = dim, .dim_v = 64, .page_size = 4, .dtype = dtype, .group = group});
    });
  };
  EXPECT_EQ(message(CacheDType::f16, 64, 32)
                .rfind("group: expected 0 (groups of scales are for "
                       "int8 and int4), given 32",
                       0),
            0u);
  EXPECT_EQ(message(CacheDType::int8, 64, 16)
                .rfind("group: expected 0 (a scale per row), or 32, "
                       "64 or 128 dividing the head dim (64 and 64)",
                       0),
            0u);
  EXPECT_EQ(
      message(CacheDType::int8, 96, 64).rfind("group: expected 0 (a scale per row), or 32", 0), 0u);
  EXPECT_NO_THROW(
      KVCache({.heads_kv = 1, .dim = 96, .dim_v = 64, .dtype = CacheDType::int8, .group = 32}));
  EXPECT_EQ(error_message(
                [] { KVCache({.heads_kv = 1, .dtype = CacheDType::fp8_e4m3, .zero_point = true}); })
                .rfind("zero_point: expected false for fp8_e4m3 (zero points are for int8 and "
                       "int4), given true",
                       0),
            0u);
  EXPECT_EQ(error_message([] {
              KVCache({.heads_kv = 1, .dim = 96, .dim_v = 40, .dtype = CacheDType::int4});
            }).rfind("dim_v: expected a multiple of 32 for int4 (blocks of 32 codes), given 40", 0),
            0u);
}

// Keys and values of two dtypes (dtype_v): each side checked, stored and read by its own
// format, group and zero_point applying to the sides with scales, v_scale to an fp8 side.
TEST(KVCache, KeysAndValuesOfTwoDtypesAreEachTheirOwnFormat) {
  const auto message = [](const KVCacheConfig& config) {
    return error_message([&] { KVCache{config}; });
  };
  EXPECT_EQ(
      message({.dim = 96, .dim_v = 40, .dtype = CacheDType::f16, .dtype_v = CacheDType::int4})
          .rfind("dim_v: expected a multiple of 32 for int4 (blocks of 32 codes), given 40", 0),
      0u);
  EXPECT_EQ(message({.dtype = CacheDType::f16, .dtype_v = CacheDType::bf16, .group = 32})
                .rfind("group: expected 0 (groups of scales are for int8 and int4), given 32", 0),
            0u);
  EXPECT_EQ(message({.dim = 40,
                     .dim_v = 40,
                     .dtype = CacheDType::f16,
                     .dtype_v = CacheDType::int8,
                     .group = 32})
                .rfind("group: expected 0 (a scale per row), or 32, 64 or 128 dividing the head "
                       "dim (40)",
                       0),
            0u);
  EXPECT_EQ(message({.dtype = CacheDType::fp8_e4m3, .dtype_v = CacheDType::f16, .v_scale = {1.0f}})
                .rfind("v_scale: expected none for float16 (a scale per KV head is for fp8)", 0),
            0u);
  EXPECT_NO_THROW(KVCache({.dim = 96,
                           .dim_v = 40,
                           .dtype = CacheDType::int8,
                           .dtype_v = CacheDType::f16,
                           .group = 32,
                           .zero_point = true}));
  EXPECT_NO_THROW(
      KVCache({.dtype = CacheDType::f16, .dtype_v = CacheDType::fp8_e5m2, .v_scale = {2.0f}}));

  // int8 keys with zero points per group of 32, int4 values with theirs: each element within
  // half its group's step (plus float32's rounding of offset and product), the same bytes
  // appended token by token or at once.
  constexpr Index kTokens = 45;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor k(DType::f32, {1, kHeads, kTokens, 64}), v(DType::f32, {1, kHeads, kTokens, 32});
  for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = normal(rng);
  for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
  const KVCacheConfig config{.heads_kv = kHeads,
                             .dim = 64,
                             .dim_v = 32,
                             .page_size = 8,
                             .dtype = CacheDType::int8,
                             .dtype_v = CacheDType::int4,
                             .group = 32,
                             .zero_point = true};
  KVCache at_once(config), one_by_one(config);
  const auto whole = at_once.add_sequence(), single = one_by_one.add_sequence();
  at_once.append(whole, k.view(), v.view());
  for (Index t = 0; t < kTokens; ++t)
    one_by_one.append(single, k.view().rows(t, 1), v.view().rows(t, 1));
  for (const bool values : {false, true}) {
    const Tensor stored = values ? at_once.values(whole) : at_once.keys(whole);
    const Tensor again = values ? one_by_one.values(single) : one_by_one.keys(single);
    ASSERT_EQ(std::memcmp(stored.data(), again.data(), stored.nbytes()), 0) << values;
    const Tensor& given = values ? v : k;
    const float steps = values ? 15.0f : 255.0f;
    for (Index row = 0; row < kHeads * kTokens; ++row)
      for (Index g = 0; g < given.shape()[3] / 32; ++g) {
        const float* x = given.data_as<float>() + row * given.shape()[3] + g * 32;
        const float* y = stored.data_as<float>() + row * given.shape()[3] + g * 32;
        const auto [low, high] = std::minmax_element(x, x + 32);
        const float bound = (*high - *low) / steps / 2.0f +
                            std::ldexp(std::max(std::fabs(*low), std::fabs(*high)), -22);
        for (Index d = 0; d < 32; ++d) ASSERT_LE(std::fabs(x[d] - y[d]), bound) << values;
      }
  }
}

// fp8 stores a magnitude past its largest finite code as that code (as vLLM's fp8
// quantisation clamps), and refuses what is not finite, naming the argument and the format.
TEST(KVCache, Fp8SaturatesAndRefusesWhatIsNotFinite) {
  for (const auto& [dtype, largest] :
       {std::pair{CacheDType::fp8_e4m3, 448.0f}, std::pair{CacheDType::fp8_e5m2, 57344.0f}}) {
    SCOPED_TRACE(cache_dtype_name(dtype));
    KVCache cache({.heads_kv = 1, .dim = 3, .dim_v = 2, .page_size = 4, .dtype = dtype});
    const auto seq = cache.add_sequence();
    Tensor k(DType::f32, {1, 1, 1, 3}), v(DType::f32, {1, 1, 1, 2});
    const float big[] = {1e6f, -1e30f, 3.0f};
    std::copy_n(big, 3, k.data_as<float>());
    v.data_as<float>()[0] = -largest * 1.2f;
    cache.append(seq, k.view(), v.view());
    const Tensor keys = cache.keys(seq), values = cache.values(seq);
    EXPECT_EQ(keys.data_as<float>()[0], largest);
    EXPECT_EQ(keys.data_as<float>()[1], -largest);
    EXPECT_EQ(keys.data_as<float>()[2], 3.0f);
    EXPECT_EQ(values.data_as<float>()[0], -largest);
    for (const float bad : {NAN, INFINITY}) {
      Tensor bad_v(DType::f32, {1, 1, 1, 2});
      bad_v.data_as<float>()[1] = bad;
      EXPECT_EQ(error_message([&] { cache.append(seq, k.view(), bad_v.view()); })
                    .rfind(std::string("v: expected finite values for ") + cache_dtype_name(dtype) +
                               " pages",
                           0),
                0u);
    }
    EXPECT_EQ(cache.length(seq), 1);
  }
}

TEST(KVCache, BadInputThrowsNamingTheArgumentAndChangesNothing) {
  KVCacheConfig config{.heads_kv = 2,
                       .dim = 3,
                       .dim_v = 2,
                       .page_size = 2,
                       .dtype = CacheDType::int8,
                       .max_blocks = 3};
  EXPECT_EQ(
      error_message([&] { KVCache({.heads_kv = 0}); }).rfind("heads_kv: expected a positive", 0),
      0u);
  EXPECT_EQ(error_message([&] { KVCache({.page_size = -1}); }).rfind("page_size: expected", 0), 0u);
  KVCache cache(config);
  const auto seq = cache.add_sequence();
  Tensor k(DType::f32, {1, 2, 5, 3}), v(DType::f32, {1, 2, 5, 2}), wrong(DType::f32, {1, 2, 5, 4});
  EXPECT_EQ(
      error_message([&] { cache.append(seq + 1, k.view(), v.view()); }).rfind("seq: expected", 0),
      0u);
  EXPECT_EQ(error_message([&] {
              cache.append(seq, wrong.view(), v.view());
            }).rfind("k: expected shape [1, 2, n, 3], given [1, 2, 5, 4]", 0),
            0u);
  EXPECT_EQ(
      error_message([&] { cache.append(seq, k.view(), k.view()); }).rfind("v: expected shape", 0),
      0u);
  Tensor nan_k(DType::f32, {1, 2, 1, 3}), one_v(DType::f32, {1, 2, 1, 2});
  nan_k.data_as<float>()[4] = NAN;
  EXPECT_EQ(error_message([&] {
              cache.append(seq, nan_k.view(), one_v.view());
            }).rfind("k: expected finite values for int8 pages", 0),
            0u);
  cache.append(seq, k.view(), v.view());  // 5 tokens: 3 blocks of 2, the pool's limit
  EXPECT_EQ(
      error_message([&] { cache.append(seq, k.view(), v.view()); }).rfind("k: expected at most", 0),
      0u);
  EXPECT_EQ(cache.length(seq), 5);
  EXPECT_EQ(cache.blocks_in_use(), 3);
  EXPECT_EQ(error_message([&] { cache.fork(99); }).rfind("parent: expected", 0), 0u);
  EXPECT_EQ(error_message([&] { cache.drop(99); }).rfind("seq: expected", 0), 0u);
}

// The block size heads_kv * page_size * dim * element size is computed with overflow
// checks: a size that wraps must be an error naming the argument, not a tiny block that
// appends then write far past.
TEST(KVCache, ImpossibleBlockSizesThrowNamingTheArgument) {
  const Index huge = Index{1} << 60;
  for (const KVCacheConfig& config :
       {KVCacheConfig{.heads_kv = 1, .dim = 8, .dim_v = 8, .page_size = huge},
        KVCacheConfig{.heads_kv = huge, .dim = 8, .dim_v = 8, .page_size = 16},
        KVCacheConfig{.heads_kv = 1, .dim = 8, .dim_v = huge, .page_size = 16},
        KVCacheConfig{.heads_kv = Index{1} << 20,
        .dim = Index{1} << 20,
        .dim_v = 8,
        .page_size = Index{1} << 20,
        .dtype = CacheDType::int8}}) {
    const std::string message = error_message([&] { KVCache cache(config); });
    EXPECT_EQ(message.rfind("page_size: expected a block of heads_kv * page_size * dim", 0), 0u)
        << message;
  }
}

// A decode reads blocks while other sequences' appends add blocks, so blocks must stay where
// they are as the pool grows (here 2 MiB blocks: each new one past the first slab's).
TEST(KVCache, BlocksStayInPlaceAsThePoolGrows) {
  const Index page = 8192, dim = 64;
  KVCache cache(
      {.heads_kv = 1, .dim = dim, .dim_v = dim, .page_size = page, .dtype = CacheDType::f32});
  const KVCache::SequenceId seq = cache.add_sequence();
  Tensor k(DType::f32, {1, 1, page, dim});
  for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = static_cast<float>(i % 1000);
  cache.append(seq, k.view(), k.view());
  const std::byte* first_keys = cache::key_block(cache, 0, 0);
  const std::byte* first_values = cache::value_block(cache, 0, 0);
  for (int block = 1; block < 12; ++block) cache.append(seq, k.view(), k.view());
  EXPECT_EQ(cache.blocks_allocated(), 12);
  EXPECT_EQ(cache::key_block(cache, 0, 0), first_keys);
  EXPECT_EQ(cache::value_block(cache, 0, 0), first_values);
  EXPECT_EQ(std::memcmp(first_keys, k.data(), k.nbytes()), 0);
  EXPECT_EQ(std::memcmp(cache::key_block(cache, 11, 0), k.data(), k.nbytes()), 0);
}

// Tokens whose numbers say which thread appended them and when, exact in float16.
std::vector<Token> tagged_tokens(int thread, int step, Index count) {
  std::vector<Token> tokens(static_cast<std::size_t>(count));
  for (Index i = 0; i < count; ++i) {
    Token& t = tokens[static_cast<std::size_t>(i)];
    t.resize(static_cast<std::size_t>(kHeads * (kDim + kDimV)));
    for (std::size_t e = 0; e < t.size(); ++e) {
      t[e] = static_cast<float>(thread * 16 + (step * 7 + static_cast<int>(i + e)) % 16);
    }
  }
  return tokens;
}

// Threads on different sequences of one cache: four append to their own sequences in
// small steps (so the pool grows under them, and their first blocks are shared by fork),
// one decodes a finished sequence again and again, one forks and drops. Every decode must
// equal the first, and every sequence must hold exactly what its thread appended.
TEST(KVCache, ThreadsOnDifferentSequencesDoNotInterfere) {
  constexpr int kSteps = 1000;  // page_size 1: every append takes blocks
  KVCache cache({.heads_kv = kHeads,
                 .dim = kDim,
                 .dim_v = kDimV,
                 .page_size = 1,
                 .dtype = CacheDType::f16,
                 .max_blocks = 0});
  const KVCache::SequenceId prompt = cache.add_sequence();
  const std::vector<Token> prompt_tokens = tagged_tokens(7, 0, 40);
  append_tokens(cache, prompt, prompt_tokens);
  const KVCache::SequenceId reader = cache.fork(prompt);
  std::vector<KVCache::SequenceId> writers;
  for (int w = 0; w < 4; ++w) writers.push_back(cache.fork(prompt));
  Tensor q(DType::f32, {1, kHeads, 1, kDim});
  for (Index i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = 0.25f * static_cast<float>(i % 5);
  const Decoded first = decode(q.view(), cache, {reader});

  std::atomic<int> writers_left{4};
  std::atomic<bool> decodes_differ{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int step = 0; step < kSteps; ++step) {
        append_tokens(cache, writers[static_cast<std::size_t>(w)],
                      tagged_tokens(w, step, 1 + step % 4));
      }
      --writers_left;
    });
  }
  threads.emplace_back([&] {
    while (writers_left > 0) {
      const Decoded again = decode(q.view(), cache, {reader});
      if (std::memcmp(again.context.data(), first.context.data(), first.context.nbytes()) != 0) {
        decodes_differ = true;
      }
    }
  });
  threads.emplace_back([&] {
    while (writers_left > 0) cache.drop(cache.fork(prompt));
  });
  for (std::thread& t : threads) t.join();

  EXPECT_FALSE(decodes_differ);
  expect_contents(cache, prompt, prompt_tokens);
  Model model{{prompt, prompt_tokens}, {reader, prompt_tokens}};
  for (int w = 0; w < 4; ++w) {
    std::vector<Token> tokens = prompt_tokens;
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<Token> more = tagged_tokens(w, step, 1 + step % 4);
      tokens.insert(tokens.end(), more.begin(), more.end());
    }
    expect_contents(cache, writers[static_cast<std::size_t>(w)], tokens);
    model[writers[static_cast<std::size_t>(w)]] = tokens;
  }
  expect_consistent(cache, model);
}

// Two threads on one sequence are serialised: concurrent appends each land whole (their
// tokens in some order, none torn or lost), and decodes of it see a consistent length.
TEST(KVCache, ThreadsOnOneSequenceAreSerialised) {
  KVCache cache({.heads_kv = kHeads,
                 .dim = kDim,
                 .dim_v = kDimV,
                 .page_size = 2,
                 .dtype = CacheDType::f32,
                 .max_blocks = 0});
  const KVCache::SequenceId seq = cache.add_sequence();
  append_tokens(cache, seq, tagged_tokens(0, 0, 1));
  std::atomic<bool> done{false};
  std::vector<std::thread> appenders;
  for (int w = 1; w <= 2; ++w) {
    appenders.emplace_back([&, w] {
      for (int step = 0; step < 400; ++step) append_tokens(cache, seq, tagged_tokens(w, step, 3));
    });
  }
  std::thread decoder([&] {
    Tensor q(DType::f32, {1, kHeads, 1, kDim});
    while (!done) decode(q.view(), cache, {seq});
  });
  for (std::thread& t : appenders) t.join();
  done = true;
  decoder.join();

  ASSERT_EQ(cache.length(seq), 1 + 2 * 400 * 3);
  const Tensor k = cache.keys(seq);
  std::multiset<std::vector<float>> got, want;
  for (Index i = 1; i < k.shape()[2]; i += 3) {
    std::vector<float> run;
    for (Index r = 0; r < 3; ++r) run.push_back(k.data_as<float>()[(i + r) * kDim]);
    got.insert(run);
  }
  for (int w = 1; w <= 2; ++w)
    for (int step = 0; step < 400; ++step) {
      std::vector<float> run;
      for (const Token& t : tagged_tokens(w, step, 3)) run.push_back(t[0]);
      want.insert(run);
    }
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace attn::testing
