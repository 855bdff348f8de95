// attn_decode_bench: decode throughput as bytes of K/V read per second, against this
// machine's memory bandwidth measured in the same run (memory_bandwidth.hpp). Decoding
// reads every cached key and value once per step, so bandwidth is its ceiling.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "memory_bandwidth.hpp"
#include "repetition.hpp"

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

// A cache storage format, the bytes a step reads per key (or value) row of one head (its
// elements and, for int8 and int4, the row's float32 scales and offsets) and the dtype of the
// queries: a
// model's own dtype for a 16-bit cache, as a serving engine passes them, else float32.
struct Format {
  CacheDType dtype;
  Index row_bytes;
  DType queries;
  Index group = 0;          // int8, int4: elements per scale (0: one per row)
  bool zero_point = false;  // int8, int4: an offset beside each scale
  // The values' format where it is not the keys' ("keys/values"): its dtype and row bytes.
  std::optional<CacheDType> value_dtype = std::nullopt;
  Index value_row_bytes = 0;

  Index bytes_per_token_and_head() const {
    return row_bytes + (value_dtype ? value_row_bytes : row_bytes);
  }
};

Format one_format(const std::string& name) {
  if (name == "f16") return {CacheDType::f16, kDim * 2, DType::f16};
  if (name == "bf16") return {CacheDType::bf16, kDim * 2, DType::bf16};
  if (name == "f32") return {CacheDType::f32, kDim * 4, DType::f32};
  if (name == "int8") return {CacheDType::int8, kDim + 4, DType::f32};
  if (name == "int8_g32") return {CacheDType::int8, kDim + 4 * kDim / 32, DType::f32, 32};
  if (name == "int4_g32") return {CacheDType::int4, kDim / 2 + 4 * kDim / 32, DType::f32, 32};
  if (name == "int8_zp") return {CacheDType::int8, kDim + 8, DType::f32, 0, true};
  if (name == "int4_g32_zp") {
    return {CacheDType::int4, kDim / 2 + 8 * kDim / 32, DType::f32, 32, true};
  }
  if (name == "fp8_e4m3") return {CacheDType::fp8_e4m3, kDim, DType::f32};
  if (name == "fp8_e5m2") return {CacheDType::fp8_e5m2, kDim, DType::f32};
  throw std::invalid_argument(
      "--formats: expected f16, bf16, f32, int8, int8_g32, int4_g32, int8_zp, int4_g32_zp, "
      "fp8_e4m3 or fp8_e5m2 (or keys/values: two of them), given " +
      name);
}

bool has_codes(CacheDType dtype) {
  return dtype == CacheDType::int8 || dtype == CacheDType::int4;
}

// A format, or "keys/values" two of them (a cache with dtype_v): the queries of the keys'
// format, group and zero_point of the side with codes (both sides with codes agreeing, as a
// KVCacheConfig holds one of each).
Format format_of(const std::string& name) {
  const std::size_t slash = name.find('/');
  if (slash == std::string::npos) return one_format(name);
  Format keys = one_format(name.substr(0, slash));
  const Format values = one_format(name.substr(slash + 1));
  if (has_codes(keys.dtype) && has_codes(values.dtype) &&
      (keys.group != values.group || keys.zero_point != values.zero_point)) {
    throw std::invalid_argument(
        "--formats: expected keys and values of one group and zero "
        "point (one KVCacheConfig), given " +
        name);
  }
  if (!has_codes(keys.dtype)) {
    keys.group = values.group;
    keys.zero_point = values.zero_point;
  }
  keys.value_dtype = values.dtype;
  keys.value_row_bytes = values.row_bytes;
  return keys;
}

