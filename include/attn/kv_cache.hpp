// attn::KVCache: paged key/value storage for incremental generation, as vLLM's and
// FlashAttention's block_table. Storage is a pool of fixed-size blocks of page_size
// tokens; each sequence owns a block table (its blocks in token order), so sequences of any
// length share one pool without fragmentation, and a dropped sequence's blocks go to a free
// list for reuse. fork() shares a sequence's blocks by reference count (a prompt prefix is
// stored once); the last, partly filled block is copied on the first append that would
// write into a shared block.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

// Element type of the stored keys and values. int8: symmetric, one float32 scale per token
// and KV head for keys and one for values (scale = max |x| / 127 over that token's row of
// that head; with KVCacheConfig::group, one per group of the row), quantised once when the
// token is appended: a token's stored bits depend on
// that token alone, never on the tokens appended before or after it, so appending a
// sequence token by token, in chunks or at once stores the same bytes. Each element is
// within half a scale step (max |x| / 254 of its row, or of its group) of its value. fp8_e4m3,
// fp8_e5m2: OCP's 8-bit floats (vLLM's kv_cache_dtype "fp8_e4m3" and "fp8_e5m2", PyTorch's
// float8_e4m3fn and float8_e5m2), unscaled or with a scale per KV head
// (KVCacheConfig::k_scale, v_scale: the code of x / scale): each element rounded to the nearest
// code, ties to even, magnitudes past the largest finite code (448, 57344) stored as it; within
// 2^-4 (e4m3) or 2^-3 (e5m2) of its magnitude relative, or half the smallest subnormal step (2^-10,
// 2^-17) absolute. int4: two signed 4-bit codes a byte (llama.cpp's q4_0 order, core/int4.hpp),
// with a float32 scale per row or group (KVCacheConfig::group) chosen as q4_0 chooses it: d = m /
// -8 for m the element of largest magnitude, codes round(x / d) clamped to [-8, 7], so that m
// itself is exact; dim and dim_v multiples of 32. int8 and int4 with KVCacheConfig::zero_point are
// asymmetric instead (llama.cpp's q4_1, OpenVINO's u8 and u4 with zero points). int8, int4 and fp8
// refuse non-finite keys and values on append.
enum class CacheDType : std::uint8_t { f32, f16, bf16, int8, fp8_e4m3, fp8_e5m2, int4 };

const char* cache_dtype_name(CacheDType dtype);

struct KVCacheConfig {
  Index heads_kv = 1;
  Index dim = 64;    // key (and query) head dim
  Index dim_v = 64;  // value head dim
  Index page_size = 16;
  CacheDType dtype = CacheDType::f16;
  // The values' element type where it is not the keys' (llama.cpp's type_v beside type_k: K
  // and V tolerate different formats); none: dtype. group and zero_point apply to each side
  // that is int8 or int4, k_scale and v_scale to an fp8 side.
  std::optional<CacheDType> dtype_v = std::nullopt;
  // int8 and int4: elements per scale along the head dim, 32, 64 or 128 dividing dim and
  // dim_v, as llama.cpp's q8_0 and q4_0 blocks (32) and OpenVINO's group size: each group of
  // a token's row of a KV head has its own scale (int8: max |x| / 127 over the group), so an
  // outlier channel coarsens only its own group. 0: one scale for the whole row.
  Index group = 0;
  // int8 and int4: asymmetric codes. Each row (or group) stores a float32 offset beside its
  // scale, and an element reads as code * scale + offset (one float32 rounding; the kernels'
  // SSE4 and scalar targets, which have no FMA, round the product first), the codes
  // spanning the row's own [min, max]: scale = (max - min) / 255 (int8) or / 15 (int4),
  // offset = min + 128 scale (int8) or min + 8 scale (int4), code = round((x - offset) /
  // scale) over [-128, 127] or [-8, 7]. Each element is within half a scale step of its
  // value, plus 2^-22 of the group's largest magnitude (float32's rounding of the offset and
  // the product). A group whose values lie on one side of zero so uses every code, where
  // symmetric codes leave half of them unused.
  bool zero_point = false;
  // 0: the pool grows as needed, in slabs. Else appends past max_blocks blocks throw, and
  // the blocks lie in one allocation of max_blocks blocks (reserved at the first append or
  // cache_pools call, touched as blocks are used), which attn::cache_pools shows whole.
  Index max_blocks = 0;
  // fp8 only, optional: a scale per KV head for the keys and one for the values (vLLM's
  // k_scale and v_scale, per head), positive and finite; empty: 1. An element is stored as
  // the code of x / scale and reads as code * scale.
  std::vector<float> k_scale = {}, v_scale = {};

  // The keys' (values false) or the values' head dim, element type, and fp8 scales per KV
  // head.
  Index dim_of(bool values) const { return values ? dim_v : dim; }
  CacheDType dtype_of(bool values) const { return values && dtype_v ? *dtype_v : dtype; }
  const std::vector<float>& head_scales(bool values) const { return values ? v_scale : k_scale; }
};

namespace cache {
struct BlockAccess;
}

// Threads: operations on different sequences of one cache may run at once from any number
// of threads (add_sequence, fork, append, drop, keys, values, decode, and the queries
// below); appends to different sequences and decodes run in parallel, and a decode holds
// no lock on the cache as a whole while it computes, only read locks on its own sequences.
// Operations on the same sequence from several threads are serialised: an append or drop
// waits for running decodes (and reads) of that sequence, and they wait for it. A fork
// reads its parent like a decode. The copy constructor, the move constructor and
// destruction must not overlap other operations on the cache they read.
class KVCache {
  struct Sequence;

