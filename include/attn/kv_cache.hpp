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

namespace detail {
// Allocates the cache's block pools 2 MiB-aligned and asks Linux for transparent huge
// pages there: each KV head's run of a block is only a few KiB, so a step touches a new
// 4 KiB page every run, and with small pages the TLB misses and the hardware prefetchers
// (which stop at page boundaries) bound decode well below memory bandwidth.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(std::size_t count);
  void deallocate(T* p, std::size_t count);
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};
void* allocate_huge_pages(std::size_t bytes);
void free_huge_pages(void* p);
template <class T>
T* HugePageAllocator<T>::allocate(std::size_t count) {
  return static_cast<T*>(allocate_huge_pages(count * sizeof(T)));
}
template <class T>
void HugePageAllocator<T>::deallocate(T* p, std::size_t) {
  free_huge_pages(p);
}
}  // namespace detail

class KVCache {
 public:
  using SequenceId = std::int64_t;

  // Throws attn::Error naming the field when a size is not positive.
  explicit KVCache(const KVCacheConfig& config);

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

  // Raw block access for kernels. A block holds, per KV head, page_size rows of dim (keys)
  // or dim_v (values) elements of the cache dtype, contiguous: [Hkv, page_size, dim].
  std::size_t element_size() const;
  const std::byte* key_block(std::int32_t block, Index head) const;
  const std::byte* value_block(std::int32_t block, Index head) const;
  // int8 only: the dequantisation scale of a block's head (1 for other dtypes).
  float key_scale(std::int32_t block, Index head) const;
  float value_scale(std::int32_t block, Index head) const;

 private:
  struct Sequence {
    std::vector<std::int32_t> blocks;
    Index length = 0;
  };

  const Sequence& sequence(SequenceId seq, const char* argument) const;
  std::size_t block_offset(std::int32_t block, Index head, bool values) const;
  std::int32_t take_block();
  void release_block(std::int32_t block);
  void copy_block(std::int32_t from, std::int32_t to);
  void write_rows(std::int32_t block, Index slot, const TensorView& k, const TensorView& v,
                  Index first, Index count);
  Tensor dequantise(SequenceId seq, bool values) const;

  KVCacheConfig config_;
  std::size_t key_block_bytes_ = 0, value_block_bytes_ = 0;
  std::vector<std::byte, detail::HugePageAllocator<std::byte>> key_pool_, value_pool_;
  std::vector<float> key_scales_, value_scales_;  // [block][head], int8 only
  std::vector<std::int32_t> ref_counts_;
  std::vector<std::int32_t> free_blocks_;
  std::map<SequenceId, Sequence> sequences_;
  SequenceId next_id_ = 0;
};

}  // namespace attn
