// attn::KVCache bookkeeping (block pool, free list, reference counts, copy-on-write) and
// the conversion of appended rows to the cache dtype.
#include "attn/kv_cache.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>

#include "cache/huge_pages.hpp"
#include "cache/page_rows.hpp"
#include "cache/page_writes.hpp"
#include "core/argument_checks.hpp"
#include "core/int4.hpp"
#include "core/rows.hpp"

namespace attn {
namespace {

using core::fail;

void check_rows(const char* name, const TensorView& t, Index heads, Index dim, Index tokens) {
  const std::string expected = "shape [1, " + std::to_string(heads) + ", n, " +
                               std::to_string(dim) + "]" +
                               (tokens >= 0 ? " with n = " + std::to_string(tokens) : "");
  if (t.shape[0] != 1 || t.shape[1] != heads || t.shape[2] < 0 || t.shape[3] != dim ||
      (tokens >= 0 && t.shape[2] != tokens)) {
    fail(name, expected, format_dims(t.shape));
  }
  core::check_float_dtype(name, t.dtype);
  core::check_storage(name, t);
}

}  // namespace

void KVCache::HugePageFree::operator()(std::byte* p) const {
  cache::free_huge_pages(p);
}

const char* cache_dtype_name(CacheDType dtype) {
  switch (dtype) {
    case CacheDType::f32:
      return "float32";
    case CacheDType::f16:
      return "float16";
    case CacheDType::bf16:
      return "bfloat16";
    case CacheDType::int8:
      return "int8";
    case CacheDType::fp8_e4m3:
      return "fp8_e4m3";
    case CacheDType::fp8_e5m2:
      return "fp8_e5m2";
    case CacheDType::int4:
      return "int4";
  }
  return "unknown";
}

struct KVCache::Sequence {
  std::shared_mutex mutex;  // guards everything below and the blocks only this one holds
  std::vector<std::int32_t> blocks;
  Index length = 0;
  bool dropped = false;  // set by drop(), for operations that found it just before
};

namespace {

// A block's bytes: heads_kv * page_size * dim * element size, refused past 2^48 (256 TiB,
// more than any machine holds) so that no later product of block counts and sizes wraps.
std::size_t block_bytes(const KVCacheConfig& config, Index dim, const char* dim_name,
                        std::size_t element) {
  constexpr Index kMaxBlockBytes = Index{1} << 48;
  Index bytes = static_cast<Index>(element);
  for (const Index factor : {config.heads_kv, config.page_size, dim}) {
    if (__builtin_mul_overflow(bytes, factor, &bytes) || bytes > kMaxBlockBytes) {
      fail("page_size",
           std::string("a block of heads_kv * page_size * ") + dim_name + " * " +
               std::to_string(element) + " bytes below 2^48",
           "heads_kv " + std::to_string(config.heads_kv) + ", page_size " +
               std::to_string(config.page_size) + ", " + dim_name + " " + std::to_string(dim));
    }
  }
  return static_cast<std::size_t>(bytes);
}

}  // namespace

KVCache::KVCache(const KVCacheConfig& config) : config_(config) {
  const auto positive = [](const char* name, Index value) {
    if (value < 1) fail(name, "a positive count", std::to_string(value));
  };
  positive("heads_kv", config.heads_kv);
  positive("dim", config.dim);
  positive("dim_v", config.dim_v);
  positive("page_size", config.page_size);
  if (config.max_blocks < 0 || config.max_blocks > std::numeric_limits<std::int32_t>::max()) {
    fail("max_blocks", "0 (grow as needed) or a positive count below 2^31",
         std::to_string(config.max_blocks));
  }
  const CacheDType key_dtype = config.dtype_of(false), value_dtype = config.dtype_of(true);
  cache::check_int4_dims("", key_dtype, {{"dim", config.dim}});
  cache::check_int4_dims("", value_dtype, {{"dim_v", config.dim_v}});
  // group and zero_point are of the sides with scales (either, where the dtypes differ).
  const bool scaled_keys = cache::has_scales(key_dtype);
  const bool scaled_values = cache::has_scales(value_dtype);
  if (scaled_keys && scaled_values) {
    cache::check_group("group", key_dtype, config.group, {config.dim, config.dim_v});
  } else {
    cache::check_group("group", scaled_values ? value_dtype : key_dtype, config.group,
                       {scaled_values ? config.dim_v : config.dim});
  }
  cache::check_zero_point("zero_point", scaled_values ? value_dtype : key_dtype, config.zero_point);
  for (const auto& [name, scales, dtype] : {std::tuple{"k_scale", &config.k_scale, key_dtype},
                                            std::tuple{"v_scale", &config.v_scale, value_dtype}}) {
    if (scales->empty()) continue;
    if (!cache::is_fp8(dtype)) {
      fail(name,
           std::string("none for ") + cache_dtype_name(dtype) + " (a scale per KV head is for fp8)",
           std::to_string(scales->size()) + " scales");
    }
    if (static_cast<Index>(scales->size()) != config.heads_kv) {
      fail(name, "one scale per KV head (" + std::to_string(config.heads_kv) + ")",
           std::to_string(scales->size()));
    }
    cache::check_head_scales(name, scales->data(), config.heads_kv);
  }
  // int4 rows are half as many bytes as elements, as if of dim / 2 one-byte elements.
  const auto per_row = [](CacheDType dtype) { return dtype == CacheDType::int4 ? 2 : 1; };
  key_block_bytes_ =
      block_bytes(config, config.dim / per_row(key_dtype), "dim", element_size(false));
  value_block_bytes_ =
      block_bytes(config, config.dim_v / per_row(value_dtype), "dim_v", element_size(true));
  constexpr std::size_t kSlabBytes = std::size_t{2} << 20;
  const std::size_t largest = std::max(key_block_bytes_, value_block_bytes_);
  while (slab_shift_ < 20 && (largest << (slab_shift_ + 1)) <= kSlabBytes) ++slab_shift_;
  if (config.max_blocks > 0) {
    // One slab for all blocks, so that the pools are one array each (cache_pools).
    const auto blocks = static_cast<std::size_t>(config.max_blocks);
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(blocks, largest, &bytes)) {
      fail("max_blocks", "a count whose blocks fit in memory", std::to_string(config.max_blocks));
    }
    slab_shift_ = std::max(slab_shift_, static_cast<int>(std::bit_width(blocks - 1)));
  }
}

