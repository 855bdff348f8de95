// attn_paged_bench: attention over caller-owned pages (attn::paged_attention), timed
// against the other ways of doing the same work, interleaved repetition by repetition so
// that every figure of a row sees the same load:
// - a decode step through the caller's tables against attn::decode over a KVCache holding
//   the same tokens (the same kernel; the difference is what the entry point costs), and
//   through that cache's own pools (cache_pools);
// - a mixed batch (one prefill chunk beside one-token decodes) in one call, against the
//   same work as one call per sequence and as two calls (the prefill, then the decodes);
// - a prefill chunk alone, against attn::forward over the same tokens gathered from the
//   pages (what a caller could do instead, the gather included).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "cache/huge_pages.hpp"
#include "repetition.hpp"

namespace attn::bench {
namespace {

constexpr Index kHeadsKv = 8, kDim = 128, kPage = 16;

// Pools of one dtype and layout holding sequences of the given lengths, each in its own
// pages (in order), and their table; in memory with transparent huge pages, as the
// KVCache's (src/cache/huge_pages.hpp says why decode needs them).
struct Pools {
  CacheDType dtype;
  PageLayout layout;
  std::vector<std::uint16_t, cache::HugePageAllocator<std::uint16_t>> keys, values;
  std::vector<std::int32_t> table, lengths;
  Index max_pages = 0, pages = 0;

