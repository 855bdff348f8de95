// The KV cache's blocks as the decode kernel reads them: raw bytes of the cache dtype and
// the int8 scales, valid for the blocks of sequences held by a KVCache::Reading. Private to
// the library; users see tokens (KVCache::keys, values).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attn/kv_cache.hpp"

namespace attn::cache {

// The friend of KVCache through which the functions below reach its blocks.
struct BlockAccess {
  static const std::byte* rows(const KVCache& cache, std::int32_t block, Index head, bool values) {
    return values ? cache.value_block(block, head) : cache.key_block(block, head);
  }
  static float scale(const KVCache& cache, std::int32_t block, Index head, Index slot,
                     bool values) {
    return values ? cache.value_scale(block, head, slot) : cache.key_scale(block, head, slot);
  }
  // For appends (src/cache/page_rows.cpp): the rows to write, and an int8 scale itself.
  static std::byte* writable_rows(const KVCache& cache, std::int32_t block, Index head,
                                  bool values) {
    return cache.block_data(block, head, values);
  }
  static float& scale_ref(const KVCache& cache, std::int32_t block, Index head, Index slot,
                          bool values) {
    return cache.scale_of(block, head, slot, values);
  }
  // For cache_pools (src/api/page_pools.cpp): block 0 allocated, and with it every block of
  // a cache with max_blocks.
  static void reserve_pool(KVCache& cache) { cache.reserve_pool(); }
};

// Rows [0, page_size) of KV head kv_head in the block, contiguous: keys of the cache's dim,
// values of its dim_v, elements of its dtype. Blocks never move once allocated.
inline const std::byte* key_block(const KVCache& cache, std::int32_t block, Index kv_head) {
  return BlockAccess::rows(cache, block, kv_head, false);
}
inline const std::byte* value_block(const KVCache& cache, std::int32_t block, Index kv_head) {
  return BlockAccess::rows(cache, block, kv_head, true);
}
// The dequantisation scale of a slot's row of the block's KV head for an int8 cache, 1 for
// other dtypes.
inline float key_scale(const KVCache& cache, std::int32_t block, Index kv_head, Index slot) {
  return BlockAccess::scale(cache, block, kv_head, slot, false);
}
inline float value_scale(const KVCache& cache, std::int32_t block, Index kv_head, Index slot) {
  return BlockAccess::scale(cache, block, kv_head, slot, true);
}

}  // namespace attn::cache