KVCache::KVCache(const KVCache& other)
    : config_(other.config_),
      key_block_bytes_(other.key_block_bytes_),
      value_block_bytes_(other.value_block_bytes_),
      slab_shift_(other.slab_shift_),
      ref_counts_(other.ref_counts_),
      free_blocks_(other.free_blocks_),
      next_id_(other.next_id_) {
  for (int s = 0; s < kSlabs && other.slabs_[s].capacity > 0; ++s) {
    const Slab& from = other.slabs_[s];
    Slab& to = slabs_[s];
    const auto blocks = static_cast<std::size_t>(from.capacity);
    to.keys.reset(static_cast<std::byte*>(cache::allocate_huge_pages(blocks * key_block_bytes_)));
    to.values.reset(
        static_cast<std::byte*>(cache::allocate_huge_pages(blocks * value_block_bytes_)));
    std::memcpy(to.keys.get(), from.keys.get(), blocks * key_block_bytes_);
    std::memcpy(to.values.get(), from.values.get(), blocks * value_block_bytes_);
    for (const bool values : {false, true}) {
      const std::unique_ptr<float[]>& scales = values ? from.value_scales : from.key_scales;
      if (!scales) continue;
      const std::size_t count = blocks * scales_per_block(values);
      auto& copy = values ? to.value_scales : to.key_scales;
      copy = std::make_unique<float[]>(count);
      std::copy_n(scales.get(), count, copy.get());
    }
    to.capacity = from.capacity;
  }
  for (const auto& [id, sequence] : other.sequences_) {
    auto copy = std::make_shared<Sequence>();
    copy->blocks = sequence->blocks;
    copy->length = sequence->length;
    sequences_.emplace(id, std::move(copy));
  }
}

