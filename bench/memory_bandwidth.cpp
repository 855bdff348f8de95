#include "memory_bandwidth.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

namespace attn::bench {

double MemoryBandwidth::best() const {
  return std::max({read, copy, triad});
}

namespace {

template <class Fn>
double best_seconds(int trials, Fn&& fn) {
  double best = 1e30;
  for (int t = 0; t < trials; ++t) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

MemoryBandwidth measure_memory_bandwidth(int threads, double bytes_per_array) {
  const auto n = static_cast<std::int64_t>(bytes_per_array / sizeof(float));
  const std::unique_ptr<float[]> a(new float[static_cast<std::size_t>(n)]);
  const std::unique_ptr<float[]> b(new float[static_cast<std::size_t>(n)]);
  const std::unique_ptr<float[]> c(new float[static_cast<std::size_t>(n)]);
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
  // First touch by the same static schedule the probes use, so pages sit near their thread.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t i = 0; i < n; ++i) {
    pa[i] = 1.0f;
    pb[i] = 2.0f;
    pc[i] = 0.5f;
  }
  constexpr int kTrials = 5;
  MemoryBandwidth result;
  result.threads = threads;
  volatile float observed = 0.0f;  // keeps the read loop from being optimised away
  // The read probe sums the bits as integers: integer addition is associative, so the
  // compiler vectorises it, where a float sum would run at one add latency per element.
  const auto* bits = reinterpret_cast<const std::uint32_t*>(pa);
  const double read = best_seconds(kTrials, [&] {
    std::uint32_t sum = 0;
#pragma omp parallel for simd schedule(static) num_threads(threads) reduction(+ : sum)
    for (std::int64_t i = 0; i < n; ++i) sum += bits[i];
    observed = static_cast<float>(sum);
  });
  const double copy = best_seconds(kTrials, [&] {
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (std::int64_t i = 0; i < n; ++i) pa[i] = pb[i];
  });
  const double triad = best_seconds(kTrials, [&] {
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (std::int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0f * pc[i];
  });
  const double bytes = static_cast<double>(n) * sizeof(float);
  result.read = bytes / read / 1e9;
  result.copy = 2 * bytes / copy / 1e9;
  result.triad = 3 * bytes / triad / 1e9;
  return result;
}

}  // namespace attn::bench
