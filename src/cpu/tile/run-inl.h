// Per-thread scratch and the one OpenMP loop over independent work items, for every kernel.
#if defined(ATTN_CPU_TILE_RUN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_RUN_INL_H_
#undef ATTN_CPU_TILE_RUN_INL_H_
#else
#define ATTN_CPU_TILE_RUN_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attn/tensor.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

// A per-thread buffer of `count` elements: 64-byte aligned and padded to whole cache lines,
// so that threads never share a line.
template <class T>
hwy::AlignedFreeUniquePtr<T[]> scratch_buffer(Index count) {
  constexpr Index kLine = 64, kSize = sizeof(T);
  const Index bytes = (std::max<Index>(count, 1) * kSize + kLine - 1) / kLine * kLine;
  return hwy::AllocateAligned<T>(static_cast<std::size_t>((bytes + kSize - 1) / kSize));
}

// Threads worth starting for `items` work items: no more than there are items.
inline int threads_for(Index items, int threads) {
  return static_cast<int>(std::max<Index>(1, std::min<Index>(threads, items)));
}

// Runs worker(i) for every item i in [0, count) on `threads` threads, each with a worker
// made once by make_worker(thread). Items are independent and each is computed whole by
// one thread, so the thread count changes who computes an item, never its bits.
template <class MakeWorker>
void run_items(Index count, int threads, MakeWorker&& make_worker) {
  const auto items = static_cast<std::int64_t>(count);
#pragma omp parallel num_threads(threads)
  {
    auto worker = make_worker(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < items; ++i) worker(static_cast<Index>(i));
  }
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