KVCache::KVCache(KVCache&& other) noexcept
    : config_(other.config_),
      key_block_bytes_(other.key_block_bytes_),
      value_block_bytes_(other.value_block_bytes_),
      slab_shift_(other.slab_shift_),
      slabs_(std::move(other.slabs_)),
      ref_counts_(std::move(other.ref_counts_)),
      free_blocks_(std::move(other.free_blocks_)),
      sequences_(std::move(other.sequences_)),
      next_id_(other.next_id_) {}

KVCache::~KVCache() = default;

std::size_t KVCache::element_size(bool values) const {
  return cache::element_bytes(config_.dtype_of(values));
}

Index KVCache::scales_per_row(bool values) const {
  const Index groups = config_.group > 0 ? config_.dim_of(values) / config_.group : 1;
  return config_.zero_point ? 2 * groups : groups;
}

std::size_t KVCache::scales_per_block(bool values) const {
  return static_cast<std::size_t>(config_.heads_kv * config_.page_size * scales_per_row(values));
}

std::shared_ptr<KVCache::Sequence> KVCache::find(SequenceId seq, const char* argument) const {
  const std::shared_lock lock(mutex_);
  const auto found = sequences_.find(seq);
  if (found == sequences_.end()) {
    fail(argument, "the id of a sequence in the cache", std::to_string(seq));
  }
  return found->second;
}

KVCache::SequenceId KVCache::add_sequence() {
  const std::unique_lock lock(mutex_);
  sequences_.emplace(next_id_, std::make_shared<Sequence>());
  return next_id_++;
}

KVCache::SequenceId KVCache::fork(SequenceId parent) {
  const std::shared_ptr<Sequence> from = find(parent, "parent");
  const std::shared_lock parent_lock(from->mutex);
  if (from->dropped) fail("parent", "the id of a sequence in the cache", std::to_string(parent));
  auto child = std::make_shared<Sequence>();
  child->blocks = from->blocks;
  child->length = from->length;
  const std::unique_lock lock(mutex_);
  for (const std::int32_t block : child->blocks) ++ref_counts_[static_cast<std::size_t>(block)];
  sequences_.emplace(next_id_, std::move(child));
  return next_id_++;
}

void KVCache::drop(SequenceId seq) {
  const std::shared_ptr<Sequence> s = find(seq, "seq");
  const std::unique_lock sequence_lock(s->mutex);
  if (s->dropped) fail("seq", "the id of a sequence in the cache", std::to_string(seq));
  const std::unique_lock lock(mutex_);
  for (const std::int32_t block : s->blocks) release_block(block);
  s->blocks.clear();
  s->length = 0;
  s->dropped = true;
  sequences_.erase(seq);
}

bool KVCache::contains(SequenceId seq) const {
  const std::shared_lock lock(mutex_);
  return sequences_.count(seq) != 0;
}

Index KVCache::length(SequenceId seq) const {
  const std::shared_ptr<Sequence> s = find(seq, "seq");
  const std::shared_lock lock(s->mutex);
  return s->length;
}

std::vector<KVCache::SequenceId> KVCache::sequence_ids() const {
  const std::shared_lock lock(mutex_);
  std::vector<SequenceId> ids;
  for (const auto& entry : sequences_) ids.push_back(entry.first);
  return ids;
}

std::vector<std::int32_t> KVCache::block_table(SequenceId seq) const {
  const std::shared_ptr<Sequence> s = find(seq, "seq");
  const std::shared_lock lock(s->mutex);
  return s->blocks;
}

Index KVCache::blocks_allocated() const {
  const std::shared_lock lock(mutex_);
  return static_cast<Index>(ref_counts_.size());
}

Index KVCache::blocks_free() const {
  const std::shared_lock lock(mutex_);
  return static_cast<Index>(free_blocks_.size());
}

Index KVCache::blocks_in_use() const {
  const std::shared_lock lock(mutex_);
  return static_cast<Index>(ref_counts_.size() - free_blocks_.size());
}

