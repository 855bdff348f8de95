// Memory for the KV cache's block pools (and the decode bench's probe, which should see
// memory as the cache does): 2 MiB-aligned, with transparent huge pages asked of Linux.
// Each KV head's run of a block is only a few KiB, so a decode step touches a new 4 KiB
// page every run; with small pages the TLB misses and the hardware prefetchers (which
// stop at page boundaries) bound decode well below memory bandwidth.
#pragma once

#include <cstddef>

namespace attn::cache {

void* allocate_huge_pages(std::size_t bytes);
void free_huge_pages(void* p);

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(std::size_t count) { return static_cast<T*>(allocate_huge_pages(count * sizeof(T))); }
  void deallocate(T* p, std::size_t) { free_huge_pages(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace attn::cache
