// A developer's quick timing of the fast forward kernel (not a test, not the bench suite):
// GFLOP/s (4 Lq Lk d per head, halved for causal) next to an FMA-peak probe run in the
// same process, medians of several runs.
//   build/release/tests/timing/kernel_timing [threads] [seq_len]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attn/attn.hpp"

namespace {

double seconds_of(auto&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median_seconds(auto&& fn, int runs) {
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) times.push_back(seconds_of(fn));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// 12 independent FMA chains (4-cycle latency x 2 pipes needs at least 8), one core.
// AVX2: on Zen 4, AVX-512 FMAs run as two 256-bit halves, so the peak is the same.
__attribute__((target("avx2,fma"), noinline)) float fma_probe(long iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float sum = 0.0f;
  for (int i = 0; i < 12; ++i) sum += _mm256_cvtss_f32(acc[i]);
  return sum;
}

// The probe on every thread at once, so a busy core shows in the peak too.
double fma_peak_gflops(int threads) {
  constexpr long kIterations = 50'000'000;
  const double t = median_seconds(
      [&] {
        float sink = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += fma_probe(kIterations);
        if (sink == 42.0f) std::printf("\n");
      },
      5);
  return 12.0 * 8 * 2 * kIterations * threads / t * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const attn::Index len = argc > 2 ? std::atoll(argv[2]) : 2048, heads = 8;
  const double peak = fma_peak_gflops(threads);
  std::printf("FMA peak (AVX2 probe, %d thread(s)): %.1f GFLOP/s\n", threads, peak);
  for (const attn::Index dim : {64, 128}) {
    for (const attn::Index len_q : {len, attn::Index{1}}) {
      attn::Tensor q(attn::DType::f32, {1, heads, len_q, dim}), k(q.dtype(), {1, heads, len, dim}),
          v(q.dtype(), k.shape()), out(q.dtype(), q.shape());
      for (attn::Tensor* t : {&q, &k, &v}) {
        float* data = t->data_as<float>();
        for (attn::Index i = 0; i < t->numel(); ++i) {
          data[i] = static_cast<float>((i * 7919) % 1013) / 1013.0f - 0.5f;
        }
      }
      for (const bool causal : {false, true}) {
        if (causal && len_q == 1) continue;
        attn::Options options;
        options.causal = causal;
        options.threads = threads;
        options.backend = attn::Backend::fast;
        const auto run = [&] {
          attn::forward_into(q.view(), k.view(), v.view(), options, {out.mutable_view(), {}, {}});
        };
        run();
        const double t = median_seconds(run, 7);
        const double flops =
            4.0 * static_cast<double>(len_q * len * dim * heads) * (causal ? 0.5 : 1.0);
        std::printf("d=%3lld Lq=%-5lld %-10s %8.2f ms %7.1f GFLOP/s  %5.1f%% of peak\n",
                    static_cast<long long>(dim), static_cast<long long>(len_q),
                    causal ? "causal" : "non-causal", t * 1e3, flops / t * 1e-9,
                    100.0 * flops / t * 1e-9 / peak);
      }
    }
  }
}