 public:
  using SequenceId = std::int64_t;

  // Throws attn::Error naming the field when a size is not positive or a block would not
  // fit in memory (heads_kv * page_size * dim * element size bytes).
  explicit KVCache(const KVCacheConfig& config);
  KVCache(const KVCache& other);
  KVCache(KVCache&& other) noexcept;
  KVCache& operator=(const KVCache&) = delete;
  KVCache& operator=(KVCache&&) = delete;
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

  bool contains(SequenceId seq) const;
  Index length(SequenceId seq) const;
  std::vector<SequenceId> sequence_ids() const;
  // The sequence's blocks in token order: token t lives in block table[t / page_size] at
  // slot t % page_size.
  std::vector<std::int32_t> block_table(SequenceId seq) const;

  Index blocks_allocated() const;
  Index blocks_free() const;
  Index blocks_in_use() const;
  // How many sequences hold the block (0: on the free list).
  std::int32_t ref_count(std::int32_t block) const;

  // The sequence's keys and values dequantised to float32: [1, Hkv, length, dim] and
  // [1, Hkv, length, dim_v]. For tests, the demo and Python; kernels read blocks directly.
  Tensor keys(SequenceId seq) const;
  Tensor values(SequenceId seq) const;

  // Sequences held still for a kernel: while a Reading lives, the lengths and block tables
  // of its sequences stay as they are and no one writes their blocks (appends to and drops
  // of them wait); other sequences go on. Do not append to or drop a held sequence from
  // the thread holding the Reading (it would wait for itself).
  class Reading {
   public:
    Reading(Reading&&) noexcept;
    Reading& operator=(Reading&&) noexcept;
    ~Reading();
    // Of ids[i] as given to read().
    Index length(std::size_t i) const;
    const std::vector<std::int32_t>& block_table(std::size_t i) const;

   private:
    friend class KVCache;
    Reading() = default;
    std::vector<std::shared_ptr<Sequence>> sequences_;  // one per id, in the given order
    std::vector<std::shared_ptr<Sequence>> locked_;     // each distinct one, by id
  };
  // Throws attn::Error naming `argument` and the index for an id not in the cache.
  Reading read(const std::vector<SequenceId>& ids, const char* argument) const;

 private:
  // Raw block access for the decode kernel, through cache::BlockAccess
  // (src/cache/kv_cache_blocks.hpp).
  friend struct cache::BlockAccess;
  std::size_t element_size(bool values) const;
  // Scales (int8, int4) per row (its groups, or 1; twice that with zero_point: the
  // offsets) and per block, of the keys or the values.
  Index scales_per_row(bool values) const;
  std::size_t scales_per_block(bool values) const;
  const std::byte* key_block(std::int32_t block, Index head) const;
  const std::byte* value_block(std::int32_t block, Index head) const;
  float key_scale(std::int32_t block, Index head, Index slot) const;
  float value_scale(std::int32_t block, Index head, Index slot) const;

  struct HugePageFree {
    void operator()(std::byte* p) const;
  };
  // Blocks live in slabs that are allocated once and never move, so a decode reads its
  // blocks while appends to other sequences allocate new ones. Slab s holds 2^s times as
  // many blocks as slab 0 (a power of two of them, about 2 MiB), so 32 slabs cover every
  // int32 block index and finding a block's slab is a shift and a bit count. With
  // max_blocks, slab 0 holds all max_blocks of them.
  struct Slab {
    std::unique_ptr<std::byte, HugePageFree> keys, values;
    // [block][head][slot][group], int8 and int4 only; with zero_point, [...][group][2]:
    // (scale, offset) pairs.
    std::unique_ptr<float[]> key_scales, value_scales;
    Index capacity = 0;  // blocks allocated in this slab
  };
  static constexpr int kSlabs = 32;
  struct Place {
    int slab;
    Index index;  // within the slab
  };
  Place place(std::int32_t block) const;
  // Slab s, allocated for blocks from `first` on; mutex_ held.
  void allocate_slab(int s, Index first);
  // Slab 0 allocated: with max_blocks set, every block (cache_pools, through BlockAccess).
  void reserve_pool();

  std::shared_ptr<Sequence> find(SequenceId seq, const char* argument) const;
  std::int32_t take_block();
  void release_block(std::int32_t block);
  void copy_block(std::int32_t from, std::int32_t to);
  std::byte* block_data(std::int32_t block, Index head, bool values) const;
  float& scale_of(std::int32_t block, Index head, Index slot, bool values) const;
  void write_rows(std::int32_t block, Index slot, const TensorView& k, const TensorView& v,
                  Index first, Index count);
  Tensor dequantise(SequenceId seq, bool values) const;

  KVCacheConfig config_;
  std::size_t key_block_bytes_ = 0, value_block_bytes_ = 0;
  int slab_shift_ = 0;  // slab 0 holds 2^slab_shift_ blocks
  // mutex_ guards the sequence map, next_id_, the reference counts, the free list and the
  // allocation of slabs; each sequence's own lock guards its length, its table and the
  // contents of the blocks only it holds. Lock order: a sequence's lock, then mutex_.
  mutable std::shared_mutex mutex_;
  std::array<Slab, kSlabs> slabs_;
  std::vector<std::int32_t> ref_counts_;
  std::vector<std::int32_t> free_blocks_;
  std::map<SequenceId, std::shared_ptr<Sequence>> sequences_;
  SequenceId next_id_ = 0;
};

}  // namespace attn