std::int32_t KVCache::ref_count(std::int32_t block) const {
  const std::shared_lock lock(mutex_);
  const auto allocated = static_cast<Index>(ref_counts_.size());
  if (block < 0 || block >= allocated) {
    fail("block", "an index below " + std::to_string(allocated), std::to_string(block));
  }
  return ref_counts_[static_cast<std::size_t>(block)];
}

KVCache::Reading::Reading(Reading&&) noexcept = default;
KVCache::Reading& KVCache::Reading::operator=(Reading&&) noexcept = default;

KVCache::Reading::~Reading() {
  for (const std::shared_ptr<Sequence>& s : locked_) s->mutex.unlock_shared();
}

Index KVCache::Reading::length(std::size_t i) const {
  return sequences_[i]->length;
}

const std::vector<std::int32_t>& KVCache::Reading::block_table(std::size_t i) const {
  return sequences_[i]->blocks;
}

KVCache::Reading KVCache::read(const std::vector<SequenceId>& ids, const char* argument) const {
  Reading reading;
  std::map<SequenceId, std::shared_ptr<Sequence>> distinct;
  {
    const std::shared_lock lock(mutex_);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto found = sequences_.find(ids[i]);
      if (found == sequences_.end()) {
        fail(argument, "ids of sequences in the cache",
             std::to_string(ids[i]) + " at index " + std::to_string(i));
      }
      reading.sequences_.push_back(found->second);
      distinct.emplace(ids[i], found->second);
    }
  }
  // In id order, so that two readers and an appender never wait for each other in a cycle.
  for (const auto& [id, sequence] : distinct) {
    sequence->mutex.lock_shared();
    reading.locked_.push_back(sequence);
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (reading.sequences_[i]->dropped) {
      fail(argument, "ids of sequences in the cache",
           std::to_string(ids[i]) + " at index " + std::to_string(i) + " (dropped)");
    }
  }
  return reading;
}

KVCache::Place KVCache::place(std::int32_t block) const {
  const auto scaled = (static_cast<std::uint64_t>(block) >> slab_shift_) + 1;
  const int slab = std::bit_width(scaled) - 1;
  const Index first = ((Index{1} << slab) - 1) << slab_shift_;
  return {slab, block - first};
}

std::int32_t KVCache::take_block() {
  if (!free_blocks_.empty()) {
    const std::int32_t block = free_blocks_.back();
    free_blocks_.pop_back();
    ref_counts_[static_cast<std::size_t>(block)] = 1;
    return block;
  }
  if (ref_counts_.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    fail("k", "room for another block (at most 2^31 - 1 blocks)", "a full cache");
  }
  const auto block = static_cast<std::int32_t>(ref_counts_.size());
  const Place at = place(block);
  if (slabs_[static_cast<std::size_t>(at.slab)].capacity == 0) allocate_slab(at.slab, block);
  ref_counts_.push_back(1);
  return block;
}

void KVCache::allocate_slab(int s, Index first) {
  // As large as all slabs before it, less what max_blocks will never let be used.
  Index blocks = Index{1} << (s + slab_shift_);
  if (config_.max_blocks > 0) blocks = std::min<Index>(blocks, config_.max_blocks - first);
  const auto count = static_cast<std::size_t>(blocks);
  std::size_t key_bytes = 0, value_bytes = 0;
  if (__builtin_mul_overflow(count, key_block_bytes_, &key_bytes) ||
      __builtin_mul_overflow(count, value_block_bytes_, &value_bytes)) {
    throw std::bad_alloc();
  }
  Slab fresh;
  fresh.keys.reset(static_cast<std::byte*>(cache::allocate_huge_pages(key_bytes)));
  fresh.values.reset(static_cast<std::byte*>(cache::allocate_huge_pages(value_bytes)));
  if (cache::has_scales(config_.dtype_of(false))) {
    fresh.key_scales = std::make_unique<float[]>(count * scales_per_block(false));
  }
  if (cache::has_scales(config_.dtype_of(true))) {
    fresh.value_scales = std::make_unique<float[]>(count * scales_per_block(true));
  }
  fresh.capacity = blocks;
  slabs_[static_cast<std::size_t>(s)] = std::move(fresh);
}