// Random keys and values, appended in chunks of one repeated random block (the values do
// not matter to the time, only the bytes).
KVCache filled_cache(const std::vector<Index>& lengths, const Format& format,
                     std::vector<KVCache::SequenceId>& ids) {
  KVCache cache({.heads_kv = kHeadsKv,
                 .dim = kDim,
                 .dim_v = kDim,
                 .page_size = kPage,
                 .dtype = format.dtype,
                 .dtype_v = format.value_dtype,
                 .group = format.group,
                 .zero_point = format.zero_point,
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

// One decode step's queries for a case at one query-head count, over one format's cache.
struct StepQueries {
  std::string format;
  const KVCache* cache = nullptr;
  double bytes = 0.0;  // K/V bytes a step reads
  Index heads_q = 0;
  Tensor q;  // [sequences, heads_q, 1, kDim]
};

}  // namespace
}  // namespace attn::bench

int main(int argc, char** argv) {
  using namespace attn;
  using namespace attn::bench;
  CLI::App app{"Decode throughput (bytes of K/V read per second) against memory bandwidth"};
  bool quick = false;
  int repetitions = 5;
  std::vector<std::string> format_names{"f16"};
  std::vector<std::string> case_names;
  std::vector<Index> heads_q_choices(std::begin(kHeadsQChoices), std::end(kHeadsQChoices));
  app.add_flag("--quick", quick, "leave out Lk = 262144");
  app.add_option("--cases", case_names, "only these cases (B1_Lk4096, B1_Lk32768, ...)")
      ->delimiter(',');
  app.add_option("--heads-q", heads_q_choices, "query heads per step (8, 32 by default)")
      ->delimiter(',')
      ->check(CLI::Range(Index{1}, Index{1024}));
  app.add_option("--formats", format_names,
                 "cache formats, timed interleaved in each repetition (f16, bf16, f32, int8, "
                 "int8_g32 and int4_g32: a scale per 32 elements, int8_zp and int4_g32_zp: "
                 "with zero points, fp8_e4m3, fp8_e5m2; keys/values: two of them in one "
                 "cache, as int8_g32/int4_g32)")
      ->delimiter(',');
  app.add_option("--repetitions", repetitions, "timed repetitions per case (median kept)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  for (const Index heads_q : heads_q_choices) {
    if (heads_q % kHeadsKv != 0) {
      std::fprintf(stderr, "--heads-q: expected multiples of %lld (the KV heads), given %lld\n",
                   static_cast<long long>(kHeadsKv), static_cast<long long>(heads_q));
      return 2;
    }
  }
  std::vector<Format> formats;
  try {
    for (const std::string& name : format_names) formats.push_back(format_of(name));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }

  std::vector<DecodeCase> cases;
  for (const Index length : {4096, 32768, 262144}) {
    if (quick && length > 32768) continue;
    cases.push_back({"B1_Lk" + std::to_string(length), {length}});
  }
  // 16 sequences of mixed lengths, 1k to 32k tokens, about 270k in all.
  DecodeCase batch{"B16_mixed", {}};
  for (Index i = 0; i < 16; ++i) batch.lengths.push_back(1024 + (i * 11117) % 31744);
  cases.push_back(batch);
  if (!case_names.empty()) {
    std::erase_if(cases, [&](const DecodeCase& c) {
      return std::find(case_names.begin(), case_names.end(), c.name) == case_names.end();
    });
  }

  constexpr int kMaxThreads = 2;
  MemoryBandwidthProbe probe(kMaxThreads);
  std::printf(
      "decode: Hkv=%lld d=%lld, page %lld, one query per sequence.\n"
      "Each repetition: one bandwidth probe trial (read, copy, triad over 3 arrays of 256 MiB),\n"
      "then one decode repetition per Hq, so the probe and decode see the same load.\n"
      "GB/s: K/V bytes per step / the fastest repetition's time per step (best of N, as the\n"
      "probe); stream: the probe's best copy or triad at the same threads (the figure decode\n"
      "is held against); read: its best read; x f16: f16's best time per step over this\n"
      "format's at the same Hq (issue 39's int8 1.8x and int4 3x), where f16 is timed too.\n",
      static_cast<long long>(kHeadsKv), static_cast<long long>(kDim),
      static_cast<long long>(kPage));
  std::printf("%-12s %-11s %4s %7s %10s %10s %10s %8s %8s %9s %8s %8s %6s\n", "case", "format",
              "Hq", "threads", "median ms", "best ms", "K/V MB", "GB/s", "stream", "of stream",
              "read", "of read", "x f16");
  for (const DecodeCase& c : cases) {
    std::vector<KVCache::SequenceId> ids;  // the same ids in every format's cache
    std::vector<KVCache> caches;
    caches.reserve(formats.size());
    for (const Format& f : formats) {
      ids.clear();
      caches.push_back(filled_cache(c.lengths, f, ids));
    }
    Index tokens = 0;
    for (const Index length : c.lengths) tokens += length;
    const auto sequences = static_cast<Index>(c.lengths.size());
    std::vector<StepQueries> steps;
    for (std::size_t f = 0; f < formats.size(); ++f) {
      for (const Index heads_q : heads_q_choices) {
        Tensor q(formats[f].queries, {sequences, heads_q, 1, kDim});
        for (Index i = 0; i < q.numel(); ++i) {
          const float value = 0.01f * static_cast<float>(i % 97);
          if (q.dtype() == DType::f16) q.data_as<float16>()[i] = to_float16(value);
          if (q.dtype() == DType::bf16) q.data_as<bfloat16>()[i] = to_bfloat16(value);
          if (q.dtype() == DType::f32) q.data_as<float>()[i] = value;
        }
        const double bytes =
            static_cast<double>(tokens * kHeadsKv * formats[f].bytes_per_token_and_head());
        steps.push_back({format_names[f], &caches[f], bytes, heads_q, std::move(q)});
      }
    }
    for (int threads = 1; threads <= kMaxThreads; ++threads) {
      Options options;
      options.threads = threads;
      for (const StepQueries& step : steps) {
        decode(step.q.view(), *step.cache, ids, options);  // warm-up: faults, thread start-up
      }
      // seconds[i][r]: the mean time of one step of steps[i] in repetition r.
      std::vector<std::vector<double>> seconds(steps.size());
      MemoryBandwidth bandwidth;
      for (int r = 0; r < repetitions; ++r) {
        probe.trial(threads, bandwidth);
        for (std::size_t i = 0; i < steps.size(); ++i)
          seconds[i].push_back(
              time_repetition([&] { decode(steps[i].q.view(), *steps[i].cache, ids, options); }));
      }
      for (auto& times : seconds) std::sort(times.begin(), times.end());
      // The f16 step of the same Hq's best time, or 0 where f16 is not timed.
      const auto f16_best = [&](Index heads_q) {
        for (std::size_t i = 0; i < steps.size(); ++i) {
          if (steps[i].format == "f16" && steps[i].heads_q == heads_q) return seconds[i].front();
        }
        return 0.0;
      };
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const double median = seconds[i][seconds[i].size() / 2], best = seconds[i].front();
        const double bytes = steps[i].bytes, gbps = bytes / best / 1e9;
        std::printf(
            "%-12s %-11s %4lld %7d %10.3f %10.3f %10.1f %8.1f %8.1f %8.0f%% %8.1f %7.0f%% %6.2f\n",
            c.name.c_str(), steps[i].format.c_str(), static_cast<long long>(steps[i].heads_q),
            threads, median * 1e3, best * 1e3, bytes / 1e6, gbps, bandwidth.stream(),
            100.0 * gbps / bandwidth.stream(), bandwidth.read, 100.0 * gbps / bandwidth.read,
            f16_best(steps[i].heads_q) / best);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
