// Peak probes: each thread keeps kChains independent accumulators and updates each with one
// fused multiply-add (fp32 FMA, or the bf16 dot product vdpbf16ps) per round. FMA latency
// is about 4 cycles on current x86 and Arm cores, with two FMA pipes, so 8 chains in flight
// saturate both; 12 leave headroom and still fit the 16 AVX2 registers with the constants.
#include "fma_peak.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <optional>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu/amx/tiles.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "fma_peak.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Once, although foreach_target.h includes this file again for every target.
#ifndef ATTN_BENCH_FMA_WORK_DEFINED
#define ATTN_BENCH_FMA_WORK_DEFINED
namespace attn::bench {

// What one thread's probe did: the FLOPs, a value that depends on every chain (so the
// compiler keeps them), and the SIMD target that ran.
struct FmaWork {
  double flops = 0.0;
  float checksum = 0.0f;
  std::int64_t target = 0;
};

constexpr int kChains = 12;

}  // namespace attn::bench
#endif  // ATTN_BENCH_FMA_WORK_DEFINED

HWY_BEFORE_NAMESPACE();
namespace attn::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// rounds: FMAs per chain. a <- a * 0.999999 + 1e-7 converges, so values stay finite.
void RunFmaChains(std::int64_t rounds, FmaWork* work) {
  const hn::ScalableTag<float> d;
  const auto multiplier = hn::Set(d, 0.999999f);
  const auto addend = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 0.10f), a1 = hn::Set(d, 0.11f), a2 = hn::Set(d, 0.12f);
  auto a3 = hn::Set(d, 0.13f), a4 = hn::Set(d, 0.14f), a5 = hn::Set(d, 0.15f);
  auto a6 = hn::Set(d, 0.16f), a7 = hn::Set(d, 0.17f), a8 = hn::Set(d, 0.18f);
  auto a9 = hn::Set(d, 0.19f), a10 = hn::Set(d, 0.20f), a11 = hn::Set(d, 0.21f);
  for (std::int64_t r = 0; r < rounds; ++r) {
    a0 = hn::MulAdd(a0, multiplier, addend);
    a1 = hn::MulAdd(a1, multiplier, addend);
    a2 = hn::MulAdd(a2, multiplier, addend);
    a3 = hn::MulAdd(a3, multiplier, addend);
    a4 = hn::MulAdd(a4, multiplier, addend);
    a5 = hn::MulAdd(a5, multiplier, addend);
    a6 = hn::MulAdd(a6, multiplier, addend);
    a7 = hn::MulAdd(a7, multiplier, addend);
    a8 = hn::MulAdd(a8, multiplier, addend);
    a9 = hn::MulAdd(a9, multiplier, addend);
    a10 = hn::MulAdd(a10, multiplier, addend);
    a11 = hn::MulAdd(a11, multiplier, addend);
  }
  const auto sum = hn::Add(
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7))),
      hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  work->checksum = hn::GetLane(hn::SumOfLanes(d, sum));
  work->flops = 2.0 * kChains * static_cast<double>(hn::Lanes(d)) * static_cast<double>(rounds);
  work->target = HWY_TARGET;
}

}  // namespace attn::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::bench {
HWY_EXPORT(RunFmaChains);

namespace {

using Clock = std::chrono::steady_clock;
using Chains = void (*)(std::int64_t rounds, FmaWork* work);

constexpr int kTrials = 7;
constexpr double kTrialSeconds = 0.03;

void run_fma_chains(std::int64_t rounds, FmaWork* work) {
  HWY_DYNAMIC_DISPATCH(RunFmaChains)(rounds, work);
}

#if defined(__x86_64__)
// The bf16 dot product of AVX512-BF16: each vdpbf16ps adds two bf16 products into each of
// 16 fp32 lanes (4 FLOPs a lane). a <- a + 2 * 0.001^2 per round stays finite.
__attribute__((target("avx512f,avx512bf16"))) void run_bf16_dot_chains(std::int64_t rounds,
                                                                       FmaWork* work) {
  const auto factor = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3a83));  // 0.001 in bf16
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.1f * static_cast<float>(c));
  for (std::int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], factor, factor);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  // Stored and summed here: GCC 12 warns inside its own _mm512_reduce_add_ps.
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  work->checksum = 0.0f;
  for (const float lane : lanes) work->checksum += lane;
  work->flops = 4.0 * 16.0 * kChains * static_cast<double>(rounds);
}

