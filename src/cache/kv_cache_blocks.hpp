// The KV cache's blocks as the decode kernel reads them: raw bytes of the cache dtype and
// the int8 scales. Private to the library; users see tokens (KVCache::keys, values).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attn/kv_cache.hpp"
#include "cache/huge_pages.hpp"

namespace attn {

// A block holds, per KV head, page_size rows of dim (keys) or dim_v (values) elements of
// the cache dtype, contiguous: [Hkv, page_size, dim]. int8 blocks have one scale per KV
// head for keys and one for values.
struct KVCache::Blocks {
  explicit Blocks(const KVCacheConfig& config);

  // Appends one block to each pool (and its scales for int8).
  void add();
  // Block `to` becomes a copy of block `from`, scales included.
  void copy(std::int32_t from, std::int32_t to);

  const std::byte* rows(std::int32_t block, Index head, bool values) const {
    return (values ? value_pool : key_pool).data() + offset(block, head, values);
  }
  std::byte* rows(std::int32_t block, Index head, bool values) {
    return (values ? value_pool : key_pool).data() + offset(block, head, values);
  }
  // int8 only.
  float& scale(std::int32_t block, Index head, bool values) {
    return (values ? value_scales : key_scales)[static_cast<std::size_t>(block * heads_kv + head)];
  }
  float scale(std::int32_t block, Index head, bool values) const {
    return (values ? value_scales : key_scales)[static_cast<std::size_t>(block * heads_kv + head)];
  }

  Index heads_kv, page_size, dim, dim_v;
  bool int8;
  std::size_t element_size;
  std::size_t key_block_bytes, value_block_bytes;
  std::vector<std::byte, cache::HugePageAllocator<std::byte>> key_pool, value_pool;
  std::vector<float> key_scales, value_scales;  // [block][head], int8 only

 private:
  std::size_t offset(std::int32_t block, Index head, bool values) const {
    return static_cast<std::size_t>(block) * (values ? value_block_bytes : key_block_bytes) +
           static_cast<std::size_t>(head * page_size * (values ? dim_v : dim)) * element_size;
  }
};

namespace cache {

// The friend of KVCache through which the functions below reach its blocks.
struct BlockAccess {
  static const KVCache::Blocks& blocks(const KVCache& cache) { return *cache.blocks_; }
};

// Rows [0, page_size) of KV head kv_head in the block: keys of the cache's dim, values of
// its dim_v, elements of its dtype.
inline const std::byte* key_block(const KVCache& cache, std::int32_t block, Index kv_head) {
  return BlockAccess::blocks(cache).rows(block, kv_head, false);
}
inline const std::byte* value_block(const KVCache& cache, std::int32_t block, Index kv_head) {
  return BlockAccess::blocks(cache).rows(block, kv_head, true);
}
// The dequantisation scale of the block's KV head for an int8 cache, 1 for other dtypes.
inline float key_scale(const KVCache& cache, std::int32_t block, Index kv_head) {
  const auto& blocks = BlockAccess::blocks(cache);
  return blocks.int8 ? blocks.scale(block, kv_head, false) : 1.0f;
}
inline float value_scale(const KVCache& cache, std::int32_t block, Index kv_head) {
  const auto& blocks = BlockAccess::blocks(cache);
  return blocks.int8 ? blocks.scale(block, kv_head, true) : 1.0f;
}

}  // namespace cache
}  // namespace attn
