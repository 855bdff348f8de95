// attn::KVCache: paged key/value storage for incremental generation, as vLLM's and
// FlashAttention's block_table. Storage is a pool of fixed-size blocks of page_size
// tokens; each sequence owns a block table (its blocks in token order), so sequences of any
// length share one pool without fragmentation, and a dropped sequence's blocks go to a free
// list for reuse. fork() shares a sequence's blocks by reference count (a prompt prefix is
// stored once); the last, partly filled block is copied on the first append that would
// write into a shared block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

// Element type of the stored keys and values. int8: symmetric, one float32 scale per block
// and KV head for keys and one for values (scale = max |x| / 127 over the block's tokens of
// that head). An append that raises the maximum requantises the block's earlier tokens of
// that head to the new scale, so an element is within half a scale step of its value for
// each requantisation it went through (in practice the context's NMSE against a float32
// cache stays below 1e-3 for normal data; see the decode tests).
enum class CacheDType : std::uint8_t { f32, f16, bf16, int8 };

const char* cache_dtype_name(CacheDType dtype);

struct KVCacheConfig {
  Index heads_kv = 1;
  Index dim = 64;    // key (and query) head dim
  Index dim_v = 64;  // value head dim
  Index page_size = 16;
  CacheDType dtype = CacheDType::f16;
  Index max_blocks = 0;  // 0: the pool grows as needed; else appends past it throw
};

namespace cache {
struct BlockAccess;
}

class KVCache {
 public:
  using SequenceId = std::int64_t;

  // Throws attn::Error naming the field when a size is not positive.
  explicit KVCache(const KVCacheConfig& config);
  // A copy holds copies of the blocks: the two caches change independently.
  KVCache(const KVCache& other);
  KVCache& operator=(const KVCache& other);
  KVCache(KVCache&& other) noexcept;
  KVCache& operator=(KVCache&& other) noexcept;
  ~KVCache();

  const KVCacheConfig& config() const { return config_; }

  // A new, empty sequence; ids are never reused.
  SequenceId add_sequence();
  // A new sequence holding the same tokens as `parent`, sharing its blocks.
  SequenceId fork(SequenceId parent);
  // Appends n tokens. k: [1, Hkv, n, dim]  v: [1, Hkv, n, dim_v], any float dtype, any
  // strides with a contiguous last dim. On error nothing is appended.
  void append(SequenceId seq, const TensorView& k, const TensorView& v);
  // Forgets the sequence; blocks no other sequence holds return to the free list.
  void drop(SequenceId seq);

  bool contains(SequenceId seq) const { return sequences_.count(seq) != 0; }
  Index length(SequenceId seq) const;
  std::vector<SequenceId> sequence_ids() const;
  // The sequence's blocks in token order: token t lives in block table[t / page_size] at
  // slot t % page_size.
  const std::vector<std::int32_t>& block_table(SequenceId seq) const;

  Index blocks_allocated() const { return static_cast<Index>(ref_counts_.size()); }
  Index blocks_free() const { return static_cast<Index>(free_blocks_.size()); }
  Index blocks_in_use() const { return blocks_allocated() - blocks_free(); }
  // How many sequences hold the block (0: on the free list).
  std::int32_t ref_count(std::int32_t block) const;

  // The sequence's keys and values dequantised to float32: [1, Hkv, length, dim] and
  // [1, Hkv, length, dim_v]. For tests, the demo and Python; kernels read blocks directly.
  Tensor keys(SequenceId seq) const;
  Tensor values(SequenceId seq) const;

 private:
  struct Sequence {
    std::vector<std::int32_t> blocks;
    Index length = 0;
  };

  // The bytes of the blocks and their int8 scales (src/cache/kv_cache_blocks.hpp).
  struct Blocks;
  friend struct cache::BlockAccess;

  const Sequence& sequence(SequenceId seq, const char* argument) const;
  std::int32_t take_block();
  void release_block(std::int32_t block);
  void write_rows(std::int32_t block, Index slot, const TensorView& k, const TensorView& v,
                  Index first, Index count);
  Tensor dequantise(SequenceId seq, bool values) const;

  KVCacheConfig config_;
  std::unique_ptr<Blocks> blocks_;
  std::vector<std::int32_t> ref_counts_;
  std::vector<std::int32_t> free_blocks_;
  std::map<SequenceId, Sequence> sequences_;
  SequenceId next_id_ = 0;
};

}  // namespace attn