  Pools(CacheDType dtype_, PageLayout layout_, const std::vector<Index>& sequence_lengths)
      : dtype(dtype_), layout(layout_) {
    for (const Index length : sequence_lengths) {
      max_pages = std::max(max_pages, (length + kPage - 1) / kPage);
    }
    for (const Index length : sequence_lengths) {
      const Index used = (length + kPage - 1) / kPage;
      for (Index j = 0; j < max_pages; ++j)
        table.push_back(j < used ? static_cast<std::int32_t>(pages + j) : 0);
      pages += used;
      lengths.push_back(static_cast<std::int32_t>(length));
    }
    const auto elements = static_cast<std::size_t>(pages * kPage * kHeadsKv * kDim);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    keys.resize(elements);
    values.resize(elements);
    for (std::size_t i = 0; i < elements; ++i) {
      keys[i] = bits(normal(rng));
      values[i] = bits(normal(rng));
    }
  }
  std::uint16_t bits(float x) const {
    return dtype == CacheDType::bf16 ? to_bfloat16(x).bits : to_float16(x).bits;
  }
  PagePool pool(bool of_values) {
    return {
        (of_values ? values : keys).data(), dtype, layout, pages, kPage, kHeadsKv, kDim, nullptr};
  }
  // The element index of (page, slot, KV head, 0).
  std::size_t at(Index page, Index slot, Index head) const {
    const Index row = layout == PageLayout::token_major ? (page * kPage + slot) * kHeadsKv + head
                                                        : (page * kHeadsKv + head) * kPage + slot;
    return static_cast<std::size_t>(row * kDim);
  }
};

Tensor queries(Index rows, Index heads_q) {
  Tensor q(DType::f32, {1, rows, heads_q, kDim});
  for (Index i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = 0.01f * static_cast<float>(i % 97);
  return q;
}

// The medians of each way over `repetitions` interleaved repetitions, after one warm-up.
std::vector<double> medians(const std::vector<std::function<void()>>& ways, int repetitions) {
  for (const auto& way : ways) way();
  std::vector<std::vector<double>> seconds(ways.size());
  for (int r = 0; r < repetitions; ++r)
    for (std::size_t i = 0; i < ways.size(); ++i) seconds[i].push_back(time_repetition(ways[i]));
  std::vector<double> out;
  for (auto& s : seconds) {
    std::sort(s.begin(), s.end());
    out.push_back(s[s.size() / 2]);
  }
  return out;
}

// One decode step (one query per sequence) through the caller's tables, in each layout,
// against attn::decode over a KVCache of the same tokens.
void decode_step(const std::string& name, const std::vector<Index>& lengths, Index heads_q,
                 int threads, int repetitions) {
  Pools token_major(CacheDType::f16, PageLayout::token_major, lengths);
  Pools head_major(CacheDType::f16, PageLayout::head_major, lengths);
  // max_blocks: the cache's blocks in one slab, which cache_pools shows to paged_attention.
  Index cache_pages = 0;
  for (const Index length : lengths) cache_pages += (length + kPage - 1) / kPage;
  KVCache cache({.heads_kv = kHeadsKv,
                 .dim = kDim,
                 .dim_v = kDim,
                 .page_size = kPage,
                 .dtype = CacheDType::f16,
                 .max_blocks = cache_pages});
  std::vector<KVCache::SequenceId> ids;
  Index first_page = 0;
  for (const Index length : lengths) {
    ids.push_back(cache.add_sequence());
    // The same tokens in all three: the sequence's pages are [first_page, first_page + used).
    Tensor k(DType::f16, {1, kHeadsKv, length, kDim}), v(DType::f16, {1, kHeadsKv, length, kDim});
    for (Index t = 0; t < length; ++t)
      for (Index h = 0; h < kHeadsKv; ++h) {
        const Index page = first_page + t / kPage, slot = t % kPage;
        const std::size_t from = token_major.at(page, slot, h), to = head_major.at(page, slot, h);
        std::copy_n(token_major.keys.data() + from, kDim, head_major.keys.data() + to);
        std::copy_n(token_major.values.data() + from, kDim, head_major.values.data() + to);
        std::copy_n(token_major.keys.data() + from, kDim,
                    &k.data_as<float16>()[(h * length + t) * kDim].bits);
        std::copy_n(token_major.values.data() + from, kDim,
                    &v.data_as<float16>()[(h * length + t) * kDim].bits);
      }
    cache.append(ids.back(), k.view(), v.view());
    first_page += (length + kPage - 1) / kPage;
  }
  const auto sequences = static_cast<Index>(lengths.size());
  Tensor q_paged = queries(sequences, heads_q);
  Tensor q_decode(DType::f32, {sequences, heads_q, 1, kDim});
  std::copy_n(q_paged.data_as<float>(), q_paged.numel(), q_decode.data_as<float>());
  std::vector<std::int32_t> starts(static_cast<std::size_t>(sequences) + 1);
  for (std::size_t s = 0; s < starts.size(); ++s) starts[s] = static_cast<std::int32_t>(s);
  Options options;
  options.threads = threads;
  const PagedBatch batch{starts, token_major.lengths, token_major.table, token_major.max_pages};
  const auto paged = [&](Pools& pools) {
    return [&] {
      paged_attention(q_paged.view(), pools.pool(false), pools.pool(true), batch, options);
    };
  };
  // The cache's own pages through its block tables, as an engine holding a KVCache would.
  const CachePools own = cache_pools(cache);
  std::vector<std::int32_t> cache_table(
      static_cast<std::size_t>(sequences * token_major.max_pages));
  for (std::size_t s = 0; s < ids.size(); ++s) {
    const std::vector<std::int32_t> row = cache.block_table(ids[s]);
    std::copy(row.begin(), row.end(),
              cache_table.begin() + static_cast<std::ptrdiff_t>(s) * token_major.max_pages);
  }
  const PagedBatch cache_batch{starts, token_major.lengths, cache_table, token_major.max_pages};
  const std::vector<double> t = medians(
      {paged(token_major), paged(head_major), [&] { decode(q_decode.view(), cache, ids, options); },
       [&] { paged_attention(q_paged.view(), own.keys, own.values, cache_batch, options); }},
      repetitions);
  std::printf("%-12s %4lld %7d %12.3f %12.3f %10.3f %12.3f %9.3f %9.3f %9.3f\n", name.c_str(),
              static_cast<long long>(heads_q), threads, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3,
              t[3] * 1e3, t[0] / t[2], t[1] / t[2], t[3] / t[2]);
}

// One prefill chunk of `chunk` queries (the newest of its `context` keys) beside `decodes`
// one-token steps over `context` keys each: one call, one call per sequence, two calls.
void mixed_batch(CacheDType dtype, Index chunk, Index decodes, Index context, Index heads_q,
                 int threads, int repetitions) {
  const std::vector<Index> lengths(static_cast<std::size_t>(decodes) + 1, context);
  Pools pools(dtype, PageLayout::token_major, lengths);
  const PagePool keys = pools.pool(false), values = pools.pool(true);
  const Index total = chunk + decodes;
  Tensor q = queries(total, heads_q);
  std::vector<std::int32_t> starts{0};
  for (Index s = 0; s <= decodes; ++s) starts.push_back(static_cast<std::int32_t>(chunk + s));
  Options options;
  options.causal = true;
  options.threads = threads;
  const auto rows = [&](Index first, Index count) {
    TensorView part = q.view();
    part.data = q.data_as<float>() + first * heads_q * kDim;
    part.shape[1] = count;
    return part;
  };
  const auto table_of = [&](Index first, Index count) {
    return std::span<const std::int32_t>(pools.table)
        .subspan(static_cast<std::size_t>(first * pools.max_pages),
                 static_cast<std::size_t>(count * pools.max_pages));
  };
  const auto lengths_of = [&](Index first, Index count) {
    return std::span<const std::int32_t>(pools.lengths)
        .subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(count));
  };
  std::vector<std::int32_t> decode_starts;
  for (Index s = 0; s <= decodes; ++s) decode_starts.push_back(static_cast<std::int32_t>(s));
  const std::vector<std::int32_t> chunk_starts{0, static_cast<std::int32_t>(chunk)},
      one_start{0, 1};
  const std::vector<double> t = medians(
      {[&] {
         paged_attention(q.view(), keys, values,
                         {starts, pools.lengths, pools.table, pools.max_pages}, options);
       },
       [&] {
         paged_attention(rows(0, chunk), keys, values,
                         {chunk_starts, lengths_of(0, 1), table_of(0, 1), pools.max_pages},
                         options);
         for (Index s = 1; s <= decodes; ++s)
           paged_attention(rows(chunk + s - 1, 1), keys, values,
                           {one_start, lengths_of(s, 1), table_of(s, 1), pools.max_pages}, options);
       },
       [&] {
         paged_attention(rows(0, chunk), keys, values,
                         {chunk_starts, lengths_of(0, 1), table_of(0, 1), pools.max_pages},
                         options);
         paged_attention(
             rows(chunk, decodes), keys, values,
             {decode_starts, lengths_of(1, decodes), table_of(1, decodes), pools.max_pages},
             options);
       }},
      repetitions);
  std::printf("%-6s %5lld %7lld %7lld %4lld %7d %10.2f %10.2f %10.2f %8.2f %8.2f\n",
              cache_dtype_name(dtype), static_cast<long long>(chunk),
              static_cast<long long>(decodes), static_cast<long long>(context),
              static_cast<long long>(heads_q), threads, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3,
              t[1] / t[0], t[2] / t[0]);
}

void decode_steps(bool quick, int repetitions) {
  std::printf(
      "Decode step: Hkv=%lld d=%lld, fp16, page %lld, one query per sequence; "
      "attn::paged_attention\n"
      "over the caller's table and token-major or head-major pools, against attn::decode over\n"
      "a KVCache of the same tokens and paged_attention over that cache's own pools\n"
      "(cache_pools); medians of %d interleaved repetitions.\n",
      static_cast<long long>(kHeadsKv), static_cast<long long>(kDim), static_cast<long long>(kPage),
      repetitions);
  std::printf("%-12s %4s %7s %12s %12s %10s %12s %9s %9s %9s\n", "case", "Hq", "threads",
              "token-major", "head-major", "decode", "cache-pools", "tm/dec", "hm/dec", "cp/dec");
  std::vector<std::pair<std::string, std::vector<Index>>> steps{{"B1_Lk4096", {4096}}};
  if (!quick) steps.push_back({"B1_Lk32768", {32768}});
  std::vector<Index> mixed;
  for (Index i = 0; i < 16; ++i) mixed.push_back(1024 + (i * 11117) % (quick ? 7168 : 31744));
  steps.push_back({"B16_mixed", mixed});
  for (int threads = 1; threads <= 2; ++threads)
    for (const auto& [name, lengths] : steps)
      for (const Index heads_q : {8, 32}) decode_step(name, lengths, heads_q, threads, repetitions);
}

void mixed_batches(int repetitions) {
  std::printf(
      "\nMixed batch: one prefill chunk (its newest `chunk` of `context` keys) beside `decodes`\n"
      "one-token steps over `context` keys each, causal, Hkv=%lld d=%lld, page %lld; one call,\n"
      "one call per sequence, two calls (the chunk, then the decodes); ms and each over one.\n",
      static_cast<long long>(kHeadsKv), static_cast<long long>(kDim),
      static_cast<long long>(kPage));
  std::printf("%-6s %5s %7s %7s %4s %7s %10s %10s %10s %8s %8s\n", "dtype", "chunk", "decodes",
              "context", "Hq", "threads", "one ms", "per-seq ms", "two ms", "per-seq", "two");
  for (int threads = 1; threads <= 2; ++threads)
    for (const CacheDType dtype : {CacheDType::bf16, CacheDType::f16})
      mixed_batch(dtype, 512, 31, 4096, 32, threads, repetitions);
}

// A prefill chunk of `chunk` queries (the newest of `context` keys, causal) through the pages,
// against gathering the sequence's keys and values into contiguous tensors and attn::forward
// on them (bottom-right causal); q in the pools' dtype, as an engine holds it.
void prefill_chunk(CacheDType dtype, Index chunk, Index context, Index heads_q, int threads,
                   int repetitions) {
  Pools pools(dtype, PageLayout::token_major, {context});
  const DType q_dtype = dtype == CacheDType::bf16 ? DType::bf16 : DType::f16;
  Tensor q(q_dtype, {1, chunk, heads_q, kDim});
  auto* q_bits = static_cast<std::uint16_t*>(q.data());
  for (Index i = 0; i < q.numel(); ++i) q_bits[i] = pools.bits(0.01f * static_cast<float>(i % 97));
  const std::vector<std::int32_t> starts{0, static_cast<std::int32_t>(chunk)};
  Options options;
  options.causal = true;
  options.causal_align = CausalAlign::bottom_right;
  options.threads = threads;
  // forward's q: the same rows as [1, Hq, chunk, d], by strides.
  const TensorView q_by_head(q.view().data, q_dtype, {1, heads_q, chunk, kDim},
                             {chunk * heads_q * kDim, kDim, heads_q * kDim, 1});
  Tensor k(q_dtype, {1, kHeadsKv, context, kDim}), v(q_dtype, {1, kHeadsKv, context, kDim});
  const auto gather = [&](const auto& from, Tensor& to) {
    auto* out = static_cast<std::uint16_t*>(to.data());
    for (Index t = 0; t < context; ++t)
      for (Index h = 0; h < kHeadsKv; ++h) {
        const std::int32_t page = pools.table[static_cast<std::size_t>(t / kPage)];
        std::copy_n(from.data() + pools.at(page, t % kPage, h), kDim,
                    out + (h * context + t) * kDim);
      }
  };
  const std::vector<double> t =
      medians({[&] {
                 paged_attention(q.view(), pools.pool(false), pools.pool(true),
                                 {starts, pools.lengths, pools.table, pools.max_pages}, options);
               },
               [&] {
                 gather(pools.keys, k);
                 gather(pools.values, v);
                 forward(q_by_head, k.view(), v.view(), options);
               }},
              repetitions);
  double flops = 0.0;
  for (Index i = 0; i < chunk; ++i)
    flops += 4.0 * static_cast<double>(kDim * heads_q * (context - chunk + i + 1));
  std::printf("%-9s %5lld %7lld %4lld %7d %10.2f %10.2f %9.1f %9.1f %8.2f\n",
              cache_dtype_name(dtype), static_cast<long long>(chunk),
              static_cast<long long>(context), static_cast<long long>(heads_q), threads, t[0] * 1e3,
              t[1] * 1e3, flops / t[0] * 1e-9, flops / t[1] * 1e-9, t[0] / t[1]);
}

void prefill_chunks(int repetitions) {
  std::printf(
      "\nPrefill chunk: its newest `chunk` of `context` keys, causal, Hkv=%lld d=%lld, page %lld,\n"
      "q in the pools' dtype; paged_attention over the pages against attn::forward over the\n"
      "same keys and values gathered into contiguous tensors (the gather timed with it); ms,\n"
      "GFLOP/s and paged over forward.\n",
      static_cast<long long>(kHeadsKv), static_cast<long long>(kDim),
      static_cast<long long>(kPage));
  std::printf("%-9s %5s %7s %4s %7s %10s %10s %9s %9s %8s\n", "dtype", "chunk", "context", "Hq",
              "threads", "paged ms", "forward ms", "paged GF", "fwd GF", "paged/fw");
  for (int threads = 1; threads <= 2; ++threads)
    for (const CacheDType dtype : {CacheDType::bf16, CacheDType::f16})
      prefill_chunk(dtype, 512, 4096, 32, threads, repetitions);
}

}  // namespace
}  // namespace attn::bench

int main(int argc, char** argv) {
  using namespace attn;
  using namespace attn::bench;
  CLI::App app{"Attention over caller-owned pages against the other ways of the same work"};
  bool quick = false, no_decode = false, no_mixed = false, no_prefill = false;
  int repetitions = 5;
  app.add_flag("--quick", quick, "leave out the 32k-token decode cases");
  app.add_flag("--no-decode", no_decode, "leave out the decode steps");
  app.add_flag("--no-mixed", no_mixed, "leave out the mixed batches");
  app.add_flag("--no-prefill", no_prefill, "leave out the prefill chunk against forward");
  app.add_option("--repetitions", repetitions, "timed repetitions per case (median kept)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (!no_decode) decode_steps(quick, repetitions);
  if (!no_mixed) mixed_batches(repetitions);
  if (!no_prefill) prefill_chunks(repetitions);
  return 0;
}