void KVCache::reserve_pool() {
  const std::unique_lock lock(mutex_);
  if (slabs_[0].capacity == 0) allocate_slab(0, 0);
}

void KVCache::release_block(std::int32_t block) {
  if (--ref_counts_[static_cast<std::size_t>(block)] == 0) free_blocks_.push_back(block);
}

void KVCache::copy_block(std::int32_t from, std::int32_t to) {
  std::memcpy(block_data(to, 0, false), block_data(from, 0, false), key_block_bytes_);
  std::memcpy(block_data(to, 0, true), block_data(from, 0, true), value_block_bytes_);
  for (const bool values : {false, true}) {
    if (!cache::has_scales(config_.dtype_of(values))) continue;
    std::copy_n(&scale_of(from, 0, 0, values), scales_per_block(values),
                &scale_of(to, 0, 0, values));
  }
}

std::byte* KVCache::block_data(std::int32_t block, Index head, bool values) const {
  const Place at = place(block);
  const Slab& slab = slabs_[static_cast<std::size_t>(at.slab)];
  const Index dim = config_.dim_of(values);
  return (values ? slab.values : slab.keys).get() +
         static_cast<std::size_t>(at.index) * (values ? value_block_bytes_ : key_block_bytes_) +
         static_cast<std::size_t>(head * config_.page_size *
                                  cache::row_bytes(config_.dtype_of(values), dim));
}

float& KVCache::scale_of(std::int32_t block, Index head, Index slot, bool values) const {
  const Place at = place(block);
  const Slab& slab = slabs_[static_cast<std::size_t>(at.slab)];
  const Index row = (at.index * config_.heads_kv + head) * config_.page_size + slot;
  const Index index = row * scales_per_row(values);
  return (values ? slab.value_scales : slab.key_scales)[static_cast<std::size_t>(index)];
}

const std::byte* KVCache::key_block(std::int32_t block, Index head) const {
  return block_data(block, head, false);
}

const std::byte* KVCache::value_block(std::int32_t block, Index head) const {
  return block_data(block, head, true);
}

float KVCache::key_scale(std::int32_t block, Index head, Index slot) const {
  if (!cache::has_scales(config_.dtype_of(false))) return 1.0f;
  return scale_of(block, head, slot, false);
}

float KVCache::value_scale(std::int32_t block, Index head, Index slot) const {
  if (!cache::has_scales(config_.dtype_of(true))) return 1.0f;
  return scale_of(block, head, slot, true);
}

void KVCache::append(SequenceId seq, const TensorView& k, const TensorView& v) {
  const std::shared_ptr<Sequence> found = find(seq, "seq");
  const std::unique_lock sequence_lock(found->mutex);
  Sequence& s = *found;
  if (s.dropped) fail("seq", "the id of a sequence in the cache", std::to_string(seq));
  check_rows("k", k, config_.heads_kv, config_.dim, -1);
  check_rows("v", v, config_.heads_kv, config_.dim_v, k.shape[2]);
  const Index count = k.shape[2], page = config_.page_size;
  if (count == 0) return;
  cache::check_finite_for_codes("k", {k, false, nullptr}, config_.heads_kv,
                                config_.dtype_of(false));
  cache::check_finite_for_codes("v", {v, false, nullptr}, config_.heads_kv, config_.dtype_of(true));
  // The blocks this append writes are taken under mutex_; the rows are written after it is
  // released, into blocks that only this sequence holds (its lock keeps them so).
  const Index slot = s.length % page;
  {
    const std::unique_lock lock(mutex_);
    const bool shared_tail =
        slot != 0 && ref_counts_[static_cast<std::size_t>(s.blocks.back())] > 1;
    const Index new_blocks = (s.length + count + page - 1) / page -
                             static_cast<Index>(s.blocks.size()) + (shared_tail ? 1 : 0);
    const auto in_use = static_cast<Index>(ref_counts_.size() - free_blocks_.size());
    if (config_.max_blocks > 0 && in_use + new_blocks > config_.max_blocks) {
      fail("k",
           "at most " + std::to_string(config_.max_blocks - in_use) + " more blocks of " +
               std::to_string(page) + " tokens (max_blocks)",
           std::to_string(count) + " tokens needing " + std::to_string(new_blocks));
    }
    std::vector<std::int32_t> taken;
    try {
      while (static_cast<Index>(taken.size()) < new_blocks) taken.push_back(take_block());
    } catch (...) {
      for (const std::int32_t block : taken) release_block(block);
      throw;
    }
    auto next = taken.begin();
    if (shared_tail) {
      // Copy-on-write: other sequences keep reading the shared block as it was.
      copy_block(s.blocks.back(), *next);
      release_block(s.blocks.back());
      s.blocks.back() = *next++;
    }
    s.blocks.insert(s.blocks.end(), next, taken.end());
  }
  Index done = 0;
  while (done < count) {
    const Index at = (s.length + done) % page;
    const auto block = static_cast<std::size_t>((s.length + done) / page);
    const Index rows = std::min(count - done, page - at);
    write_rows(s.blocks[block], at, k, v, done, rows);
    done += rows;
  }
  s.length += count;
}

