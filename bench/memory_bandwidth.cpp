// The bandwidth probe's loops, SIMD through Highway: written in plain C++ under OpenMP,
// GCC left all three scalar (one element per instruction), which bound the read loop at
// about 4 bytes per cycle, half of what one core reads from memory here.
#include "memory_bandwidth.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cache/huge_pages.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memory_bandwidth.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The sum of a[0 .. count), in four independent accumulators so that add latency does not
// bound it.
float ReadChunk(const float* HWY_RESTRICT a, std::int64_t count) {
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  std::int64_t i = 0;
  for (; i + 4 * lanes <= count; i += 4 * lanes) {
    s0 = hn::Add(s0, hn::LoadU(d, a + i));
    s1 = hn::Add(s1, hn::LoadU(d, a + i + lanes));
    s2 = hn::Add(s2, hn::LoadU(d, a + i + 2 * lanes));
    s3 = hn::Add(s3, hn::LoadU(d, a + i + 3 * lanes));
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < count; ++i) sum += a[i];
  return sum;
}

void CopyChunk(float* HWY_RESTRICT a, const float* HWY_RESTRICT b, std::int64_t count) {
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= count; i += lanes) hn::StoreU(hn::LoadU(d, b + i), d, a + i);
  for (; i < count; ++i) a[i] = b[i];
}

void TriadChunk(float* HWY_RESTRICT a, const float* HWY_RESTRICT b, const float* HWY_RESTRICT c,
                float scalar, std::int64_t count) {
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, scalar);
  std::int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    hn::StoreU(hn::MulAdd(s, hn::LoadU(d, c + i), hn::LoadU(d, b + i)), d, a + i);
  }
  for (; i < count; ++i) a[i] = b[i] + scalar * c[i];
}

}  // namespace attn::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::bench {
HWY_EXPORT(ReadChunk);
HWY_EXPORT(CopyChunk);
HWY_EXPORT(TriadChunk);

namespace {

// One thread's part [begin, end) of the arrays.
struct Share {
  std::int64_t begin = 0, end = 0;
};

// Thread `thread`'s share of `elements`, cut at whole cache lines.
Share share_of(std::int64_t elements, int threads, int thread) {
  constexpr std::int64_t kLine = 16;  // floats per 64-byte line
  const auto cut = [&](int t) {
    return t == threads ? elements : elements * t / threads / kLine * kLine;
  };
  return {cut(thread), cut(thread + 1)};
}

// Seconds `fn(share)` takes on `threads` threads, each on its own share.
template <class Fn>
double seconds(int threads, std::int64_t elements, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  fn(share_of(elements, threads, omp_get_thread_num()));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

double MemoryBandwidth::stream() const {
  return std::max(copy, triad);
}

void MemoryBandwidthProbe::FreeHugePages::operator()(float* p) const {
  cache::free_huge_pages(p);
}

MemoryBandwidthProbe::Array MemoryBandwidthProbe::allocate(std::int64_t elements) {
  return Array(static_cast<float*>(
      cache::allocate_huge_pages(static_cast<std::size_t>(elements) * sizeof(float))));
}

MemoryBandwidthProbe::MemoryBandwidthProbe(int max_threads, double bytes_per_array)
    : elements_(static_cast<std::int64_t>(bytes_per_array / sizeof(float))),
      a_(allocate(elements_)),
      b_(allocate(elements_)),
      c_(allocate(elements_)) {
  seconds(max_threads, elements_, [&](Share s) {
    std::fill(a_.get() + s.begin, a_.get() + s.end, 1.0f);
    std::fill(b_.get() + s.begin, b_.get() + s.end, 2.0f);
    std::fill(c_.get() + s.begin, c_.get() + s.end, 0.5f);
  });
}

void MemoryBandwidthProbe::trial(int threads, MemoryBandwidth& best) {
  float* a = a_.get();
  const float *b = b_.get(), *c = c_.get();
  std::vector<float> sums(static_cast<std::size_t>(threads));  // kept, so the reads are too
  const double read = seconds(threads, elements_, [&](Share s) {
    sums[static_cast<std::size_t>(omp_get_thread_num())] =
        HWY_DYNAMIC_DISPATCH(ReadChunk)(a + s.begin, s.end - s.begin);
  });
  const double copy = seconds(threads, elements_, [&](Share s) {
    HWY_DYNAMIC_DISPATCH(CopyChunk)(a + s.begin, b + s.begin, s.end - s.begin);
  });
  const double triad = seconds(threads, elements_, [&](Share s) {
    HWY_DYNAMIC_DISPATCH(TriadChunk)(a + s.begin, b + s.begin, c + s.begin, 3.0f, s.end - s.begin);
  });
  const double bytes = static_cast<double>(elements_) * sizeof(float);
  best.read = std::max(best.read, bytes / read / 1e9);
  best.copy = std::max(best.copy, 2 * bytes / copy / 1e9);
  best.triad = std::max(best.triad, 3 * bytes / triad / 1e9);
  volatile float observed = 0.0f;
  for (const float sum : sums) observed = observed + sum;
}

}  // namespace attn::bench
#endif  // HWY_ONCE
