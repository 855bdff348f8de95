#include "cache/huge_pages.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attn::cache {

void* allocate_huge_pages(std::size_t bytes) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  if (bytes > std::numeric_limits<std::size_t>::max() - kHugePage) throw std::bad_alloc();
  const std::size_t rounded =
      (std::max<std::size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  void* memory = std::aligned_alloc(kHugePage, rounded);
  if (memory == nullptr) throw std::bad_alloc();
#if defined(__linux__)
  // Advice only: where transparent huge pages are off, this fails and small pages serve.
  madvise(memory, rounded, MADV_HUGEPAGE);
#endif
  return memory;
}

void free_huge_pages(void* p) {
  std::free(p);
}

}  // namespace attn::cache