// Writes tokens [first, first + count) of k and v into slots [slot, slot + count) of block.
void KVCache::write_rows(std::int32_t block, Index slot, const TensorView& k, const TensorView& v,
                         Index first, Index count) {
  cache::write_run(cache::page_rows_of(*this, false), block, slot, {k, false, nullptr}, first,
                   count);
  cache::write_run(cache::page_rows_of(*this, true), block, slot, {v, false, nullptr}, first,
                   count);
}

Tensor KVCache::dequantise(SequenceId seq, bool values) const {
  const std::shared_ptr<Sequence> found = find(seq, "seq");
  const std::shared_lock lock(found->mutex);
  const Sequence& s = *found;
  const Index dim = config_.dim_of(values), page = config_.page_size;
  const CacheDType dtype = config_.dtype_of(values);
  Tensor out(DType::f32, {1, config_.heads_kv, s.length, dim});
  float* to = out.data_as<float>();
  std::vector<double> row(static_cast<std::size_t>(dim));
  for (Index h = 0; h < config_.heads_kv; ++h)
    for (Index t = 0; t < s.length; ++t) {
      const std::int32_t block = s.blocks[static_cast<std::size_t>(t / page)];
      const std::byte* base = values ? value_block(block, h) : key_block(block, h);
      float* dst = to + (h * s.length + t) * dim;
      if (cache::has_scales(dtype)) {
        const std::byte* codes = base + (t % page) * cache::row_bytes(dtype, dim);
        const float* scales = &scale_of(block, h, t % page, values);
        const Index group = config_.group > 0 ? config_.group : dim;
        for (Index d = 0; d < dim; ++d) {
          const int code = dtype == CacheDType::int4
                               ? int4_code(reinterpret_cast<const Int4Pair*>(codes), d)
                               : reinterpret_cast<const std::int8_t*>(codes)[d];
          dst[d] = cache::code_value(code, scales, d / group, config_.zero_point);
        }
        continue;
      }
      if (cache::is_fp8(dtype)) {
        cache::fp8_widen(dtype, reinterpret_cast<const std::uint8_t*>(base) + (t % page) * dim, dim,
                         dst);
        const std::vector<float>& head_scales = config_.head_scales(values);
        if (!head_scales.empty()) {
          for (Index d = 0; d < dim; ++d) dst[d] *= head_scales[static_cast<std::size_t>(h)];
        }
        continue;
      }
      const TensorView rows(base, cache::storage_dtype(dtype), {1, 1, page, dim});
      core::load_row(rows, 0, 0, t % page, row.data());
      for (Index d = 0; d < dim; ++d) dst[d] = static_cast<float>(row[static_cast<std::size_t>(d)]);
    }
  return out;
}

Tensor KVCache::keys(SequenceId seq) const {
  return dequantise(seq, false);
}

Tensor KVCache::values(SequenceId seq) const {
  return dequantise(seq, true);
}

}  // namespace attn
