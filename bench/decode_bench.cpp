// attn_decode_bench: decode throughput as bytes of K/V read per second, against this
// machine's memory bandwidth measured in the same run (memory_bandwidth.hpp). Decoding
// reads every cached key and value once per step, so bandwidth is its ceiling.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "memory_bandwidth.hpp"

namespace attn::bench {
namespace {

constexpr Index kHeadsKv = 8, kDim = 128, kPage = 16;
// Query heads: 8 is plain multi-head attention (one query row per KV head, the least work
// per byte read); 32 is Llama-3-8B's grouped-query layout (four rows share each K/V row,
// so four times the arithmetic per byte).
constexpr Index kHeadsQChoices[] = {8, 32};

struct DecodeCase {
  std::string name;
  std::vector<Index> lengths;  // one sequence each
};

// Random fp16 keys and values, appended in chunks of one repeated random block (the
// values do not matter to the time, only the bytes).
KVCache filled_cache(const std::vector<Index>& lengths, std::vector<KVCache::SequenceId>& ids) {
  KVCache cache({.heads_kv = kHeadsKv,
                 .dim = kDim,
                 .dim_v = kDim,
                 .page_size = kPage,
                 .dtype = CacheDType::f16,
                 .max_blocks = 0});
  constexpr Index kChunk = 4096;
  Tensor chunk(DType::f16, {1, kHeadsKv, kChunk, kDim});
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Index i = 0; i < chunk.numel(); ++i) chunk.data_as<float16>()[i] = to_float16(normal(rng));
  for (const Index length : lengths) {
    ids.push_back(cache.add_sequence());
    for (Index done = 0; done < length; done += kChunk) {
      TensorView part = chunk.view();
      part.shape[2] = std::min(kChunk, length - done);
      cache.append(ids.back(), part, part);
    }
  }
  return cache;
}

struct Timing {
  double median = 0.0;  // seconds per decode step: median over repetitions
  double best = 0.0;    // the fastest repetition, the statistic the bandwidth probe keeps
};

Timing time_decode(const KVCache& cache, const std::vector<KVCache::SequenceId>& ids,
                   const TensorView& q, int threads, int repetitions) {
  Options options;
  options.threads = threads;
  decode(q, cache, ids, options);  // warm-up: page faults, thread start-up
  std::vector<double> means;
  for (int r = 0; r < repetitions; ++r) {
    int calls = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0.0;
    do {
      decode(q, cache, ids, options);
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < 0.2);
    means.push_back(elapsed / calls);
  }
  std::sort(means.begin(), means.end());
  return {means[means.size() / 2], means.front()};
}

}  // namespace
}  // namespace attn::bench

int main(int argc, char** argv) {
  using namespace attn;
  using namespace attn::bench;
  CLI::App app{"Decode throughput (bytes of K/V read per second) against memory bandwidth"};
  bool quick = false;
  int repetitions = 5;
  app.add_flag("--quick", quick, "leave out Lk = 262144");
  app.add_option("--repetitions", repetitions, "timed repetitions per case (median kept)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::vector<DecodeCase> cases;
  for (const Index length : {4096, 32768, 262144}) {
    if (quick && length > 32768) continue;
    cases.push_back({"B1_Lk" + std::to_string(length), {length}});
  }
  // 16 sequences of mixed lengths, 1k to 32k tokens, about 270k in all.
  DecodeCase batch{"B16_mixed", {}};
  for (Index i = 0; i < 16; ++i) batch.lengths.push_back(1024 + (i * 11117) % 31744);
  cases.push_back(batch);

  std::printf("memory bandwidth probe (3 arrays of 256 MiB, best of 5):\n");
  std::vector<MemoryBandwidth> bandwidth;
  for (const int threads : {1, 2}) {
    bandwidth.push_back(measure_memory_bandwidth(threads));
    const MemoryBandwidth& b = bandwidth.back();
    std::printf("  %d thread%s: read %.1f GB/s, copy %.1f GB/s, triad %.1f GB/s\n", threads,
                threads > 1 ? "s" : " ", b.read, b.copy, b.triad);
  }
  std::printf(
      "\ndecode: Hkv=%lld d=%lld, fp16 cache, page %lld, one query per sequence.\nGB/s: K/V "
      "bytes per step / the fastest repetition's time per step (best of N, as the probe); "
      "fraction: GB/s / the best probe figure at the same threads\n",
      static_cast<long long>(kHeadsKv), static_cast<long long>(kDim),
      static_cast<long long>(kPage));
  std::printf("%-12s %4s %7s %10s %10s %10s %8s %9s\n", "case", "Hq", "threads", "median ms",
              "best ms", "K/V MB", "GB/s", "fraction");
  for (const DecodeCase& c : cases) {
    std::vector<KVCache::SequenceId> ids;
    const KVCache cache = filled_cache(c.lengths, ids);
    Index tokens = 0;
    for (const Index length : c.lengths) tokens += length;
    const double bytes = static_cast<double>(tokens * kHeadsKv * 2 * kDim) * 2.0;
    const auto sequences = static_cast<Index>(c.lengths.size());
    for (const Index heads_q : kHeadsQChoices) {
      Tensor q(DType::f32, {sequences, heads_q, 1, kDim});
      for (Index i = 0; i < q.numel(); ++i)
        q.data_as<float>()[i] = 0.01f * static_cast<float>(i % 97);
      for (const int threads : {1, 2}) {
        const Timing t = time_decode(cache, ids, q.view(), threads, repetitions);
        const double gbps = bytes / t.best / 1e9;
        const double probe = bandwidth[static_cast<std::size_t>(threads - 1)].best();
        std::printf("%-12s %4lld %7d %10.3f %10.3f %10.1f %8.1f %8.0f%%\n", c.name.c_str(),
                    static_cast<long long>(heads_q), threads, t.median * 1e3, t.best * 1e3,
                    bytes / 1e6, gbps, 100.0 * gbps / probe);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