// AMX: each TDPBF16PS multiplies 16 x 32 bf16 by 32 x 16 bf16 into 16 x 16 fp32 (16384 FLOPs).
// Six accumulator tiles against one A and one B tile; 0.001 in every element adds 3.2e-5 a
// round, so the sums stay finite.
void run_amx_chains(std::int64_t rounds, FmaWork* work) {
  using cpu::HardwareTiles;
  static constexpr cpu::TileConfig kConfig = cpu::full_tiles();
  alignas(64) std::uint16_t operand[cpu::kTileRows * cpu::kTileBytesPerRow / 2];
  std::fill(std::begin(operand), std::end(operand), std::uint16_t{0x3a83});
  HardwareTiles::configure(kConfig);
  HardwareTiles::zero<0>();
  HardwareTiles::zero<1>();
  HardwareTiles::zero<2>();
  HardwareTiles::zero<3>();
  HardwareTiles::zero<4>();
  HardwareTiles::zero<5>();
  HardwareTiles::load<6>(operand, cpu::kTileBytesPerRow);
  HardwareTiles::load<7>(operand, cpu::kTileBytesPerRow);
  for (std::int64_t r = 0; r < rounds; ++r) {
    HardwareTiles::dot_bf16<0, 6, 7>();
    HardwareTiles::dot_bf16<1, 6, 7>();
    HardwareTiles::dot_bf16<2, 6, 7>();
    HardwareTiles::dot_bf16<3, 6, 7>();
    HardwareTiles::dot_bf16<4, 6, 7>();
    HardwareTiles::dot_bf16<5, 6, 7>();
  }
  alignas(64) float sums[cpu::kTileRows * cpu::kTileBytesPerRow / 4];
  HardwareTiles::store<5>(sums, cpu::kTileBytesPerRow);
  HardwareTiles::release();
  work->checksum = sums[0];
  work->flops = 2.0 * 16 * 16 * 32 * 6 * static_cast<double>(rounds);
}
#endif

// All threads start together after a barrier; the wall time covers the slowest one.
// Returns GFLOP/s over all threads and the work record of thread 0.
double timed_trial(Chains chains, int threads, std::int64_t rounds, FmaWork& first) {
  std::vector<FmaWork> work(static_cast<std::size_t>(threads));
  Clock::time_point start, stop;
#pragma omp parallel num_threads(threads)
  {
#pragma omp barrier
#pragma omp master
    start = Clock::now();
    chains(rounds, &work[static_cast<std::size_t>(omp_get_thread_num())]);
#pragma omp barrier
#pragma omp master
    stop = Clock::now();
  }
  double flops = 0.0;
  for (const FmaWork& w : work) flops += w.flops;
  first = work[0];
  return flops / std::chrono::duration<double>(stop - start).count() * 1e-9;
}

// Rounds per chain that make one trial last about kTrialSeconds whatever the CPU, from a
// short run on one thread (a busy sibling core would make trials too short).
std::int64_t calibrated_rounds(Chains chains, FmaWork& first) {
  const std::int64_t calibration_rounds = 100000;
  const double calibration_gflops = timed_trial(chains, 1, calibration_rounds, first);
  const double flops_per_round = first.flops / static_cast<double>(calibration_rounds);
  return std::max<std::int64_t>(
      calibration_rounds,
      static_cast<std::int64_t>(kTrialSeconds * calibration_gflops * 1e9 / flops_per_round));
}

// The best of kTrials trials of `chains` on `threads` threads.
double best_gflops(Chains chains, int threads, FmaWork& first) {
  const std::int64_t rounds = calibrated_rounds(chains, first);
  double best = 0.0;
  for (int trial = 0; trial < kTrials; ++trial) {
    best = std::max(best, timed_trial(chains, threads, rounds, first));
  }
  return best;
}

}  // namespace

FmaPeak measure_fma_peak(int threads) {
  FmaWork first;
  FmaPeak peak;
  peak.threads = threads;
  peak.gflops = best_gflops(run_fma_chains, threads, first);
  peak.target = hwy::TargetName(first.target);
  return peak;
}

double fma_probe_gflops(int threads) {
  FmaWork first;
  static const std::int64_t rounds = calibrated_rounds(run_fma_chains, first);
  return timed_trial(run_fma_chains, threads, rounds, first);
}

std::optional<FmaPeak> measure_bf16_dot_peak(int threads) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bf16")) {
    FmaWork first;
    return FmaPeak{threads, best_gflops(run_bf16_dot_chains, threads, first), "AVX512-BF16"};
  }
#endif
  (void)threads;
  return std::nullopt;
}

std::optional<FmaPeak> measure_amx_peak(int threads) {
#if defined(__x86_64__)
  if (cpu::has_amx()) {
    FmaWork first;
    return FmaPeak{threads, best_gflops(run_amx_chains, threads, first), "AMX-BF16"};
  }
#endif
  (void)threads;
  return std::nullopt;
}

}  // namespace attn::bench
#endif  // HWY_ONCE
